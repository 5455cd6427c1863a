"""Models whose initial parameters ``tests/test_init.py`` pins (``tests/data/init_reference.npz``).

Regenerate the reference (only when an initial value is meant to change, and say why in the
commit): ``python tests/init_reference_models.py``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import SVI

import numpyro_dgp as dgp

REFERENCE = Path(__file__).resolve().parent / "data" / "init_reference.npz"


def _data(n=60, d=3, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-1, 1, (n, d))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.randn(n)
    return jnp.asarray(X), jnp.asarray(y)


def _unwhitened(X, y=None):
    h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=7, out_dim=2, mean="linear", whiten=False)
    f = dgp.gp_layer("h2", h, dgp.kernels.Matern52(), num_inducing=6, whiten=False)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)


def _locations(X, y=None):
    h, hz = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=6, out_dim=2, mean="identity", inducing="locations")
    f, _ = dgp.gp_layer("h2", (h, hz), dgp.kernels.RBF(), inducing="locations")
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)


def cases():
    """``{label: (model, guide factory, model kwargs)}``."""
    dsvi = dgp.models.deep_gp_regression(2, num_inducing=10, hidden_width=4)
    three = dgp.models.deep_gp_regression(3, num_inducing=8, hidden_width=2)
    diff = dgp.models.diffgp(1.0, num_steps=4, num_inducing=6)
    amortized = dgp.models.amortized_dgp(widths=(3, 1), num_inducing=(4, 4))
    return {
        "dsvi_factorized": (dsvi, dgp.guides.AutoFactorizedDGP, {"batch_size": 20}),
        "dsvi_chain": (three, dgp.guides.AutoChainDGP, {}),
        "dsvi_joint": (three, dgp.guides.AutoJointDGP, {}),
        "unwhitened_factorized": (_unwhitened, dgp.guides.AutoFactorizedDGP, {}),
        "locations_joint": (_locations, dgp.guides.AutoJointDGP, {}),
        "diffgp_factorized": (diff, dgp.guides.AutoFactorizedDGP, {}),
        "amortized": (amortized, lambda m: dgp.guides.AutoAmortizedDGP(m, rule="AR2P", num_branches=4), {"batch_size": 16}),
    }


def reference_params(label, init=None):
    """The initial constrained parameters of ``label`` (key 0, float64): from ``svi.init``, or
    from ``init(svi, key, X, y, **kwargs)`` when given."""
    model, make_guide, kwargs = cases()[label]
    X, y = _data()
    svi = SVI(model, make_guide(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    if init is None:
        state = svi.init(jax.random.PRNGKey(0), X, y, **kwargs)
    else:
        state = init(svi, jax.random.PRNGKey(0), X, y, **kwargs)
    return {k: np.asarray(v) for k, v in svi.get_params(state).items()}


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", True)
    arrays = {}
    for label in cases():
        for name, value in reference_params(label).items():
            arrays[f"{label}/{name}"] = value
    REFERENCE.parent.mkdir(exist_ok=True)
    np.savez(REFERENCE, **arrays)
    print(f"wrote {REFERENCE}: {len(arrays)} arrays")

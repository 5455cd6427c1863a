"""Initialization: the structure from an abstract run, svi.init compiled as one program, and
the same initial values as before (tests/data/init_reference.npz, from svi.init at dadc1a3)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from numpyro_dgp.infer import init
from tests.init_reference_models import REFERENCE, cases, reference_params

LABELS = list(cases())


@pytest.mark.parametrize("label", LABELS)
@pytest.mark.parametrize("how", ["svi.init", "infer.init"])
def test_initial_values_are_unchanged(label, how):
    reference = np.load(REFERENCE)
    got = reference_params(label, init=None if how == "svi.init" else init)
    expected = {k.split("/", 1)[1] for k in reference.files if k.startswith(label + "/")}
    assert set(got) == expected
    for name, value in got.items():
        ref = reference[f"{label}/{name}"]
        assert value.shape == ref.shape and value.dtype == ref.dtype, name
        # bit for bit under the same XLA options; the suite runs XLA with fewer optimizations
        # than the reference was made with (and infer.init with none). An inner layer's initial
        # draws sqrt(var) eps, var ~ jitter k (k ~ 1, jitter 1e-6) near its inducing inputs,
        # carry the round-off of var as eps k / (2 sqrt(jitter k)) |eps| (|eps| <= 5): 10x that
        # (4.2e-13 measured, against 1.1e-13 x 4 for the largest draw)
        roundoff = 10 * np.finfo(np.float64).eps / (2 * np.sqrt(1e-6)) * 5
        np.testing.assert_allclose(value, ref, rtol=1e-12, atol=roundoff, err_msg=name)


def test_prototype_is_abstract_and_holds_no_tracers():
    model, make_guide, kwargs = cases()["unwhitened_factorized"]
    from tests.init_reference_models import _data

    X, y = _data()
    guide = make_guide(model)
    guide._setup_prototype(X, y, **kwargs)
    for site in guide.prototype_trace.values():
        value = site["value"]
        assert value is None or isinstance(value, (jax.ShapeDtypeStruct, float, int)), (site["name"], type(value))
    assert [s.name for s in guide.inducing_sites] == ["h1.u", "h2.u"]
    assert guide.inducing_sites[0].whiten is False and guide.inducing_sites[1].is_last


def test_compiled_init_is_kept_per_svi_and_reused():
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp
    from numpyro_dgp.infer import _fit
    from tests.init_reference_models import _data

    X, y = _data()
    model = dgp.models.deep_gp_regression(2, num_inducing=5, hidden_width=2)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    a = init(svi, jax.random.PRNGKey(0), X, y)
    compiled = _fit._compiled_init._cache_size()
    b = init(svi, jax.random.PRNGKey(0), X, y)  # same key: the same state, from the same program
    assert _fit._compiled_init._cache_size() == compiled
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(u, v)


def test_a_minibatch_smaller_than_num_inducing_initializes_alike():
    """M = 40 inducing points from minibatches of 16 (an SVGP: the first layer is the one that
    sees the data's rows): svi.init and the compiled init agree, and the layer starts from the
    batch's own rows (then distinct draws around them)."""
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp
    from tests.init_reference_models import _data

    X, y = _data()
    model = dgp.models.deep_gp_regression(1, num_inducing=40)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    eager = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y, batch_size=16))
    compiled = svi.get_params(init(svi, jax.random.PRNGKey(0), X, y, batch_size=16))
    assert set(eager) == set(compiled)
    for name in eager:
        np.testing.assert_allclose(compiled[name], eager[name], rtol=1e-9, atol=1e-9, err_msg=name)
    Z = np.asarray(eager["h1.inducing_inputs"])
    assert Z.shape == (40, X.shape[1]) and len(np.unique(Z, axis=0)) == 40
    assert all(np.any(np.all(row == np.asarray(X), axis=1)) for row in Z[:16])

"""The DiffGP driver of the UCI benchmark (``papers.diffgp.fit_diffgp``): pre-training the
predictor as an SVGP, and the released code's initial values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from papers.diffgp import fit_diffgp

from numpyro_dgp.models import diffgp
from numpyro_dgp.recipes import fit_factorized


@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    X = jnp.asarray(rng.uniform(-1, 1, (12, 2)))
    y = jnp.asarray(np.sin(3 * np.asarray(X[:, 0])) + 0.1 * rng.randn(12))
    return X, y


@pytest.mark.stochastic
def test_fit_diffgp_pretraining_and_the_released_initial_values(data):
    X, y = data
    key, lr = jax.random.PRNGKey(3), 0.01
    small = {"num_inducing": 5, "num_flow_steps": 3, "num_particles": 1, "learning_rate": lr}
    # pre-training: the flow model starts from the T = 0 fit's predictor and noise (one Adam
    # step moves an unconstrained coordinate by at most ~lr), and so starts from a lower loss
    _, _, svgp = fit_factorized(diffgp(0.0, num_inducing=5), jax.random.fold_in(key, 1), X, y,
                                num_steps=150, learning_rate=lr, chunk_size=150)
    _, _, pre = fit_diffgp(key, X, y, T=1.0, num_steps=1, pretrain_steps=150, **small)
    _, _, cold = fit_diffgp(key, X, y, T=1.0, num_steps=1, **small)
    for site in ("g.u_auto_loc", "g.inducing_inputs"):
        np.testing.assert_allclose(pre.params[site], svgp.params[site], atol=1.01 * lr)
        assert np.max(np.abs(cold.params[site] - svgp.params[site])) > 10 * lr
    assert pre.losses[0] < 0.5 * cold.losses[0]

    # the released code's initial values: lengthscales D, noise 1, inducing means ~ N(0, 1)
    _, _, released = fit_diffgp(key, X, y, T=1.0, num_steps=1, init="released", **small)
    D = X.shape[1]
    for site in ("flow.kernel.lengthscale", "g.kernel.lengthscale"):
        np.testing.assert_allclose(released.params[site], D, rtol=2 * lr)
    np.testing.assert_allclose(released.params["noise"], 1.0, rtol=2 * lr)
    np.testing.assert_allclose(released.params["flow.kernel.variance"], 0.01, rtol=2 * lr)
    for site in ("flow.u_auto_loc", "g.u_auto_loc"):
        # an N(0, 1) draw is within 2 lr of zero with probability 0.016: at least half of the 5
        # (g) or 10 (flow) means away from zero fails with probability below 4e-5
        assert np.mean(np.abs(np.asarray(released.params[site])) > 2 * lr) >= 0.5
        assert np.all(np.abs(np.asarray(cold.params[site])) <= 1.01 * lr)  # ours start at zero

    with pytest.raises(ValueError, match="init must be"):
        fit_diffgp(key, X, y, init="paper")
    with pytest.raises(ValueError, match="pretrain_steps must be"):
        fit_diffgp(key, X, y, pretrain_steps=-1)

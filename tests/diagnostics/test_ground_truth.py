"""diagnostics.ground_truth: the explore / weigh / check protocol in one call."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import NUTS

import numpyro_dgp as dgp
from numpyro_dgp import diagnostics, kernels
from numpyro_dgp.handlers import exact_layers
from tests._mc import mcmc_mean_and_se, z_threshold

jax.config.update("jax_enable_x64", True)  # idempotent (conftest does it too)

KERNEL = kernels.RBF(variance=1.0, lengthscale=0.5)
GRID = jnp.array([[-0.3], [0.55]])


def one_layer(X, y=None):
    f = dgp.gp_layer("f", X, KERNEL, num_inducing=5)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)


def _data():
    X = jnp.linspace(-1, 1, 10)[:, None]
    return X, jnp.sin(3 * X[:, 0]) + 0.1 * jax.random.normal(jax.random.PRNGKey(1), (10,))


@pytest.fixture(scope="module")
def result():
    X, y = _data()
    return diagnostics.ground_truth(
        exact_layers(one_layer, grid=GRID, jitter=1e-6), jax.random.PRNGKey(0), GRID, X, y,
        kernel=lambda m: NUTS(m, max_tree_depth=6), num_chains=3, num_warmup=300, num_samples=400,
        ess_threshold=100.0, evidence_draws=500,
    )


@pytest.mark.stochastic
def test_a_unimodal_posterior_is_converged_ground_truth_and_its_reference_is_the_posterior(result):
    """A plain GP: one mode, checked and passed; the pooled reference's grid means are the
    closed-form posterior's within Monte Carlo error (from the explored chains' ESS)."""
    X, y = _data()
    assert result.converged and result.checked == [0] and len(result.health.modes) == 1
    assert result.evidence.weights[0] == pytest.approx(1.0)
    K = np.asarray(KERNEL(X)) + 0.01 * np.eye(10)
    Ks = np.asarray(KERNEL(GRID, X))
    mean = Ks @ np.linalg.solve(K, np.asarray(y))
    _, se = mcmc_mean_and_se(np.asarray(result.explored["posterior"]["f"].values)[..., 0])
    pooled = np.asarray(result.reference["posterior"]["f"].values)[..., 0].mean((0, 1))
    np.testing.assert_array_less(np.abs(pooled - mean), z_threshold(2) * se)
    assert "converged ground truth: True" in result.report()


def test_the_within_mode_check_fires():
    """A short run against an ESS no run of its length reaches: not converged."""
    X, y = _data()
    strict = diagnostics.ground_truth(
        exact_layers(one_layer, grid=GRID, jitter=1e-6), jax.random.PRNGKey(0), GRID, X, y,
        kernel=lambda m: NUTS(m, max_tree_depth=6), num_chains=2, num_warmup=50, num_samples=50,
        ess_threshold=1e6, evidence_draws=200,
    )
    assert not strict.converged and strict.checked
    assert not strict.mode_health[strict.checked[0]].table.ok.any()


@pytest.mark.parametrize("kwargs, match", [
    ({"num_chains": 1}, "num_chains must be at least 2, got 1"),
    ({"min_weight": 1.0}, r"min_weight must be in \[0, 1\), got 1.0"),
])
def test_ground_truth_refuses_bad_arguments(kwargs, match):
    X, y = _data()
    with pytest.raises(ValueError, match=match):
        diagnostics.ground_truth(exact_layers(one_layer, grid=GRID), jax.random.PRNGKey(0), GRID, X, y, **kwargs)


def test_a_mode_of_one_chain_is_checked_on_its_halves_and_divergences_are_kept():
    """The within-mode tree of one chain holds its two halves (split R-hat); a mode's divergences
    reach its health check (one divergent transition fails it)."""
    from numpyro_dgp.diagnostics._modes import _chains

    rng = np.random.default_rng(0)
    draws = rng.normal(size=(3, 100, 4, 1))
    diverging = np.zeros((3, 100), bool)
    diverging[2, 7] = True
    tree = diagnostics.from_layer_samples({"f": draws}, np.zeros((4, 1)), sample_stats={"diverging": diverging})
    one = _chains(tree, [1])
    np.testing.assert_array_equal(one["posterior"]["f"].values, np.stack([draws[1, :50], draws[1, 50:]]))
    both = _chains(tree, [0, 2])
    assert int(both["sample_stats"]["diverging"].values.sum()) == 1
    lenient = dict(rhat_threshold=1.5, ess_threshold=1.0, warn=False)
    assert not diagnostics.mcmc_health(both, **lenient).table.ok.any()
    assert diagnostics.mcmc_health(_chains(tree, [0, 1]), **lenient).table.ok.all()

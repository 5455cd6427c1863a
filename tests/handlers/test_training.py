"""Training handlers: fast_subsample draws uniform subsets; data_parallel equals one device."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.handlers import seed

import numpyro_dgp as dgp
from numpyro_dgp.handlers import fast_subsample
from tests._two_devices import run_on_two_devices


def _draw_subsample(rng_key, size=10, subsample_size=3):
    def fn():
        with numpyro.plate("data", size, subsample_size=subsample_size) as idx:
            return idx

    return seed(fast_subsample(fn), rng_key)()


_DATA_PARALLEL_SCRIPT = """
from numpyro.infer import MCMC, NUTS
from numpyro_dgp.models import deep_gp_regression

model = deep_gp_regression(2, num_inducing=8, hidden_width=3)
guide = dgp.guides.AutoFactorizedDGP(model)
one = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
two = SVI(data_parallel(model), guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
state = one.init(jax.random.PRNGKey(0), X, y, batch_size=32)
two.init(jax.random.PRNGKey(0), X, y, batch_size=32)  # sets two's transforms; both start from `state`
params = one.get_params(state)

def loss_and_grad(svi):
    f = lambda p, key: svi.loss.loss(key, p, svi.model, svi.guide, X, y, batch_size=32)
    return jax.jit(jax.value_and_grad(f))

out = {"loss_rel_diff": [], "grad_rel_diff": []}
f1, f2 = loss_and_grad(one), loss_and_grad(two)
for i in range(3):  # three minibatches (and Monte Carlo draws)
    key = jax.random.PRNGKey(10 + i)
    (l1, g1), (l2, g2) = f1(params, key), f2(params, key)
    out["loss_rel_diff"].append(float(abs(l1 - l2) / abs(l1)))
    out["grad_rel_diff"].append(gradient_difference(g1, g2))
hlo = f2.lower(params, jax.random.PRNGKey(0)).compile().as_text()
out["all_reduce"] = "all-reduce" in hlo

r1 = dgp.fit(one, None, X, y, batch_size=32, num_steps=30, chunk_size=10, init_state=state, progress_bar=False)
r2 = dgp.fit(two, None, X, y, batch_size=32, num_steps=30, chunk_size=10, init_state=state, progress_bar=False)
out["fit_loss_max_rel_diff"] = float(np.max(np.abs(r1.losses - r2.losses) / np.abs(r1.losses)))
# a fit that initializes on two devices: its chunk is compiled once, after the initialization
# (beside it only on one device, where the state's placement is known beforehand)
compiled = []
def listener(event, duration, fun_name=None, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        compiled.append(fun_name)
jax.monitoring.register_event_duration_secs_listener(listener)
r3 = dgp.fit(two, jax.random.PRNGKey(0), X, y, batch_size=32, num_steps=15, chunk_size=15, progress_bar=False)
jax.monitoring.unregister_event_duration_listener(listener)
out["fit_from_key_chunk_compiles"] = compiled.count("jit(_run_chunk)")
out["fit_from_key_finite"] = bool(np.all(np.isfinite(r3.losses)))

def lin(x, y=None):
    w = numpyro.sample("w", numpyro.distributions.Normal(0, 1))
    numpyro.sample("y", numpyro.distributions.Normal(w * x, 1.0), obs=y)

mcmc = MCMC(NUTS(lin), num_warmup=50, num_samples=50, num_chains=2, chain_method="parallel", progress_bar=False)
mcmc.run(jax.random.PRNGKey(1), jnp.arange(5.0), 2 * jnp.arange(5.0))
w = mcmc.get_samples(group_by_chain=True)["w"]
out["mcmc_shape"] = list(w.shape)
out["mcmc_chains_differ"] = bool(not np.allclose(w[0], w[1]))
print(json.dumps(out))
"""


@pytest.mark.stochastic
def test_fast_subsample_draws_uniform_subsets():
    draws = np.stack([np.asarray(_draw_subsample(k)) for k in jax.random.split(jax.random.PRNGKey(0), 3000)])
    assert draws.shape == (3000, 3)
    assert all(len(set(row)) == 3 for row in draws), "indices within a subsample must be distinct"
    assert draws.min() >= 0 and draws.max() <= 9
    counts = np.bincount(draws.ravel(), minlength=10)
    # each index is in a subset with probability 3/10: Binomial(3000, 0.3), sd 25
    assert np.all(np.abs(counts - 900) < 5 * 25), counts
    # (5 sd for 11 comparisons: above the Bonferroni z of 4.44 for a false-alarm rate of 1e-4)
    # pairs are uniform too (a subset, not just uniform marginals): P(0 and 1 together) = 1/15
    together = np.mean([(0 in row) and (1 in row) for row in draws])
    assert abs(together - 1 / 15) < 5 * np.sqrt((1 / 15) * (14 / 15) / 3000)


def test_fast_subsample_indices_are_top_k_of_the_key_s_uniforms():
    # the same indices as one top_k of the key's float32 uniforms (what earlier releases drew)
    from numpyro_dgp.handlers._base import _top_k_subsample

    key = jax.random.PRNGKey(5)
    expected = jax.lax.top_k(jax.random.uniform(key, (7_373,), jnp.float32), 1_000)[1]
    drawn = _top_k_subsample(7_373, 1_000, key)
    np.testing.assert_array_equal(np.asarray(drawn), np.asarray(expected))


def test_fast_subsample_leaves_given_subsamples_alone():
    given = jnp.array([7, 2, 5])

    def fn():
        with numpyro.plate("data", 10, subsample_size=3) as idx:
            return idx

    substituted = numpyro.handlers.substitute(fast_subsample(fn), data={"data": given})
    np.testing.assert_array_equal(np.asarray(seed(substituted, 0)()), np.asarray(given))
    # and a full plate (no subsampling) stays arange
    def full():
        with numpyro.plate("p", 4) as idx:
            return idx

    np.testing.assert_array_equal(np.asarray(seed(fast_subsample(full), 0)()), np.arange(4))


def test_factory_plate_draws_numpyro_s_indices_compiled_and_fast_subsample_replaces_them():
    from numpyro.primitives import Messenger

    from numpyro_dgp import _compat
    from numpyro_dgp.handlers._base import _top_k_subsample
    from numpyro_dgp.models import _subsample

    X, y = jnp.zeros((40, 2)), jnp.zeros(40)
    seen = {}

    class spy(Messenger):  # the function and key the plate was drawn with
        def postprocess_message(self, msg):
            if msg["type"] == "plate":
                seen["fn"], seen["key"] = msg["fn"], msg["kwargs"]["rng_key"]

    def draw():
        return _subsample(X, y, 8, "test", None)[0].subsample_size  # 40 points: NumPyro draws them

    def indices(fn):
        with numpyro.handlers.trace() as tr:
            seed(fn, 0)()
        return np.asarray(tr["data"]["value"])

    plain = indices(spy(draw))
    assert seen["fn"] is _compat.numpyro_subsample_fn
    np.testing.assert_array_equal(plain, np.asarray(_compat.numpyro_subsample_fn(40, 8, rng_key=seen["key"])))
    fast = indices(spy(fast_subsample(draw)))
    assert seen["fn"] is _top_k_subsample
    np.testing.assert_array_equal(fast, np.asarray(_top_k_subsample(40, 8, rng_key=seen["key"])))


def test_data_parallel_loss_equals_single_device_on_two_cpu_devices():
    out = run_on_two_devices(_DATA_PARALLEL_SCRIPT)
    # same minibatches and Monte Carlo draws: equal up to the order of the reductions
    assert max(out["loss_rel_diff"]) < 1e-6, out
    assert max(out["grad_rel_diff"]) < 1e-6, out
    assert out["fit_loss_max_rel_diff"] < 1e-6, out
    assert out["fit_from_key_chunk_compiles"] == 1 and out["fit_from_key_finite"], out
    assert out["all_reduce"], "the sharded loss must reduce across devices"
    assert out["mcmc_shape"] == [2, 50] and out["mcmc_chains_differ"]


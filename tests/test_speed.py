"""The fast paths of a training step: subsampling, compilation reuse, data parallelism.

(Speed itself is measured in benchmarks/speed.py, never asserted here.)
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.handlers import seed
from numpyro.infer import SVI, Trace_ELBO

import numpyro_dgp as dgp
from numpyro_dgp.handlers import fast_subsample
from numpyro_dgp.models import deep_gp_regression

REPO = Path(__file__).resolve().parents[1]


def _toy(N=40, D=2, seed_=0):
    rs = np.random.RandomState(seed_)
    X = rs.uniform(-1, 1, (N, D))
    y = np.sin(2 * X[:, 0]) + 0.1 * rs.randn(N)
    return jnp.asarray(X), jnp.asarray(y)


def _draw_subsample(rng_key, size=10, subsample_size=3):
    def fn():
        with numpyro.plate("data", size, subsample_size=subsample_size) as idx:
            return idx

    return seed(fast_subsample(fn), rng_key)()


def test_fast_subsample_draws_uniform_subsets():
    draws = np.stack([np.asarray(_draw_subsample(k)) for k in jax.random.split(jax.random.PRNGKey(0), 3000)])
    assert draws.shape == (3000, 3)
    assert all(len(set(row)) == 3 for row in draws), "indices within a subsample must be distinct"
    assert draws.min() >= 0 and draws.max() <= 9
    counts = np.bincount(draws.ravel(), minlength=10)
    # each index is in a subset with probability 3/10: Binomial(3000, 0.3), sd 25
    assert np.all(np.abs(counts - 900) < 5 * 25), counts
    # pairs are uniform too (a subset, not just uniform marginals): P(0 and 1 together) = 1/15
    together = np.mean([(0 in row) and (1 in row) for row in draws])
    assert abs(together - 1 / 15) < 5 * np.sqrt((1 / 15) * (14 / 15) / 3000)


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


def test_dgp_elbo_step_has_no_sequential_shuffle():
    # NumPyro's CPU subsample is a lax.scan of Fisher-Yates swaps (a `scan` in the jaxpr);
    # DGPElbo's step draws the minibatch with fast_subsample instead. The same check on
    # Trace_ELBO shows the check can see the loop.
    X, y = _toy()
    model = deep_gp_regression(2, num_inducing=4, hidden_width=2)
    guide = dgp.guides.AutoFactorisedDGP(model)
    for loss, expect_loop in [(dgp.DGPElbo(), False), (Trace_ELBO(), True)]:
        svi = SVI(model, guide, numpyro.optim.Adam(0.01), loss)
        state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=10)
        jaxpr = str(jax.make_jaxpr(lambda s: svi.update(s, X, y, batch_size=10))(state))
        assert ("scan[" in jaxpr or "while[" in jaxpr) == expect_loop, type(loss).__name__


def test_fit_traces_the_model_once_whatever_the_number_of_steps():
    X, y = _toy()
    base = deep_gp_regression(2, num_inducing=4, hidden_width=2)
    calls = {"n": 0}

    def model(X, y=None, batch_size=None):
        calls["n"] += 1
        return base(X, y, batch_size)

    def traced_calls(num_steps, continue_for=0):
        guide = dgp.guides.AutoFactorisedDGP(model)
        svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
        state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=10)
        before = calls["n"]
        result = dgp.fit(svi, None, X, y, batch_size=10, num_steps=num_steps, chunk_size=2,
                         init_state=state, progress_bar=False)
        after_first = calls["n"]
        if continue_for:
            dgp.fit(svi, None, X, y, batch_size=10, num_steps=continue_for, chunk_size=2,
                    init_state=result.state, progress_bar=False)
        return after_first - before, calls["n"] - after_first

    one_chunk, _ = traced_calls(2)
    many_chunks, continued = traced_calls(20, continue_for=10)
    assert one_chunk >= 1
    assert many_chunks == one_chunk, "more steps must not trace the model again"
    assert continued == 0, "continuing with init_state must reuse the compiled chunk"


_DATA_PARALLEL_SCRIPT = textwrap.dedent(
    """
    import json
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    from numpyro.infer import MCMC, NUTS, SVI
    import numpyro_dgp as dgp
    from numpyro_dgp.handlers import data_parallel
    from numpyro_dgp.models import deep_gp_regression

    assert len(jax.devices()) == 2, jax.devices()
    rs = np.random.RandomState(0)
    X = jnp.asarray(rs.uniform(-1, 1, (64, 2)))
    y = jnp.sin(3 * X[:, 0]) * X[:, 1] + 0.05 * jnp.asarray(rs.randn(64))
    model = deep_gp_regression(2, num_inducing=8, hidden_width=3)
    guide = dgp.guides.AutoFactorisedDGP(model)
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
        # relative to each parameter's gradient norm, floored at 1e-6 of the largest: some
        # gradients are exactly zero (round-off on either side is then meaningless)
        norms = {k: float(jnp.linalg.norm(g1[k])) for k in g1}
        floor = 1e-6 * max(norms.values())
        out["grad_rel_diff"].append(max(float(jnp.linalg.norm(g1[k] - g2[k])) / max(norms[k], floor) for k in g1))
    hlo = f2.lower(params, jax.random.PRNGKey(0)).compile().as_text()
    out["all_reduce"] = "all-reduce" in hlo

    r1 = dgp.fit(one, None, X, y, batch_size=32, num_steps=30, chunk_size=10, init_state=state, progress_bar=False)
    r2 = dgp.fit(two, None, X, y, batch_size=32, num_steps=30, chunk_size=10, init_state=state, progress_bar=False)
    out["fit_loss_max_rel_diff"] = float(np.max(np.abs(r1.losses - r2.losses) / np.abs(r1.losses)))

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
)


def test_data_parallel_loss_equals_single_device_on_two_cpu_devices():
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    proc = subprocess.run([sys.executable, "-c", _DATA_PARALLEL_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # same minibatches and Monte Carlo draws: equal up to the order of the reductions
    assert max(out["loss_rel_diff"]) < 1e-6, out
    assert max(out["grad_rel_diff"]) < 1e-6, out
    assert out["fit_loss_max_rel_diff"] < 1e-6, out
    assert out["all_reduce"], "the sharded loss must reduce across devices"
    assert out["mcmc_shape"] == [2, 50] and out["mcmc_chains_differ"]


def test_data_parallel_rejects_an_unknown_axis():
    from jax.sharding import Mesh

    mesh = Mesh(np.asarray(jax.devices()[:1]), ("batch",))
    with pytest.raises(ValueError, match="axis_name"):
        dgp.handlers.data_parallel(lambda: None, mesh=mesh, axis_name="model")


def test_dgp_elbo_checks_arguments_eagerly_and_skips_the_checks_only_while_tracing():
    import numpyro.distributions as dist
    from numpyro.distributions import distribution as dist_module

    X, y = _toy(N=12, D=1)
    seen = []
    noise_scale = {"value": 0.1}

    def model(X, y=None):
        seen.append(dist_module._VALIDATION_ENABLED)
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=4)
        numpyro.sample("y", dist.Normal(f[:, 0], noise_scale["value"]), obs=y)

    guide = dgp.guides.AutoFactorisedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(0), X, y)
    params = svi.get_params(state)
    elbo = dgp.DGPElbo()
    key = jax.random.PRNGKey(1)

    seen.clear()
    eager = elbo.loss(key, params, model, guide, X, y)
    assert seen and all(seen)  # eager: NumPyro's checks on
    seen.clear()
    jitted = jax.jit(lambda p: elbo.loss(key, p, model, guide, X, y))(params)
    assert seen and not any(seen)  # traced: off
    assert dist_module._VALIDATION_ENABLED  # and restored afterwards
    np.testing.assert_allclose(jitted, eager, rtol=1e-10)

    noise_scale["value"] = -1.0  # an invalid constant argument is still caught eagerly
    with pytest.raises(ValueError, match="Normal distribution got invalid scale"):
        elbo.loss(key, params, model, guide, X, y)

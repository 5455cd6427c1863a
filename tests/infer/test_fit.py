"""fit: the compiled SVI loop against a plain update loop; compilation reuse; skipped updates."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI

import numpyro_dgp as dgp
from numpyro_dgp.models import deep_gp_regression
from tests._compiles import compile_messages

NOISE = 0.05


def one_layer(X, y=None):
    f = dgp.gp_layer("f", X, dgp.kernels.RBF(variance=1.3, lengthscale=0.4), inducing_inputs=X[::3], jitter=1e-8)
    noise = numpyro.param("noise", NOISE, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)


@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    X = np.sort(rng.uniform(-1, 1, 30))[:, None]
    y = np.where(X[:, 0] > 0, 1.0, -1.0) + 0.05 * rng.randn(30)
    return jnp.asarray(X), jnp.asarray(y)


def make_svi(model, lr=0.01, elbo=None, **guide_kw):
    guide = dgp.guides.AutoFactorizedDGP(model, **guide_kw)
    return guide, SVI(model, guide, numpyro.optim.Adam(lr), elbo or dgp.DGPElbo())


class _Counter:
    def __init__(self):
        self.n = 0


class NaNSometimes(dgp.DGPElbo):
    """An objective that is non-finite for about a third of the random keys."""

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        out = super().loss_with_mutable_state(rng_key, param_map, model, guide, *args, **kwargs)
        bad = jax.random.uniform(jax.random.fold_in(rng_key, 7)) < 0.33
        return {**out, "loss": jnp.where(bad, jnp.nan, out["loss"])}


def _toy(N=40, D=2, seed_=0):
    rs = np.random.RandomState(seed_)
    X = rs.uniform(-1, 1, (N, D))
    y = np.sin(2 * X[:, 0]) + 0.1 * rs.randn(N)
    return jnp.asarray(X), jnp.asarray(y)


def test_fit_matches_a_plain_update_loop(data):
    X, y = data
    guide, svi = make_svi(one_layer)
    state = svi.init(jax.random.PRNGKey(0), X, y)
    # 3 chunks of 25, the last one only partly used (masked steps must not change anything)
    result = dgp.fit(svi, None, X, y, num_steps=60, chunk_size=25, init_state=state, progress_bar=False)
    update = jax.jit(svi.update)
    manual = []
    s = state
    for _ in range(60):
        s, loss = update(s, X, y)
        manual.append(float(loss))
    np.testing.assert_allclose(result.losses, manual, rtol=1e-8)
    for k, v in svi.get_params(s).items():
        np.testing.assert_allclose(result.params[k], v, rtol=1e-6, atol=1e-9)
    assert result.num_skipped == 0 and result.losses.shape == (60,)


def test_fit_averages_the_iterates_of_its_last_steps(data):
    X, y = data
    guide, svi = make_svi(one_layer, lr=0.05)
    state = svi.init(jax.random.PRNGKey(0), X, y)
    # the window (steps 38..60) starts inside the second chunk and ends in a partly used third
    result = dgp.fit(svi, None, X, y, num_steps=60, chunk_size=25, init_state=state, progress_bar=False,
                     average_from=37)
    update = jax.jit(svi.update)
    s, iterates = state, []
    for _ in range(60):
        s, _ = update(s, X, y)
        iterates.append(svi.optim.get_params(s.optim_state))
    # reference: plain mean of the unconstrained iterates after steps 38..60, then constrained
    window = iterates[37:]
    mean = {k: np.mean([it[k] for it in window], axis=0) for k in window[0]}
    expected = svi.constrain_fn(mean)
    for k, v in expected.items():
        np.testing.assert_allclose(result.averaged_params[k], v, rtol=1e-6, atol=1e-9)
    # the average differs from the last iterate (the optimizer is still moving)
    assert not np.allclose(result.averaged_params["f.u_auto_loc"], result.params["f.u_auto_loc"], atol=1e-4)
    # the last step alone is the final parameters; no averaging, no field
    last = dgp.fit(svi, None, X, y, num_steps=60, chunk_size=25, init_state=state, progress_bar=False,
                   average_from=59)
    for k, v in last.params.items():
        np.testing.assert_allclose(last.averaged_params[k], v, rtol=1e-6, atol=1e-9)
    plain = dgp.fit(svi, None, X, y, num_steps=60, chunk_size=25, init_state=state, progress_bar=False)
    assert plain.averaged_params is None
    for k, v in plain.params.items():  # averaging does not change the trajectory
        np.testing.assert_allclose(result.params[k], v, rtol=1e-8)
    for bad in (-1, 60, 2.5):
        with pytest.raises(ValueError, match="average_from"):
            dgp.fit(svi, None, X, y, num_steps=60, init_state=state, progress_bar=False, average_from=bad)


def test_fit_compiles_once(data):
    X, y = data
    counter = _Counter()

    def counted(X, y=None):
        counter.n += 1  # runs at trace time only under jit
        one_layer(X, y)

    guide, svi = make_svi(counted)
    state = svi.init(jax.random.PRNGKey(0), X, y)
    before = counter.n
    dgp.fit(svi, None, X, y, num_steps=50, chunk_size=10, init_state=state, progress_bar=False)
    traces_short = counter.n - before
    assert traces_short >= 1
    before = counter.n
    dgp.fit(svi, None, X, y, num_steps=200, chunk_size=10, init_state=state, progress_bar=False)
    # the same SVI: the compiled chunk is reused; the one trace is fit's door, an abstract run
    # that checks the observed values
    assert counter.n - before == 1
    _, fresh = make_svi(counted)
    fresh_state = fresh.init(jax.random.PRNGKey(0), X, y)
    before = counter.n
    dgp.fit(fresh, None, X, y, num_steps=200, chunk_size=10, init_state=fresh_state, progress_bar=False)
    assert counter.n - before == traces_short  # 5 chunks or 20: the same number of traces


def test_fit_times_compilation_apart_from_the_chunks_and_compiles_the_chunk_once(data):
    X, y = data
    guide, svi = make_svi(one_layer)
    state = svi.init(jax.random.PRNGKey(0), X, y)
    with compile_messages() as messages:
        first = dgp.fit(svi, None, X, y, num_steps=30, chunk_size=10, init_state=state, progress_bar=False)
        more = dgp.fit(svi, None, X, y, num_steps=30, chunk_size=10, init_state=first.state, progress_bar=False)
    # compiled ahead of the first chunk, and the jitted chunk calls reuse that executable
    compiles = [m for m in messages if m.startswith("Finished XLA compilation") and "run_chunk" in m]
    assert len(compiles) == 1, compiles
    assert first.compile_seconds > 0 and more.compile_seconds >= 0
    assert first.chunk_seconds.shape == (3,) and first.chunk_size == 10
    assert first.seconds_per_step == pytest.approx(np.median(first.chunk_seconds) / 10)


def test_fit_skips_and_counts_non_finite_updates(data):
    X, y = data
    guide, svi = make_svi(one_layer, elbo=NaNSometimes())
    with pytest.warns(RuntimeWarning, match="skipped"):
        result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=300, progress_bar=False)
    assert result.num_skipped == int(np.sum(~np.isfinite(result.losses)))
    assert 50 < result.num_skipped < 150
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in result.params.values())
    finite = result.losses[np.isfinite(result.losses)]
    assert finite[-20:].mean() < finite[:20].mean()  # still learning


def test_fit_raises_when_every_update_fails(data):
    X, y = data

    class AlwaysNaN(dgp.DGPElbo):
        def loss_with_mutable_state(self, *a, **k):
            out = super().loss_with_mutable_state(*a, **k)
            return {**out, "loss": out["loss"] * jnp.nan}

    guide, svi = make_svi(one_layer, elbo=AlwaysNaN())
    with pytest.raises(FloatingPointError, match="every update"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=20, progress_bar=False)


def test_fit_rejects_bad_arguments(data):
    X, y = data
    guide, svi = make_svi(one_layer)
    with pytest.raises(ValueError, match=r"args\[1\] contains NaN"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y.at[3].set(jnp.nan), num_steps=5, progress_bar=False)
    with pytest.raises(ValueError, match="num_steps"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=0)


def test_minibatch_fit_with_static_batch_size(data):
    X, y = data
    model = deep_gp_regression(2, num_inducing=5)
    guide, svi = make_svi(model, lr=0.02)
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=150, batch_size=10, progress_bar=False)
    assert result.losses[-30:].mean() < result.losses[:30].mean()


def test_fit_traces_the_model_once_whatever_the_number_of_steps():
    X, y = _toy()
    base = deep_gp_regression(2, num_inducing=4, hidden_width=2)
    calls = {"n": 0}

    def model(X, y=None, batch_size=None):
        calls["n"] += 1
        return base(X, y, batch_size)

    def traced_calls(num_steps, continue_for=0):
        guide = dgp.guides.AutoFactorizedDGP(model)
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
    # continuing reuses the compiled chunk: the one trace is fit's door (an abstract run that
    # checks the observed values)
    assert continued == 1, "continuing with init_state must reuse the compiled chunk"

"""How many programs ``fit`` and ``predict`` trace and compile, so that a regression shows.

Counted with JAX's public monitoring events (one ``backend_compile`` event per XLA compilation,
one ``jaxpr_trace`` event per trace). Before the compiled initialization, ``svi.init`` of the
kin8nm model alone compiled about 410 programs eagerly; a second ``fit`` on the same ``SVI``
object or a second ``predict`` must compile nothing.
"""

from __future__ import annotations

import contextlib
import threading

import jax
import numpy as np
import optax
import pytest
from jax import monitoring
from numpyro.infer import SVI

import numpyro_dgp as nd
from numpyro_dgp import guides, models

_COMPILE = "/jax/core/compile/backend_compile_duration"
_TRACE = "/jax/core/compile/jaxpr_trace_duration"

# Upper bounds with room over today's counts (jax 0.12, float64; measured: the first fit of a
# 2-layer factorized model 8 compilations, the first predict 2; before the whitened prior
# skipped validating its constant arguments the first fit compiled 31, and before the mixture
# moved into the predictor's program the first predict compiled 12). Initialization and the
# training step (which also returns the constrained parameters) are one program each, the
# prediction is one; the rest are small eager operations (key creation, conversions).
MAX_FIRST_FIT_COMPILES = 12
MAX_FIRST_PREDICT_COMPILES = 5


@contextlib.contextmanager
def count_events(*events):
    counts = dict.fromkeys(events or (_COMPILE, _TRACE), 0)

    def listener(event, duration, **kwargs):
        if event in counts:
            counts[event] += 1

    monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        monitoring.unregister_event_duration_listener(listener)


@contextlib.contextmanager
def compiled_programs():
    """``[(program name, thread name)]`` of the XLA compilations inside the block."""
    compiled = []

    def listener(event, duration, fun_name=None, **kwargs):
        if event == _COMPILE:
            compiled.append((fun_name, threading.current_thread().name))

    monitoring.register_event_duration_secs_listener(listener)
    try:
        yield compiled
    finally:
        monitoring.unregister_event_duration_listener(listener)


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = np.sin(X.sum(1)) + 0.1 * rng.normal(size=120)
    # a fresh model function: nothing of it is in any cache yet
    model = models.deep_gp_regression(num_layers=2, num_inducing=15)
    return model, X, y


@pytest.mark.parametrize("guide_name", ["AutoFactorizedDGP", "AutoChainDGP"])
def test_fit_and_predict_compile_once(problem, guide_name):
    model, X, y = problem
    guide = getattr(guides, guide_name)(model)
    svi = SVI(model, guide, optax.adam(0.01), nd.DGPElbo())
    with count_events() as first_fit:
        result = nd.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=150, chunk_size=100, progress_bar=False)
    with count_events() as second_fit:
        nd.fit(svi, jax.random.PRNGKey(1), X, y, num_steps=150, chunk_size=100, progress_bar=False,
               init_state=result.state)
    with count_events() as first_predict:
        nd.predict(model, guide, result.params, jax.random.PRNGKey(2), X[:40], num_samples=8)
    with count_events() as second_predict:
        nd.predict(model, guide, result.params, jax.random.PRNGKey(3), X[:40], num_samples=8)

    assert 1 <= first_fit[_COMPILE] <= MAX_FIRST_FIT_COMPILES, first_fit
    assert 1 <= first_predict[_COMPILE] <= MAX_FIRST_PREDICT_COMPILES, first_predict
    # continuing on the same SVI object and predicting again reuse the compiled programs; the
    # continued fit traces once, abstractly: its door's check of the observed values
    assert second_fit == {_COMPILE: 0, _TRACE: 1}, second_fit
    assert second_predict == {_COMPILE: 0, _TRACE: 0}, second_predict


_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"


def _count_lowerings(fn, *args, **kwargs):
    with count_events(_LOWER) as counts:
        jax.block_until_ready(fn(*args, **kwargs))
    return counts[_LOWER]


def test_eager_kernel_conditional_and_inverse_are_one_program_per_shape():
    # Called outside jit (interactive use, tests), each is one compiled program; before, every
    # operation compiled on its own at each new shape (a Gram matrix about a dozen, the
    # conditional with its triangular inverse over a hundred). Lowerings are counted: a
    # program lowers once per shape whether or not a persistent compilation cache has it.
    from numpyro_dgp import core, kernels

    rng = np.random.default_rng(3)
    M, N, P = 43, 29, 2  # shapes no other test uses, so nothing is cached in this process
    X = jax.numpy.asarray(rng.normal(size=(N, 3)))
    Z = jax.numpy.asarray(rng.normal(size=(M, 3)))
    kernel = kernels.Matern52(variance=1.3, lengthscale=np.array([0.7, 1.1, 0.9]))
    assert _count_lowerings(kernel, Z, X) == 1
    assert _count_lowerings(kernel, Z, X) == 0  # reused
    L = jax.numpy.asarray(np.linalg.cholesky(np.asarray(kernel(Z)) + 1e-6 * np.eye(M)))
    assert _count_lowerings(core.triangular_inverse, L) == 1
    q_mean = jax.numpy.asarray(rng.normal(size=(P, M)))
    q_sqrt = jax.numpy.asarray(np.tril(rng.normal(size=(P, M, M))))
    Knn = kernel.diag(X)
    assert _count_lowerings(core.conditional, kernel(Z, X), L, Knn, q_mean, q_sqrt, whiten=False) == 1


def test_first_fit_compiles_its_initialization_and_its_chunk_each_once(problem):
    # one program for the initialization, one for the chunk function, in this thread; the calls
    # that follow must reuse both compilations
    _, X, y = problem
    model = models.deep_gp_regression(num_layers=1, num_inducing=7)  # fresh: nothing cached
    svi = SVI(model, guides.AutoFactorizedDGP(model), optax.adam(0.01), nd.DGPElbo())
    with compiled_programs() as compiled:
        result = nd.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=20, chunk_size=10, progress_bar=False)
    names = [name for name, _ in compiled]
    assert names.count("jit(_run_chunk)") == 1 and names.count("jit(_compiled_init)") == 1, compiled
    assert {thread for _, thread in compiled} == {threading.main_thread().name}, compiled
    assert result.compile_seconds > 0
    # the same losses as a fit from a state initialized on its own
    state = nd.infer.init(svi, jax.random.PRNGKey(0), X, y)
    again = nd.fit(svi, None, X, y, num_steps=20, chunk_size=10, progress_bar=False, init_state=state)
    np.testing.assert_array_equal(again.losses, result.losses)


@pytest.mark.parametrize("placed", ["committed X", "data_parallel"])
def test_a_fit_whose_state_comes_out_placed_compiles_its_chunk_once(problem, placed):
    # inputs committed to a device, or a model with a placement, give a state committed to
    # the device: the chunk is compiled once, for the placed state
    _, X, y = problem
    model = models.deep_gp_regression(num_layers=1, num_inducing=6)  # fresh: nothing cached
    if placed == "committed X":
        X, y = jax.device_put(X, jax.devices()[0]), jax.device_put(y, jax.devices()[0])
        fit_model = model
    else:
        fit_model = nd.handlers.data_parallel(model)
    svi = SVI(fit_model, guides.AutoFactorizedDGP(model), optax.adam(0.01), nd.DGPElbo())
    with compiled_programs() as compiled:
        result = nd.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=10, chunk_size=10, progress_bar=False)
    assert [name for name, _ in compiled].count("jit(_run_chunk)") == 1, compiled
    assert {thread for _, thread in compiled} == {threading.main_thread().name}, compiled
    assert np.all(np.isfinite(result.losses))


def test_a_step_that_cannot_be_traced_fails_at_the_chunk_s_compile_not_at_initialization(
    problem, monkeypatch
):
    # the step's failure is raised by the chunk's compile, never by the initialization (which
    # would look for a layer to blame)
    from numpyro_dgp.infer import _fit

    class Untraceable(nd.DGPElbo):
        def loss(self, *args, **kwargs):
            raise ValueError("the step cannot be traced")

    _, X, y = problem
    model = models.deep_gp_regression(num_layers=1, num_inducing=5)
    svi = SVI(model, guides.AutoFactorizedDGP(model), optax.adam(0.01), Untraceable())
    blamed = []
    monkeypatch.setattr(_fit, "failed_layer", lambda *args, **kwargs: blamed.append(1) or (None, None))
    with pytest.raises(ValueError, match="the step cannot be traced"):
        nd.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=2, progress_bar=False)
    assert blamed == []

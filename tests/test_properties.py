"""Property-based tests (hypothesis): invariants over random inputs, hyperparameters and trees.

* every kernel (sums and products included) gives a symmetric positive semi-definite Gram
  matrix, to a tolerance relative to the matrix's norm and the dtype's precision;
* ``gp_layer`` returns and records the documented shapes for random ``(N, D, P, M)``;
* the sparse conditional's marginal variances are non-negative in float32 and float64;
* ``save_params`` / ``load_params`` give back any nested parameter tree bit for bit.

The examples are deterministic (the ``numpyro_dgp`` hypothesis profile in ``conftest.py``);
shapes are drawn from small sets so that the JAX programs compile a few times, not once per
example.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import numpyro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numpyro_dgp as dgp
from numpyro_dgp import kernels
from numpyro_dgp.core import conditional, default_jitter, jittered_cholesky

DTYPES = {"float32": jnp.float32, "float64": jnp.float64}
POSITIVE = st.floats(0.05, 20.0)


@st.composite
def base_kernels(draw, dim):
    cls = draw(st.sampled_from([kernels.RBF, kernels.Matern12, kernels.Matern32, kernels.Matern52,
                                kernels.Periodic, kernels.Linear]))
    if cls is kernels.Linear:
        return kernels.Linear(variance=draw(POSITIVE))
    ard = draw(st.booleans())
    lengthscale = np.array(draw(st.lists(POSITIVE, min_size=dim, max_size=dim))) if ard else draw(POSITIVE)
    if cls is kernels.Periodic:
        return kernels.Periodic(variance=draw(POSITIVE), lengthscale=lengthscale, period=draw(POSITIVE))
    return cls(variance=draw(POSITIVE), lengthscale=lengthscale)


@st.composite
def any_kernels(draw, dim):
    """A base kernel, or a sum or product of two or three (nested combinations included)."""
    parts = [draw(base_kernels(dim)) for _ in range(draw(st.integers(1, 3)))]
    if len(parts) == 1:
        return parts[0]
    combined = parts[0]
    for part in parts[1:]:
        combined = combined + part if draw(st.booleans()) else combined * part
    return combined


@st.composite
def inputs(draw, dtype):
    """``(N, D)`` points from a few shapes, with repeated points now and then (the diagonal's
    round-off is where kernels go wrong)."""
    N, D = draw(st.sampled_from([(1, 1), (6, 1), (6, 3), (15, 2)]))
    X = np.array(draw(st.lists(st.floats(-3, 3, width=32), min_size=N * D, max_size=N * D))).reshape(N, D)
    if N > 1 and draw(st.booleans()):
        X[-1] = X[0]
    return jnp.asarray(X, dtype)


def _in_dtype(kernel, dtype):
    """The kernel with its hyperparameters in ``dtype`` (NumPy float64 values would promote)."""
    return jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), kernel)


@given(data=st.data(), dtype=st.sampled_from(sorted(DTYPES)))
def test_gram_matrices_are_symmetric_positive_semidefinite(data, dtype):
    X = data.draw(inputs(DTYPES[dtype]))
    kernel = _in_dtype(data.draw(any_kernels(X.shape[1])), DTYPES[dtype])
    K = kernel(X)
    assert K.dtype == DTYPES[dtype]
    K = np.asarray(K, np.float64)
    assert K.shape == (X.shape[0],) * 2
    scale = max(np.linalg.norm(K, 2), np.finfo(np.float64).tiny)
    tol = 50 * X.shape[0] * float(jnp.finfo(DTYPES[dtype]).eps) * scale
    assert np.max(np.abs(K - K.T)) <= tol
    assert np.linalg.eigvalsh(K).min() >= -tol, f"{kernel}: min eigenvalue {np.linalg.eigvalsh(K).min()}, tol {tol}"
    if dtype == "float64":  # in float32 the distance expansion's round-off shows on the diagonal (~1e-3)
        np.testing.assert_allclose(np.asarray(kernel.diag(X)), np.diag(K), rtol=1e-8, atol=1e-8 * scale)


@settings(max_examples=10)
@given(N=st.integers(3, 12), D=st.integers(1, 3), P=st.integers(1, 3), M=st.integers(1, 3),
       mean=st.sampled_from(["zero", "identity", "linear"]), whiten=st.booleans())
def test_gp_layer_has_the_documented_shapes(N, D, P, M, mean, whiten):
    X = jnp.asarray(np.random.RandomState(N * 100 + D).uniform(-1, 1, (N, D)))

    def model():
        return dgp.gp_layer("h", X, kernels.RBF(), num_inducing=M, out_dim=P, mean=mean, whiten=whiten)

    tr = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace()
    assert tr["h"]["value"].shape == (N, P)
    assert tr["h.u"]["value"].shape == (P, M)
    assert tr["h.inducing_inputs"]["value"].shape == (M, D)
    assert tr["h.kernel.lengthscale"]["value"].shape == (D,)
    assert tr["h.layer"]["args"][0].Kmm_chol.shape == (M, M)
    if mean == "linear":
        assert tr["h.mean.weight"]["value"].shape == (D, P) and tr["h.mean.bias"]["value"].shape == (P,)


@given(data=st.data(), dtype=st.sampled_from(sorted(DTYPES)), whiten=st.booleans(),
       q=st.sampled_from(["none", "diagonal", "full"]))
def test_sparse_conditional_variances_are_non_negative(data, dtype, whiten, q):
    dt = DTYPES[dtype]
    X = data.draw(inputs(dt))
    # inducing inputs among the points (where the variance reduction cancels the prior) and near them
    Z = jnp.concatenate([X[: max(1, X.shape[0] // 2)], X[:1] + 1e-4], axis=0)
    kernel = data.draw(base_kernels(X.shape[1]).filter(lambda k: not isinstance(k, kernels.Linear)))
    # kernel variances up to 1e3 against the dtype's default jitter: float32 round-off then
    # exceeds the jitter at the inducing inputs (the case that needed clipping)
    kernel = _in_dtype(kernel.replace(variance=kernel.variance * data.draw(st.sampled_from([1.0, 50.0]))), dt)
    M, P = Z.shape[0], 2
    L = jittered_cholesky(kernel(Z), default_jitter(dt))
    rng = np.random.RandomState(data.draw(st.integers(0, 2**16)))
    q_mean = jnp.asarray(rng.randn(P, M), dt)
    q_sqrt = {"none": None, "diagonal": jnp.asarray(np.abs(rng.randn(P, M)) * 1e-3, dt),
              "full": jnp.asarray(np.tril(rng.randn(P, M, M)) * 1e-3, dt)}[q]
    mean, var = conditional(kernel(Z, X), L, kernel.diag(X), q_mean, q_sqrt, whiten=whiten)
    assert mean.shape == var.shape == (X.shape[0], P)
    assert var.dtype == dt
    assert bool(jnp.all(var >= 0)), f"negative variance {float(var.min())} ({dtype}, {kernel})"


ARRAY_DTYPES = [np.dtype(t) for t in ("float16", "float32", "float64", "int8", "int32", "int64", "uint8",
                                      "uint64", "bool", "complex64", "complex128")] + [np.dtype(ml_dtypes.bfloat16)]


@st.composite
def leaf_arrays(draw):
    """Any bit pattern (NaN payloads, -0.0, infinities, subnormals) of any supported dtype."""
    dtype = draw(st.sampled_from(ARRAY_DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = draw(st.binary(min_size=size, max_size=size))
    if dtype == np.bool_:
        raw = bytes(b & 1 for b in raw)  # a bool array holds 0 or 1
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


KEYS = st.text(min_size=0, max_size=6)
TREES = st.recursive(leaf_arrays(), lambda children: st.dictionaries(KEYS, children, max_size=3), max_leaves=8)


def _same_bits(a, b, where="params"):
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            _same_bits(a[k], b[k], f"{where}[{k!r}]")
        return
    assert a.dtype == b.dtype and a.shape == b.shape, where
    assert a.tobytes() == b.tobytes(), where


@settings(max_examples=40)
@given(tree=st.dictionaries(KEYS, TREES, max_size=4))
def test_save_load_round_trips_any_tree_bit_for_bit(tree):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "params.npz"
        dgp.save_params(path, tree, metadata={"note": "hypothesis"})
        loaded, metadata = dgp.load_params(path, return_metadata=True, as_numpy=True)
    _same_bits(tree, loaded)
    assert metadata == {"note": "hypothesis"}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sparse_conditional_clips_round_off_at_the_inducing_inputs(dtype):
    """The case the property found first: query points equal to the inducing inputs, where the
    prior variance and its reduction cancel to round-off."""
    dt = DTYPES[dtype]
    Z = jnp.asarray(np.random.RandomState(0).uniform(-3, 3, (20, 2)), dt)
    k = _in_dtype(kernels.RBF(variance=900.0, lengthscale=2.0), dt)
    X = jnp.concatenate([Z, Z + 1e-3])
    _, var = conditional(k(Z, X), jittered_cholesky(k(Z), default_jitter(dt)), k.diag(X), jnp.zeros((1, 20), dt))
    assert bool(jnp.all(var >= 0))
    assert float(var.max()) < 1e-2 * 900.0

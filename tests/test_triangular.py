"""The block-triangular products, the blocked Cholesky and the lower-factor layout against
dense float64 references, at sizes on both sides of every block edge."""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.test_util import check_grads  # noqa: E402
from numpyro.distributions.transforms import SoftplusLowerCholeskyTransform, biject_to  # noqa: E402
from numpyro.distributions.util import vec_to_tril_matrix  # noqa: E402

from numpyro_dgp._compat import softplus_lower_cholesky  # noqa: E402
from numpyro_dgp.core import cholesky, conditional, inverse_cholesky, triangular_inverse  # noqa: E402
from numpyro_dgp.core._triangular import (  # noqa: E402
    LOWER_TIMES_BLOCK,
    _leaf_size,
    QUADRATIC_FORM_BLOCK,
    QUADRATIC_FORM_MOST_BLOCKS,
    lower_from_vector,
    lower_of_times_transpose,
    lower_times,
    lower_factors_transpose_times,
    lower_times_lower,
    quadratic_form_diagonals,
    triangular_blocks,
)

#: sizes at and around the block edges, the large size the blocks are for, and one where the
#: number of blocks and leaves is capped (larger blocks and leaves)
SIZES = [1, 7, 64, 65, 130, 500, 1000]


def _dense_factors_transpose_times(q_sqrt, B):
    return jnp.einsum("pmk,mn->pkn", jnp.tril(q_sqrt), B)


def _dense_quadratic_forms(q_sqrt, B):
    return jnp.sum(_dense_factors_transpose_times(q_sqrt, B) ** 2, axis=1)


@pytest.mark.parametrize("size", [1, 5, 64, 65, 500])
@pytest.mark.parametrize("block", [1, 3, 64])
@pytest.mark.parametrize("most", [1000, 4])
def test_triangular_blocks_cover_the_range_in_order(size, block, most):
    blocks = triangular_blocks(size, block, most)
    assert blocks[0][0] == 0 and blocks[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    if -(-size // block) <= most:
        assert len(blocks) == -(-size // block) and all(0 < stop - start <= block for start, stop in blocks)
    else:  # capped: exactly `most` nearly equal blocks, larger than `block`
        assert len(blocks) == most and all(abs((stop - start) - size / most) < 1 for start, stop in blocks)


@pytest.mark.parametrize("n", [1, 16, 17, 255, 256, 257, 500, 1000, 1001, 4099])
@pytest.mark.parametrize("smallest, most_leaves", [(64, 8), (16, 4)])
def test_recursions_stop_at_their_leaf_bound(n, smallest, most_leaves):
    # the blocked factorization halves n until a block is at most the leaf edge: at most
    # most_leaves leaves (so the compiled program's size is bounded in n), none above the edge
    leaf = _leaf_size(n, smallest, most_leaves)

    def leaves(size):
        return [size] if size <= leaf else leaves(size // 2) + leaves(size - size // 2)

    sizes = leaves(n)
    assert sum(sizes) == n and max(sizes) <= leaf and len(sizes) <= max(most_leaves, 1)
    assert leaf == smallest or leaf == -(-n // most_leaves)


@pytest.mark.parametrize("M", SIZES)
@pytest.mark.parametrize(
    "ours, dense",
    [(quadratic_form_diagonals, _dense_quadratic_forms), (lower_factors_transpose_times, _dense_factors_transpose_times)],
    ids=["quadratic_form_diagonals", "lower_factors_transpose_times"],
)
def test_lower_factor_products_match_the_dense_products(M, ours, dense):
    rs = np.random.RandomState(M)
    q_sqrt = jnp.asarray(rs.randn(3, M, M))  # upper triangle is not zero: it must be ignored
    B = jnp.asarray(rs.randn(M, 11))
    W = jnp.asarray(rs.randn(*dense(q_sqrt, B).shape))
    np.testing.assert_allclose(ours(q_sqrt, B), dense(q_sqrt, B), rtol=1e-11, atol=1e-12)

    def loss(f):
        return lambda q, B: jnp.sum(W * f(q, B))

    grads = jax.grad(loss(ours), argnums=(0, 1))(q_sqrt, B)
    reference = jax.grad(loss(dense), argnums=(0, 1))(q_sqrt, B)
    for g, r in zip(grads, reference):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-10 * float(jnp.max(jnp.abs(r))))
    assert not jnp.any(jnp.triu(grads[0], 1))  # no gradient into the ignored triangle


@pytest.mark.parametrize("M", SIZES)
def test_lower_times_matches_the_dense_product(M):
    rs = np.random.RandomState(M + 1)
    T, X, W = (jnp.asarray(rs.randn(*s)) for s in [(M, M), (M, 6), (M, 6)])
    np.testing.assert_allclose(lower_times(T, X), jnp.tril(T) @ X, rtol=1e-11, atol=1e-11)
    grads = jax.grad(lambda T, X: jnp.sum(W * lower_times(T, X)), argnums=(0, 1))(T, X)
    reference = jax.grad(lambda T, X: jnp.sum(W * (jnp.tril(T) @ X)), argnums=(0, 1))(T, X)
    for g, r in zip(grads, reference):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-10 * float(jnp.max(jnp.abs(r))))


@pytest.mark.parametrize("M", SIZES)
def test_triangle_times_triangle_products_match_the_dense_products(M):
    # the factorization's derivative rules are built from these two: each reads only the lower
    # triangles it should (the inputs' upper triangles hold noise here) and has exact zeros
    # above the diagonal
    rs = np.random.RandomState(M + 5)
    T, U, X = (jnp.asarray(rs.randn(2, M, M)) for _ in range(3))
    for ours, reference in [
        (lower_times_lower(T, U), jnp.tril(T) @ jnp.tril(U)),
        (lower_of_times_transpose(X, T), jnp.tril(X @ jnp.swapaxes(jnp.tril(T), -1, -2))),
    ]:
        np.testing.assert_allclose(ours, reference, rtol=1e-11, atol=1e-11 * M)
        assert np.all(np.triu(np.asarray(ours), 1) == 0.0)


def test_block_products_pass_finite_difference_checks_with_several_small_blocks(monkeypatch, request):
    # blocks of 3 at M = 8 (3 blocks, the last one short): the block boundaries' derivatives
    # in both modes, at a size where finite differences are cheap
    import numpyro_dgp.core._triangular as triangular

    monkeypatch.setattr(triangular, "LOWER_TIMES_BLOCK", 3)
    monkeypatch.setattr(triangular, "LOWER_TIMES_MOST_BLOCKS", 4)  # above the default cap of 2
    # the factorization and the inverse are jitted: an 8 x 8 program traced earlier in this
    # process would keep the default blocks (its derivative had 11 products instead of 15)
    jax.clear_caches()
    request.addfinalizer(jax.clear_caches)  # and later tests do not get the patched programs
    assert len(triangular_blocks(8, triangular.LOWER_TIMES_BLOCK, triangular.LOWER_TIMES_MOST_BLOCKS)) == 3
    rs = np.random.RandomState(8)
    T, U, B = jnp.asarray(rs.randn(8, 8)), jnp.asarray(rs.randn(8, 8)), jnp.asarray(rs.randn(8, 2))
    # order 1: the products are bilinear; compiled, as the checks' many evaluations are slow
    # op by op
    for product, args in [(lower_times, (T, B)), (lower_times_lower, (T, U)), (lower_of_times_transpose, (U, T))]:
        check_grads(jax.jit(product), args, order=1, modes=["fwd", "rev"])
    K = jnp.asarray(_spd(rs, 8))
    check_grads(jax.jit(lambda K: jnp.sum(U * triangular_inverse(cholesky(K)))), (K,), order=1, modes=["rev", "fwd"])
    check_grads(jax.jit(lambda K: jnp.sum(U * inverse_cholesky(K))), (K,), order=1, modes=["rev", "fwd"])


def test_lower_times_takes_a_batch_of_factors():
    rs = np.random.RandomState(3)
    T, X = jnp.asarray(rs.randn(2, 3, 130, 130)), jnp.asarray(rs.randn(2, 3, 130, 5))
    np.testing.assert_allclose(lower_times(T, X), jnp.tril(T) @ X, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("M", [7, QUADRATIC_FORM_BLOCK + 1, LOWER_TIMES_BLOCK + 3])
def test_triangular_products_pass_finite_difference_checks_in_both_modes(M):
    # forward mode too: Laplace approximations and Hessians differentiate through them
    rs = np.random.RandomState(M)
    q_sqrt, B, T = jnp.asarray(rs.randn(2, M, M)), jnp.asarray(rs.randn(M, 4)), jnp.asarray(rs.randn(M, M))
    check_grads(quadratic_form_diagonals, (q_sqrt, B), order=2, modes=["fwd", "rev"])
    check_grads(lower_times, (T, B), order=2, modes=["fwd", "rev"])
    U = jnp.asarray(rs.randn(M, M))
    check_grads(lower_times_lower, (T, U), order=2, modes=["fwd", "rev"])
    check_grads(lower_of_times_transpose, (U, T), order=2, modes=["fwd", "rev"])
    check_grads(lower_from_vector, (jnp.asarray(rs.randn(3, M * (M + 1) // 2)),), order=1, modes=["fwd", "rev"])


def _spd(rs, M):
    A = rs.randn(M, M)
    return A @ A.T + M * np.eye(M)


@pytest.mark.parametrize("M", SIZES)
def test_blocked_cholesky_and_its_derivative_at_every_size(M):
    rs = np.random.RandomState(M + 2)
    K = jnp.asarray(_spd(rs, M))
    L = np.linalg.cholesky(np.asarray(K))
    np.testing.assert_allclose(cholesky(K), L, rtol=1e-11, atol=1e-11)
    # the inverse the recursion builds beside the factor (65, 130: odd splits; 1000: 8 leaves of 125)
    np.testing.assert_allclose(inverse_cholesky(K), np.linalg.inv(L), rtol=1e-10, atol=1e-13)
    batch = jnp.stack([K, 2.0 * K])  # a batch: each matrix its own factor and inverse
    np.testing.assert_allclose(inverse_cholesky(batch)[1], np.linalg.inv(np.sqrt(2.0) * L), rtol=1e-10, atol=1e-13)
    if M <= 130:  # finite differences need a few evaluations per direction
        W = jnp.asarray(rs.randn(M, M))
        check_grads(lambda K: jnp.sum(W * triangular_inverse(cholesky(K))), (K,), order=1, modes=["rev", "fwd"])


def test_blocked_cholesky_is_nan_where_the_matrix_is_not_positive_definite():
    K = np.eye(200)
    K[150, 150] = -1.0  # only the second half's trailing block fails
    assert not np.all(np.isfinite(np.asarray(cholesky(jnp.asarray(K)))))
    assert not np.all(np.isfinite(np.asarray(inverse_cholesky(jnp.asarray(K)))))


def _dense_whitened_variances(Kmn, Kmm, Knn, q_sqrt):
    """The training path's marginal variances by dense float64 algebra (explicit inverses)."""
    Linv = np.linalg.inv(np.linalg.cholesky(Kmm))
    A = Linv @ Kmn
    S = np.einsum("pij,pkj->pik", np.tril(q_sqrt), np.tril(q_sqrt))
    return (Knn - np.sum(A**2, 0))[:, None] + np.einsum("mn,pmk,kn->np", A, S, A)


@pytest.mark.parametrize("M", SIZES)
def test_conditional_variances_match_the_dense_formula_at_every_size(M):
    rs = np.random.RandomState(M + 3)
    Z, X = rs.randn(M, 2) * 2, rs.randn(40, 2) * 2
    d2 = lambda a, b: ((a[:, None] - b[None]) ** 2).sum(-1)  # noqa: E731
    # jitter 1e-4: the dense reference inverts Kmm explicitly, so its own error grows with Kmm's condition
    Kmm, Kmn = np.exp(-0.5 * d2(Z, Z)) + 1e-4 * np.eye(M), np.exp(-0.5 * d2(Z, X))
    q_mean, q_sqrt = rs.randn(3, M), np.tril(rs.randn(3, M, M)) * 0.3
    mean, var = conditional(Kmn, np.linalg.cholesky(Kmm), np.ones(40), q_mean, q_sqrt, whiten=True)
    expected = _dense_whitened_variances(Kmn, Kmm, np.ones(40), q_sqrt)
    np.testing.assert_allclose(var, np.maximum(expected, 0), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n", [1, 2, 5, 64])
def test_lower_from_vector_is_numpyros_layout_with_its_derivative(n):
    rs = np.random.RandomState(n)
    x = jnp.asarray(rs.randn(3, n * (n + 1) // 2))
    W = jnp.asarray(rs.randn(3, n, n))
    ours, theirs = biject_to(softplus_lower_cholesky), SoftplusLowerCholeskyTransform()
    np.testing.assert_array_equal(ours(x), theirs(x))
    np.testing.assert_allclose(
        jax.grad(lambda x: jnp.sum(W * ours(x)))(x), jax.grad(lambda x: jnp.sum(W * theirs(x)))(x), rtol=1e-13
    )
    np.testing.assert_allclose(ours.inv(ours(x)), x, rtol=1e-10, atol=1e-12)
    # float32 with diagonals of 1e-13: the softplus exactly, not lost to cancellation
    small = jnp.asarray(x, jnp.float32).at[..., -n:].set(-30.0)
    diagonal = np.diagonal(ours(small), axis1=-2, axis2=-1)
    assert ours(small).dtype == jnp.float32
    np.testing.assert_array_equal(diagonal, np.broadcast_to(jax.nn.softplus(jnp.float32(-30.0)), diagonal.shape))
    assert np.all(diagonal > 0)
    tail = x[..., : n * (n - 1) // 2]
    if n > 1:
        np.testing.assert_array_equal(
            lower_from_vector(jnp.concatenate([tail, jnp.zeros((3, n))], -1)), vec_to_tril_matrix(tail, diagonal=-1)
        )


def test_lower_from_vector_keeps_the_dtype_and_names_a_bad_length():
    assert lower_from_vector(jnp.ones(6, jnp.float32)).dtype == jnp.float32
    with pytest.raises(ValueError, match="n \\(n \\+ 1\\) / 2"):
        lower_from_vector(jnp.ones(5))


def _primitives(jaxpr) -> list:
    """Every equation of a jaxpr, nested jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        found.append(eqn)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _primitives(inner)
    return found


def test_the_quadratic_forms_derivative_assembles_column_blocks_without_summing_full_size_pieces():
    # the derivative used to be a sum of 8 zero-padded (P, M, M) arrays, XLA's slowest pass at
    # large width (benchmarks/topics/scale.md, item 18); now one concatenation of column blocks
    P, M = 3, QUADRATIC_FORM_BLOCK * QUADRATIC_FORM_MOST_BLOCKS + 44  # blocks at their most
    q_sqrt, B = jnp.ones((P, M, M)), jnp.ones((M, 5))
    jaxpr = jax.make_jaxpr(jax.grad(lambda q: quadratic_form_diagonals(q, B).sum()))(q_sqrt).jaxpr
    eqns = _primitives(jaxpr)
    full = [e.primitive.name for e in eqns if e.primitive.name in ("pad", "add_any")
            and e.outvars[0].aval.shape == (P, M, M)]
    assert full == []
    assert sum(e.primitive.name == "concatenate" and e.outvars[0].aval.shape == (P, M, M) for e in eqns) == 1


def test_the_factor_layout_is_written_once_and_differentiates_in_both_modes():
    # the barrier keeps XLA from fusing the gather's transposing read into every consumer
    vector = jnp.asarray(np.random.RandomState(0).randn(2, 10))
    eqns = _primitives(jax.make_jaxpr(lower_from_vector)(vector).jaxpr)
    assert [e.primitive.name for e in eqns].count("optimization_barrier") == 1
    hessian = jax.hessian(lambda v: jnp.sum(lower_from_vector(v) ** 3))(vector)
    dense = jax.hessian(lambda v: jnp.sum(vec_to_tril_matrix(v[..., :6], diagonal=-1) ** 3)
                        + jnp.sum(v[..., 6:] ** 3))(vector)
    np.testing.assert_allclose(hessian, dense, rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(lower_from_vector)(vector[:, None]), lower_from_vector(vector)[:, None])

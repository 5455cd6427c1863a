"""Kernels against independent dense float64 NumPy/SciPy references."""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from scipy.spatial.distance import cdist  # noqa: E402

from numpyro_dgp.kernels import (  # noqa: E402
    RBF,
    Linear,
    Matern12,
    Matern32,
    Matern52,
    Periodic,
    Product,
    SquaredExponential,
    Sum,
)

RTOL = 1e-8
ATOL = 1e-8
D = 3


def _rs(seed=0):
    return np.random.RandomState(seed)


def _inputs(seed=0, n1=17, n2=11, dim=D, duplicates=True):
    rs = _rs(seed)
    X1 = rs.randn(n1, dim) * 1.5
    X2 = rs.randn(n2, dim) * 1.5
    if duplicates:
        # coincident points inside X1 and shared between X1 and X2
        X1 = np.vstack([X1, X1[:3]])
        X2 = np.vstack([X2, X1[3:5]])
    return X1, X2


# ---------------------------------------------------------------- dense references


def ref_stationary(name, variance, lengthscale, X1, X2):
    ls = np.broadcast_to(np.asarray(lengthscale, float), (X1.shape[1],))
    r = cdist(X1 / ls, X2 / ls)  # Euclidean distance of the scaled inputs
    if name == "RBF":
        return variance * np.exp(-0.5 * r**2)
    if name == "Matern12":
        return variance * np.exp(-r)
    if name == "Matern32":
        return variance * (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r)
    if name == "Matern52":
        return variance * (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r)
    raise KeyError(name)


def ref_periodic(variance, lengthscale, period, X1, X2):
    ls = np.broadcast_to(np.asarray(lengthscale, float), (X1.shape[1],))
    out = np.empty((X1.shape[0], X2.shape[0]))
    for i in range(X1.shape[0]):
        for j in range(X2.shape[0]):
            s = 0.0
            for d in range(X1.shape[1]):
                s += np.sin(np.pi * abs(X1[i, d] - X2[j, d]) / period) ** 2 / ls[d] ** 2
            out[i, j] = variance * np.exp(-2.0 * s)
    return out


def ref_linear(variance, X1, X2):
    return variance * np.einsum("id,jd->ij", X1, X2)


STATIONARY = {"RBF": RBF, "Matern12": Matern12, "Matern32": Matern32, "Matern52": Matern52}
LS_VEC = np.array([0.7, 1.3, 2.1])


def _all_kernels():
    """(id, kernel, reference function (X1, X2) -> dense matrix)."""
    cases = []
    for name, cls in STATIONARY.items():
        for ls_id, ls in (("scalar", 0.9), ("ard", LS_VEC)):
            k = cls(variance=1.7, lengthscale=jnp.asarray(ls))
            ref = lambda X1, X2, n=name, ls=ls: ref_stationary(n, 1.7, ls, X1, X2)  # noqa: E731
            cases.append((f"{name}-{ls_id}", k, ref))
    cases.append(
        (
            "Periodic-scalar",
            Periodic(variance=0.8, lengthscale=0.6, period=1.9),
            lambda X1, X2: ref_periodic(0.8, 0.6, 1.9, X1, X2),
        )
    )
    cases.append(
        (
            "Periodic-ard",
            Periodic(variance=0.8, lengthscale=jnp.asarray(LS_VEC), period=2.3),
            lambda X1, X2: ref_periodic(0.8, LS_VEC, 2.3, X1, X2),
        )
    )
    cases.append(("Linear", Linear(variance=0.4), lambda X1, X2: ref_linear(0.4, X1, X2)))
    cases.append(
        (
            "Sum",
            Sum(RBF(variance=1.2, lengthscale=0.8), Linear(variance=0.3)),
            lambda X1, X2: ref_stationary("RBF", 1.2, 0.8, X1, X2) + ref_linear(0.3, X1, X2),
        )
    )
    cases.append(
        (
            "Product",
            Product(Matern52(variance=1.1, lengthscale=jnp.asarray(LS_VEC)), Periodic(period=1.4)),
            lambda X1, X2: ref_stationary("Matern52", 1.1, LS_VEC, X1, X2)
            * ref_periodic(1.0, 1.0, 1.4, X1, X2),
        )
    )
    cases.append(
        (
            "Nested",
            Sum(
                Product(RBF(variance=0.9, lengthscale=1.1), Linear(variance=0.5)),
                Matern12(variance=0.2, lengthscale=jnp.asarray(LS_VEC)),
            ),
            lambda X1, X2: ref_stationary("RBF", 0.9, 1.1, X1, X2) * ref_linear(0.5, X1, X2)
            + ref_stationary("Matern12", 0.2, LS_VEC, X1, X2),
        )
    )
    return cases


CASES = _all_kernels()
IDS = [c[0] for c in CASES]


# ---------------------------------------------------------------- values


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cross_covariance_matches_reference(case):
    _, k, ref = case
    X1, X2 = _inputs(1)
    out = np.asarray(k(X1, X2))
    assert out.shape == (X1.shape[0], X2.shape[0])
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref(X1, X2), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_symmetric_call_matches_reference(case):
    _, k, ref = case
    X, _ = _inputs(2)
    expected = ref(X, X)
    np.testing.assert_allclose(np.asarray(k(X)), expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(k(X, X)), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_diag_equals_diagonal_of_full_matrix(case):
    _, k, ref = case
    X, _ = _inputs(3)
    d = np.asarray(k.diag(X))
    assert d.shape == (X.shape[0],)
    np.testing.assert_allclose(d, np.diag(np.asarray(k(X, X))), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(d, np.diag(ref(X, X)), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_kernel_matrix_symmetric_psd(case):
    _, k, _ = case
    X, _ = _inputs(4)
    Kx = np.asarray(k(X, X))
    np.testing.assert_allclose(Kx, Kx.T, rtol=1e-12, atol=1e-12)
    eig = np.linalg.eigvalsh(0.5 * (Kx + Kx.T))
    assert eig.min() >= -1e-10 * max(1.0, eig.max())


@pytest.mark.parametrize("cls", [Matern12, Matern32, Matern52, RBF])
def test_diag_consistent_in_float32(cls):
    # k(x, x) must equal the variance exactly enough in single precision too
    X = jnp.asarray(_rs(5).randn(50, 4) * 2.0, jnp.float32)
    k = cls(variance=1.0, lengthscale=jnp.asarray([0.5, 1.0, 1.5, 2.0], jnp.float32))
    Kx = np.asarray(k(X, X))
    assert Kx.dtype == np.float32
    # k(x, x) = variance g(r^2), r^2 the round-off the distance expansion leaves at a == b: at
    # most (4 + 2 sqrt(D)) eps (|a|^2 + |b|^2), the bound Matern12 clips at (exact then); the
    # smooth kernels lose g(0) - g(r^2) = c r^2, c = 1/2 (RBF), 5/6 (Matern52), 3/2 (Matern32).
    # 1e-5 had failed (1.1e-5, Matern32) with XLA's default optimizations.
    A = np.asarray(X, np.float64) / np.asarray(k.lengthscale, np.float64)
    bound = (4 + 2 * np.sqrt(4)) * np.finfo(np.float32).eps * 2 * np.max(np.sum(A**2, 1))
    c = {Matern12: 0.0, Matern32: 1.5, Matern52: 5 / 6, RBF: 0.5}[cls]
    np.testing.assert_allclose(np.diag(Kx), np.asarray(k.diag(X)), rtol=0, atol=c * bound)


def test_squared_exponential_alias():
    assert SquaredExponential is RBF


def test_scalar_lengthscale_equals_repeated_vector():
    X1, X2 = _inputs(6)
    for cls in STATIONARY.values():
        a = cls(variance=1.3, lengthscale=0.8)(X1, X2)
        b = cls(variance=1.3, lengthscale=jnp.full((D,), 0.8))(X1, X2)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- gradients


def _ref_grad_sum(name, variance, ls, X):
    """d/dX sum_ij k(x_i, x_j) = 2 sum_j d_1 k(x_i, x_j) (by symmetry), analytically."""
    ls = np.broadcast_to(np.asarray(ls, float), (X.shape[1],))
    diff = (X[:, None, :] - X[None, :, :]) / ls**2  # (x_i - x_j) / ls^2
    r = cdist(X / ls, X / ls)
    if name == "RBF":
        c = -variance * np.exp(-0.5 * r**2)
    elif name == "Matern32":
        c = -3.0 * variance * np.exp(-np.sqrt(3) * r)
    elif name == "Matern52":
        c = -(5.0 / 3.0) * variance * (1 + np.sqrt(5) * r) * np.exp(-np.sqrt(5) * r)
    elif name == "Matern12":
        with np.errstate(divide="ignore", invalid="ignore"):
            c = np.where(r > 0, -variance * np.exp(-r) / r, 0.0)
    else:
        raise KeyError(name)
    return 2.0 * np.sum(c[:, :, None] * diff, axis=1)


@pytest.mark.parametrize("name", ["Matern12", "Matern32", "Matern52"])
def test_matern_input_gradient_finite_at_coincident_points(name):
    X, _ = _inputs(7)  # contains exactly duplicated rows
    k = STATIONARY[name](variance=1.4, lengthscale=jnp.asarray(LS_VEC))
    grads = jax.jit(
        lambda x: (jax.grad(lambda y: k(y, y).sum())(x), jax.grad(lambda y: k(y).sum())(x))
    )
    g, g1 = (np.asarray(a) for a in grads(jnp.asarray(X)))
    assert np.all(np.isfinite(g)) and np.all(np.isfinite(g1))
    if name != "Matern12":  # Matern12 has a kink at r = 0 for the duplicated pairs
        expected = _ref_grad_sum(name, 1.4, LS_VEC, X)
        np.testing.assert_allclose(g, expected, rtol=1e-7, atol=1e-8)
        np.testing.assert_allclose(g1, expected, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("name", ["RBF", "Matern12", "Matern32", "Matern52"])
def test_input_gradient_matches_analytic(name):
    # distinct points: the diagonal terms k(x, x) = variance have zero gradient
    X = _rs(8).randn(20, D) * 1.5
    k = STATIONARY[name](variance=0.9, lengthscale=jnp.asarray(LS_VEC))
    g = np.asarray(jax.jit(jax.grad(lambda x: k(x, x).sum()))(jnp.asarray(X)))
    np.testing.assert_allclose(g, _ref_grad_sum(name, 0.9, LS_VEC, X), rtol=1e-7, atol=1e-8)


# ---------------------------------------------------------------- hyperparameters


def test_hyperparameter_names_and_replace_simple():
    k = RBF(variance=1.5, lengthscale=0.3)
    assert set(k.hyperparameters()) == {"variance", "lengthscale"}
    assert set(Periodic().hyperparameters()) == {"variance", "lengthscale", "period"}
    assert set(Linear().hyperparameters()) == {"variance"}
    k2 = k.replace(variance=2.5)
    assert k2.hyperparameters()["variance"] == 2.5
    assert k2.hyperparameters()["lengthscale"] == 0.3
    assert k.hyperparameters()["variance"] == 1.5  # immutable
    with pytest.raises(ValueError):
        k.replace(period=1.0)


def test_sum_product_names_replace_round_trip():
    k = Sum(
        Product(RBF(variance=0.9, lengthscale=1.1), Linear(variance=0.5)),
        Matern32(variance=0.2, lengthscale=jnp.asarray(LS_VEC)),
    )
    hp = k.hyperparameters()
    assert set(hp) == {
        "k0.k0.variance",
        "k0.k0.lengthscale",
        "k0.k1.variance",
        "k1.variance",
        "k1.lengthscale",
    }
    # round trip: replacing everything with the current values is the identity
    X1, X2 = _inputs(9)
    same = k.replace(**hp)
    np.testing.assert_allclose(np.asarray(same(X1, X2)), np.asarray(k(X1, X2)), rtol=0, atol=0)
    # new values land in the right parts
    new = k.replace(**{"k0.k0.lengthscale": 0.4, "k0.k1.variance": 2.0, "k1.variance": 3.0})
    hp2 = new.hyperparameters()
    assert hp2["k0.k0.lengthscale"] == 0.4 and hp2["k0.k1.variance"] == 2.0
    assert hp2["k1.variance"] == 3.0 and hp2["k0.k0.variance"] == 0.9
    expected = ref_stationary("RBF", 0.9, 0.4, X1, X2) * ref_linear(2.0, X1, X2) + ref_stationary(
        "Matern32", 3.0, LS_VEC, X1, X2
    )
    np.testing.assert_allclose(np.asarray(new(X1, X2)), expected, rtol=RTOL, atol=ATOL)
    assert new.replace(**hp).hyperparameters().keys() == hp.keys()
    with pytest.raises(ValueError):
        k.replace(variance=1.0)
    with pytest.raises(ValueError):
        k.replace(**{"k2.variance": 1.0})
    with pytest.raises(ValueError):
        k.replace(**{"k0.k0.period": 1.0})


def test_operators_and_flattening():
    a, b, c = RBF(variance=1.0), Linear(variance=2.0), Matern52(variance=3.0)
    s = a + b + c
    assert isinstance(s, Sum) and len(s.kernels) == 3
    assert set(s.hyperparameters()) == {
        "k0.variance", "k0.lengthscale", "k1.variance", "k2.variance", "k2.lengthscale"
    }
    p = a * b * c
    assert isinstance(p, Product) and len(p.kernels) == 3
    X1, X2 = _inputs(10)
    Ka = ref_stationary("RBF", 1.0, 1.0, X1, X2)
    Kb = ref_linear(2.0, X1, X2)
    Kc = ref_stationary("Matern52", 3.0, 1.0, X1, X2)
    np.testing.assert_allclose(np.asarray(s(X1, X2)), Ka + Kb + Kc, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(p(X1, X2)), Ka * Kb * Kc, rtol=RTOL, atol=ATOL)
    with pytest.raises(TypeError):
        Sum(a, 1.0)


# ---------------------------------------------------------------- with_input_dim / validation


def test_with_input_dim_broadcasts_ard():
    k = Matern32(variance=1.0, lengthscale=0.7).with_input_dim(4)
    ls = np.asarray(k.lengthscale)
    assert ls.shape == (4,)
    np.testing.assert_array_equal(ls, 0.7)
    X = _rs(11).randn(6, 4)
    np.testing.assert_allclose(
        np.asarray(k(X)), ref_stationary("Matern32", 1.0, 0.7, X, X), rtol=RTOL, atol=ATOL
    )
    # non-ARD keeps the scalar
    assert np.ndim(RBF(lengthscale=0.7, ard=False).with_input_dim(4).lengthscale) == 0
    # a correct-length vector is kept
    k3 = RBF(lengthscale=jnp.asarray(LS_VEC)).with_input_dim(3)
    np.testing.assert_array_equal(np.asarray(k3.lengthscale), LS_VEC)
    # combinations recurse
    s = (RBF(lengthscale=0.5) + Linear()).with_input_dim(5)
    assert np.asarray(s.hyperparameters()["k0.lengthscale"]).shape == (5,)


def test_with_input_dim_rejects_wrong_length():
    with pytest.raises(ValueError):
        RBF(lengthscale=jnp.asarray([1.0, 2.0])).with_input_dim(3)
    with pytest.raises(ValueError):
        Matern12(lengthscale=jnp.ones(4), ard=False).with_input_dim(3)
    with pytest.raises(ValueError):
        (Linear() * RBF(lengthscale=jnp.ones(2))).with_input_dim(3)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bad_inputs_raise(case):
    _, k, _ = case
    with pytest.raises(ValueError):
        k(np.ones(5))
    with pytest.raises(ValueError):
        k(np.ones((5, 3)), np.ones(4))
    with pytest.raises(ValueError):
        k(np.ones((5, 2)), np.ones((4, 3)))
    with pytest.raises(ValueError):
        k.diag(np.ones(5))


def test_kernels_under_jit():
    X1, X2 = _inputs(12)
    for _, k, ref in (CASES[3], CASES[8], CASES[-1]):
        out = jax.jit(lambda a, b, k=k: k(a, b))(X1, X2)
        np.testing.assert_allclose(np.asarray(out), ref(X1, X2), rtol=RTOL, atol=ATOL)


def test_a_subclass_with_an_array_setting_still_evaluates():
    # Stationary kernels evaluate as one jitted program with the kernel as its argument; a
    # user's subclass whose extra (static) setting is an array cannot be a jit argument and
    # is evaluated directly instead, eagerly and inside jit alike.
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class ScaledRBF(RBF):
        scales: np.ndarray = dataclasses.field(default_factory=lambda: np.array([1.0, 2.0]))

        def _scaled_sqdist(self, X1, X2):
            return super()._scaled_sqdist(X1 * self.scales, X2 * self.scales)

    X1, X2 = np.random.default_rng(0).normal(size=(2, 7, 2))
    for scales in ([1.0, 2.0], [3.0, 0.5]):  # two kernels of one type, settings that differ
        k = ScaledRBF(variance=1.5, lengthscale=0.8, scales=np.array(scales))
        ref = 1.5 * np.exp(-0.5 * cdist(X1 * k.scales / 0.8, X2 * k.scales / 0.8, "sqeuclidean"))
        np.testing.assert_allclose(np.asarray(k(X1, X2)), ref, rtol=1e-10)
        np.testing.assert_allclose(np.asarray(jax.jit(lambda a, b, k=k: k(a, b))(X1, X2)), ref, rtol=1e-10)


@pytest.mark.parametrize("name", ["Matern12", "Matern32", "Matern52"])
def test_matern_diagonal_under_jit_when_xla_recomputes_the_distances(name):
    # Per-point Gram matrices whose diagonal is used twice (the matrix and its mean, as the
    # amortized layers' relative jitter does): XLA then computes the distances in two
    # fusions, whose rounding can disagree about a diagonal residue being > 0. A sqrt guarded
    # by substituting 1.0 returned k(x, x) = 0.34 variance there (Matern52, jax 0.12).
    Z = jnp.asarray(_rs(0).randn(80, 4, 1))
    k = STATIONARY[name](variance=1.23, lengthscale=0.558).with_input_dim(1)

    def f(Z):
        K = jax.vmap(k)(Z)
        return K + jnp.mean(jnp.diagonal(K, axis1=-2, axis2=-1), axis=-1)[..., None, None] * jnp.eye(4)

    eager, jitted = np.asarray(f(Z)), np.asarray(jax.jit(f)(Z))
    np.testing.assert_allclose(np.diagonal(jitted, axis1=-2, axis2=-1), 2 * 1.23, rtol=1e-12)
    np.testing.assert_allclose(jitted, eager, rtol=1e-12, atol=1e-13)

"""Pure-JAX numerical core: no NumPyro below this line."""

from numpyro_dgp.core.amortized import affine_inducing_inputs, local_conditional, local_kl
from numpyro_dgp.core.conditionals import conditional, project
from numpyro_dgp.core.kl import gauss_kl
from numpyro_dgp.core.kmeans import kmeans
from numpyro_dgp.core.linalg import (
    check_jitter,
    default_jitter,
    cholesky,
    jittered_cholesky,
    robust_cholesky,
    triangular_inverse,
)
from numpyro_dgp.core.sde import euler_maruyama
from numpyro_dgp.core.quadrature import (
    expected_log_normal,
    gauss_hermite,
    gauss_hermite_product,
)

__all__ = [
    "affine_inducing_inputs",
    "local_conditional",
    "local_kl",
    "check_jitter",
    "conditional",
    "default_jitter",
    "euler_maruyama",
    "expected_log_normal",
    "gauss_hermite",
    "gauss_hermite_product",
    "gauss_kl",
    "cholesky",
    "jittered_cholesky",
    "kmeans",
    "project",
    "robust_cholesky",
    "triangular_inverse",
]

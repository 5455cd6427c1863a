"""Pure-JAX numerical core of numpyro-dgp: no NumPyro below this line.

Kernels' matrices go in, Gaussian moments and divergences come out: jittered Cholesky
factors and triangular inverses, the sparse GP conditional (whitened or not; marginal
variances without ``N x N`` matrices), Gaussian KL divergences, the per-point recursion for
guides that correlate layers, Gauss-Hermite rules, k-means, Euler-Maruyama, the
per-point conditionals of amortized inducing sets, standard-normal draws laid out as XLA's
CPU generator runs fastest, psi statistics (kernel expectations under Gaussian inputs) and the
layer moments they give, and the collapsed one-layer sparse GP (FITC, VFE). Every function is
tested against dense linear algebra (or Monte Carlo, for expectations) in float64.
"""

from numpyro_dgp.core._amortized import affine_inducing_inputs, local_conditional, local_kl
from numpyro_dgp.core._chain import (
    Belief,
    BlockBelief,
    block_diag_covariance,
    chain_cross,
    chain_gauss_kl_term,
    condition_on_output,
    output_at_nodes,
    output_moments,
    point_projection,
    sample_output,
)
from numpyro_dgp.core._conditionals import conditional, factors_transpose_times, project
from numpyro_dgp.core._kl import gauss_kl
from numpyro_dgp.core._kmeans import kmeans
from numpyro_dgp.core._psi import expected_input_kernel, psi0, psi1, psi2, psi2_traces
from numpyro_dgp.core._quadrature import expected_log_normal, gauss_hermite, gauss_hermite_product
from numpyro_dgp.core._sde import euler_maruyama, standard_normal
from numpyro_dgp.core._sparse import COLLAPSED_METHODS, collapsed_log_marginal, collapsed_posterior
from numpyro_dgp.core._triangular import (
    check_jitter,
    cholesky,
    cholesky_and_inverse,
    default_jitter,
    inverse_cholesky,
    jittered_cholesky,
    robust_cholesky,
    triangular_inverse,
)
from numpyro_dgp.core._uncertain import UncertainInputMoments, uncertain_input_moments
from numpyro_dgp.core._vecchia import (
    VecchiaFactors,
    nearest_previous_neighbors,
    vecchia_factors,
    vecchia_log_density,
    vecchia_sample,
)

__all__ = [
    "Belief",
    "BlockBelief",
    "COLLAPSED_METHODS",
    "UncertainInputMoments",
    "VecchiaFactors",
    "affine_inducing_inputs",
    "block_diag_covariance",
    "chain_cross",
    "chain_gauss_kl_term",
    "check_jitter",
    "cholesky",
    "cholesky_and_inverse",
    "collapsed_log_marginal",
    "collapsed_posterior",
    "condition_on_output",
    "conditional",
    "default_jitter",
    "euler_maruyama",
    "expected_input_kernel",
    "expected_log_normal",
    "factors_transpose_times",
    "gauss_hermite",
    "gauss_hermite_product",
    "gauss_kl",
    "inverse_cholesky",
    "jittered_cholesky",
    "kmeans",
    "local_conditional",
    "local_kl",
    "nearest_previous_neighbors",
    "output_at_nodes",
    "output_moments",
    "point_projection",
    "project",
    "psi0",
    "psi1",
    "psi2",
    "psi2_traces",
    "robust_cholesky",
    "sample_output",
    "standard_normal",
    "triangular_inverse",
    "uncertain_input_moments",
    "vecchia_factors",
    "vecchia_log_density",
    "vecchia_sample",
]

"""Objectives for models built with :func:`~numpyro_dgp.gp_layer`.

* :class:`DGPElbo` -- the DSVI evidence lower bound with the inducing values integrated out
  analytically (same bound as NumPyro's ``Trace_ELBO``, lower-variance estimator);
* :class:`PredictiveObjective` -- the predictive (DSPP / PPGPR) objective of Jankowiak et al.
  (2020), not a bound on the evidence;
* :class:`ImportanceWeightedElbo` -- the importance-weighted bound of Salimbeni et al. (2019)
  for DGPs with latent inputs (:func:`~numpyro_dgp.latent_input`);
* :class:`NestedCompressionElbo` -- the nested variational compression bound of Hensman &
  Lawrence (2014): Gaussian moments propagated through the layers by psi statistics, no
  sampling, for DGPs with noisy inner layers and a Gaussian likelihood;
* :class:`CollapsedSparseGP` -- one layer with a Gaussian likelihood and ``q(u)`` integrated
  out: Titsias' (2009) VFE bound or the FITC marginal likelihood (Snelson & Ghahramani 2006,
  not a bound).

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
* Jankowiak, Pleiss, Gardner (2020). Deep sigma point processes. UAI.
* Salimbeni, Dutordoir, Hensman, Deisenroth (2019). Deep Gaussian processes with
  importance-weighted variational inference. ICML.
* Hensman, Lawrence (2014). Nested variational compression in deep Gaussian processes.
  arXiv:1412.1370.
* Titsias (2009). Variational learning of inducing variables in sparse Gaussian processes.
  AISTATS.
* Snelson, Ghahramani (2006). Sparse Gaussian processes using pseudo-inputs. NIPS.
"""

from numpyro_dgp.objectives._collapsed import CollapsedSparseGP, NestedCompressionElbo
from numpyro_dgp.objectives._dsvi import DGPElbo, PredictiveObjective
from numpyro_dgp.objectives._importance import ImportanceWeightedElbo

__all__ = [
    "CollapsedSparseGP",
    "DGPElbo",
    "ImportanceWeightedElbo",
    "NestedCompressionElbo",
    "PredictiveObjective",
]

# The classes live in private modules; their public home is this module (as it was when it was
# one file): documentation, reprs and pickles name them numpyro_dgp.objectives.<Class>.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name

"""Effect handlers that reinterpret a DGP's ``gp_layer`` calls.

Wrap the model (``handler(model, ...)``) and run it with anything NumPyro runs: ``SVI``,
``MCMC``, ``Predictive``, or this package's :func:`~numpyro_dgp.fit` and
:func:`~numpyro_dgp.predict`. Handlers compose with NumPyro's own.

Training:

* :class:`fast_subsample` -- plate minibatches drawn with one ``top_k`` instead of a
  sequential shuffle;
* :class:`data_parallel` -- the data plate's points sharded over devices.

Evaluation:

* :class:`coherent_layers` -- each layer drawn jointly over its input points (smooth
  function samples for plots);
* :class:`layer_inputs` -- chosen layers evaluated at inputs you give (each layer as a
  function of its own input).

MCMC on the same model:

* :class:`exact_layers` -- no inducing points: every layer output is a latent site with the
  full GP prior (NUTS samples the exact DGP);
* :class:`latent_conditionals` -- the sparse model: inducing values and layer outputs given
  them latent;
* :class:`vecchia_layers` -- the exact DGP with each layer's prior in its Vecchia
  approximation (``O(n m^3)``): MCMC ground truth at thousands of points;
* :class:`collapse_last_layer` -- the last layer integrated out given its inducing values
  (the likelihood of Havasi et al. 2018).

Other inference schemes:

* :class:`sde_flow` -- a layer becomes the vector field of an SDE flow (DiffGP);
* :class:`quadrature` -- weighted branches at learned quadrature points through the inner
  layers (AR2P for any guide).
"""

from numpyro_dgp.handlers._base import PerRunMessenger as PerRunMessenger
from numpyro_dgp.handlers._base import SpreadTotal as SpreadTotal
from numpyro_dgp.handlers._base import check_layer_supported as check_layer_supported
from numpyro_dgp.handlers._base import (
    coherent_layers,
    data_parallel,
    fast_subsample,
    layer_inputs,
    quadrature,
)
from numpyro_dgp.handlers._base import gaussian_observation as gaussian_observation
from numpyro_dgp.handlers._base import replace_observation as replace_observation
from numpyro_dgp.handlers._mcmc import (
    PARAMETERIZATIONS,
    collapse_last_layer,
    exact_layers,
    latent_conditionals,
)
from numpyro_dgp.handlers._sde_flow import FLOW_ESTIMATORS, FlowSpec, sde_flow
from numpyro_dgp.handlers._vecchia import ORDERINGS, vecchia_layers

__all__ = [
    "FLOW_ESTIMATORS",
    "PARAMETERIZATIONS",
    "FlowSpec",
    "ORDERINGS",
    "coherent_layers",
    "collapse_last_layer",
    "data_parallel",
    "exact_layers",
    "fast_subsample",
    "latent_conditionals",
    "layer_inputs",
    "quadrature",
    "sde_flow",
    "vecchia_layers",
]

"""``AutoFactorizedDGP``: independent Gaussians over each layer's inducing values (DSVI).

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Any

import jax
import jax.numpy as jnp
import numpyro
from jax.scipy.special import ndtri
from jax.typing import ArrayLike

from numpyro_dgp._compat import softplus_lower_cholesky
from numpyro_dgp.guides._base import DGPGuide, InducingSite
from numpyro_dgp.posteriors import CholeskyNormal


class AutoFactorizedDGP(DGPGuide):
    """Doubly stochastic variational inference's guide (Salimbeni & Deisenroth 2017).

    ``q(u) = prod_l prod_p N(u_lp | m_lp, S_lp)`` with a full Cholesky factor per layer and
    output. Its Gaussian is read off the guide trace by :class:`numpyro_dgp.DGPElbo`, which
    marginalizes the inducing values; with NumPyro's ``Trace_ELBO`` the values are sampled
    (as :class:`~numpyro_dgp.posteriors.CholeskyNormal`: the log-density of a draw needs no
    solve against the factor, so a near-deterministic inner layer cannot overflow it).

    :param model: a NumPyro model built with :func:`numpyro_dgp.gp_layer`.
    :param inner_init: ``"deterministic"`` (inner layers start with ``sqrt(S) = init_scale``
        times the prior factor, the DSVI convention) or ``"prior"`` (every layer starts at
        its prior). The last layer always starts at its prior.
    :param init_scale: the factor for ``"deterministic"`` (default ``1e-5``).
    :param prefix: parameter-name prefix; parameters are ``"<site>_<prefix>_loc"`` and
        ``"<site>_<prefix>_scale_tril"``.
    """

    def _q(
        self, site: InducingSite, rng_key: jax.Array | None, args: tuple, kwargs: dict
    ) -> tuple[jax.Array, jax.Array]:
        """The parameters of ``q(u)`` for one inducing site: ``loc (P, M)``,
        ``scale_tril (P, M, M)`` (starting, when they are created, from the prior at
        initialization)."""
        # computed once, when the first parameter is created
        prior = cache(partial(self._prior_moments, site, rng_key, args, kwargs))
        loc = self._lazy_param(f"{site.name}_{self.prefix}_loc", lambda: prior()[0])
        scale_tril = self._lazy_param(
            f"{site.name}_{self.prefix}_scale_tril",
            lambda: self._initial_scale_tril(site, prior()[1]),
            constraint=softplus_lower_cholesky,
        )
        return loc, scale_tril

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, jax.Array]:
        """Sample every latent site of the model (the guide as a NumPyro program)."""
        rng_key = self._prepare(*args, **kwargs)
        result = dict(self._sample_others(*args, **kwargs))
        for site in self.inducing_sites:
            loc, scale_tril = self._q(site, rng_key, args, kwargs)
            result[site.name] = numpyro.sample(
                site.name, CholeskyNormal(loc, scale_tril).to_event(1)
            )
        return result

    def median(self, params: dict) -> dict[str, jax.Array]:
        """Posterior medians: the means ``m`` of the inducing values (and AutoNormal's for others).

        :param params: the guide's parameter values.
        :return: ``{site: value}``, ``(P, M)`` per inducing site.
        """
        out = self._other_median(params)
        for site in self.inducing_sites:
            out[site.name] = params[f"{site.name}_{self.prefix}_loc"]
        return out

    def quantiles(self, params: dict, quantiles: ArrayLike) -> dict[str, jax.Array]:
        """Marginal quantiles ``m + z_q sqrt(diag S)``.

        :param params: the guide's parameter values.
        :param quantiles: ``(Q,)`` probabilities.
        :return: ``{site: value}``, ``(Q, P, M)`` per inducing site.
        """
        quantiles = jnp.asarray(quantiles)
        out = self._other_quantiles(params, quantiles)
        for site in self.inducing_sites:
            loc = params[f"{site.name}_{self.prefix}_loc"]
            tril = params[f"{site.name}_{self.prefix}_scale_tril"]
            std = jnp.sqrt(jnp.sum(tril**2, axis=-1))
            out[site.name] = loc + ndtri(quantiles).reshape((-1, 1, 1)) * std
        return out

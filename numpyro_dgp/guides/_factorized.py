"""``AutoFactorizedDGP``: independent Gaussians over each layer's inducing values (DSVI).

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
"""

from __future__ import annotations

from functools import cache, partial

import jax
import jax.numpy as jnp
import numpyro

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

    def _sample_inducing(self, rng_key: jax.Array | None, args: tuple, kwargs: dict) -> dict:
        return {s.name: self._sample_site(s, rng_key, args, kwargs) for s in self.inducing_sites}

    def _sample_site(
        self, site: InducingSite, rng_key: jax.Array | None, args: tuple, kwargs: dict
    ) -> jax.Array:
        loc, scale_tril = self._q(site, rng_key, args, kwargs)
        return numpyro.sample(site.name, CholeskyNormal(loc, scale_tril).to_event(1))

    def _locs(self, params: dict) -> dict[str, jax.Array]:
        return {s.name: params[f"{s.name}_{self.prefix}_loc"] for s in self.inducing_sites}

    def _stds(self, params: dict) -> dict[str, jax.Array]:
        """``sqrt(diag S)`` per site."""
        out = {}
        for site in self.inducing_sites:
            tril = params[f"{site.name}_{self.prefix}_scale_tril"]
            out[site.name] = jnp.sqrt(jnp.sum(tril**2, axis=-1))
        return out

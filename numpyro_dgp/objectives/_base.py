"""The objectives' base: an objective is its :meth:`~Objective.components` and one
:meth:`~Objective.combine` step; the loss NumPyro's ``SVI`` reads is written once, here."""

from __future__ import annotations

from typing import Any, Callable

import jax
from numpyro.infer import ELBO

__all__ = ["Objective"]


class Objective(ELBO):
    """A NumPyro ``ELBO`` whose value is ``combine(components(...))``, averaged over particles
    by :meth:`average_particles`. A new objective writes the two methods (and
    ``average_particles`` where it draws particles outside its components)."""

    def components(
        self,
        rng_key: jax.Array,
        param_map: dict,
        model: Callable,
        guide: Callable,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, jax.Array | float]:
        """The objective's named terms for one particle."""
        raise NotImplementedError

    def combine(self, parts: dict[str, Any]) -> jax.Array:
        """The objective from :meth:`components`' terms."""
        raise NotImplementedError

    def average_particles(
        self, one_particle: Callable[[jax.Array], jax.Array], rng_key: jax.Array
    ) -> jax.Array:
        """The objective averaged over particles: ``one_particle(rng_key)``, for objectives whose
        components draw their particles themselves."""
        return one_particle(rng_key)

    def loss_with_mutable_state(
        self,
        rng_key: jax.Array,
        param_map: dict,
        model: Callable,
        guide: Callable,
        *args: Any,
        **kwargs: Any,
    ) -> dict:
        """The negative objective (NumPyro's ``ELBO`` interface).

        :return: ``{"loss": -objective, "mutable_state": None}``.
        """

        def one_particle(key: jax.Array) -> jax.Array:
            return self.combine(self.components(key, param_map, model, guide, *args, **kwargs))

        return {"loss": -self.average_particles(one_particle, rng_key), "mutable_state": None}

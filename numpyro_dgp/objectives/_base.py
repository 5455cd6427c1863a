"""The objectives' base: an objective is its terms for one particle (``_terms``,
read through :meth:`~Objective.components`) and one :meth:`~Objective.combine` step; the
loss NumPyro's ``SVI`` reads and the average over particles are written once, here."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from numpyro.infer import ELBO


class Call(NamedTuple):
    """What an objective is evaluated at: the model and the guide, the parameter values
    ``{name: value}``, a PRNG key, and the model's and guide's positional and keyword arguments
    (in the order the engine's runs take them)."""

    model: Callable
    guide: Callable
    param_map: dict
    rng_key: jax.Array
    args: tuple
    kwargs: dict


class Objective(ELBO):
    """A NumPyro ``ELBO`` whose value is ``combine(components(...))``, averaged over particles
    by :meth:`average_particles`. A new objective writes ``_terms`` and :meth:`combine`
    (and ``average_particles`` where it draws its particles otherwise)."""

    def components(
        self,
        rng_key: jax.Array,
        param_map: dict,
        model: Callable,
        guide: Callable,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, jax.Array | float]:
        """The objective's named terms for one particle (the terms :meth:`combine` names).

        :param rng_key: PRNG key.
        :param param_map: parameter values ``{name: value}``.
        :param model: the model.
        :param guide: the guide.
        :param args: the model's and guide's positional arguments.
        :param kwargs: their keyword arguments.
        :return: ``{term: value}``.
        :raises ValueError: for a model or guide the objective does not take (naming why).
        """
        return self._terms(Call(model, guide, param_map, rng_key, args, kwargs))

    def _terms(self, call: Call) -> dict[str, jax.Array | float]:
        """:meth:`components` at ``call``."""
        raise NotImplementedError

    def combine(self, parts: dict[str, Any]) -> jax.Array:
        """The objective from :meth:`components`' terms."""
        raise NotImplementedError

    def average_particles(
        self, one_particle: Callable[[jax.Array], jax.Array], rng_key: jax.Array
    ) -> jax.Array:
        """The objective averaged over ``num_particles`` independent keys (one particle: the
        objective at ``rng_key`` itself)."""
        if self.num_particles == 1:
            return one_particle(rng_key)
        keys = jax.random.split(rng_key, self.num_particles)
        return jnp.mean(self.vectorize_particles_fn(one_particle, keys))

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

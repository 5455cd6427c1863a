"""Elliptical slice sampling of a DGP's whitened layer outputs (an MCMC kernel).

Elliptical slice sampling (Murray, Adams & MacKay 2010) samples ``p(z | data)`` for a
standard-normal prior ``z ~ N(0, I)`` with no tuning and no gradients: each step draws
``nu ~ N(0, I)``, a level under the current likelihood, and shrinks a bracket of angles on the
ellipse ``z cos(t) + nu sin(t)`` until a point is above the level. Under
:class:`~numpyro_dgp.handlers.exact_layers` or :class:`~numpyro_dgp.handlers.vecchia_layers`
(``parameterization="noncentered"``), a DGP's latent sites are exactly such: the layers' white
noise ``"<name>.f_white"`` (and a collapsed layer's ``"<name>.grid_white"``). Sauer, Gramacy &
Higdon (2023) sample a DGP's latent layers so (their deepgp package), one layer at a time in
the centered parameterization; here all layers move together in the whitened one.

Note: NumPyro's ``numpyro.infer.ESS`` is *ensemble* slice sampling, a different method.

**References:**

* Murray, Adams, MacKay (2010). Elliptical slice sampling. AISTATS.
* Sauer, Gramacy, Higdon (2023). Active learning for deep Gaussian process surrogates.
  Technometrics.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.handlers import seed, trace
from numpyro.infer.initialization import init_to_sample
from numpyro.infer.mcmc import MCMCKernel
from numpyro.infer.util import initialize_model, log_density
from numpyro.util import identity, is_prng_key

from numpyro_dgp.posteriors import unwrap_distribution


class EllipticalSliceState(NamedTuple):
    """The state of an :class:`EllipticalSlice` chain.

    :ivar z: the latent values (every one standard normal a priori), keyed by site name.
    :ivar log_likelihood: ``log p(data, z) + |z|^2 / 2`` at ``z``: the log density less the
        standard-normal prior's (up to its constant ``d log(2 pi) / 2``).
    :ivar num_evaluations: likelihood evaluations the last step took (1 + the bracket's
        shrinks; at most ``1 + MAX_SHRINKS``, after which the step keeps the current state).
    :ivar rng_key: the chain's key.
    """

    z: dict[str, jax.Array]
    log_likelihood: jax.Array
    num_evaluations: jax.Array
    rng_key: jax.Array


class ChainKernel(MCMCKernel):
    """What the library's MCMC kernels share: the model and its initialization strategy,
    NumPyro's initialization (``initialize_model``: the starting values and the postprocessing
    of samples) and one chain, or a batch of chains stepped as one program (a batch of keys at
    ``init``: ``chain_method="vectorized"``). A kernel defines ``_start`` and ``_chain_step``."""

    def __init__(self, model: Callable, *, init_strategy: Callable = init_to_sample) -> None:
        #: the NumPyro model being sampled
        self.model = model
        self._init_strategy = init_strategy
        self._postprocess_fn: Callable | None = None
        self._vectorized = False

    def postprocess_fn(self, model_args: tuple, model_kwargs: dict | None) -> Callable:
        """The function mapping a collected sample to constrained values (latent sites by their
        supports, ``numpyro.param`` sites by their constraints, and ``numpyro.deterministic``
        sites recomputed by replaying the model).

        :param model_args: the model's positional arguments.
        :param model_kwargs: the model's keyword arguments.
        :return: the function (the identity before ``init``).
        """
        if self._postprocess_fn is None:
            return identity
        return self._postprocess_fn(*model_args, **(model_kwargs or {}))

    def init(
        self,
        rng_key: jax.Array,
        num_warmup: int,
        init_params: dict | None = None,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
    ) -> Any:
        """Check the model and build the initial state.

        :param rng_key: PRNG key; with ``chain_method="vectorized"`` one per chain.
        :param num_warmup: warmup (burn-in) steps.
        :param init_params: initial unconstrained latent values keyed by site name (default:
            from ``init_strategy``).
        :param model_args: the model's positional arguments.
        :param model_kwargs: the model's keyword arguments.
        :return: the initial state (a leading chain axis when vectorized).
        """
        self._vectorized = not is_prng_key(rng_key)
        keys = jax.vmap(jax.random.split)(rng_key if self._vectorized else rng_key[None])
        args = (num_warmup, init_params, model_args, model_kwargs or {})
        return self._start(keys[:, 0], keys[:, 1], *args)

    def sample(self, state: Any, model_args: tuple, model_kwargs: dict | None) -> Any:
        """One step of each chain.

        :param state: the current state (a leading chain axis when vectorized).
        :param model_args: the model's positional arguments.
        :param model_kwargs: the model's keyword arguments.
        :return: the next state.
        """
        step = partial(self._chain_step, model_args=model_args, model_kwargs=model_kwargs or {})
        return jax.vmap(step)(state) if self._vectorized else step(state)

    def _initialize(self, keys: jax.Array, model: Callable, model_args: tuple, kwargs: dict):
        """NumPyro's ``initialize_model`` of ``model`` from a batch of ``keys`` (one chain too:
        NumPyro's search for a start with a finite potential then runs compiled, where for a
        single key it checks the first start op by op); its ``(info, z)``, ``z`` of one chain
        without the batch axis."""
        info = initialize_model(
            keys,
            model,
            init_strategy=self._init_strategy,
            dynamic_args=True,
            model_args=model_args,
            model_kwargs=kwargs,
        )
        self._postprocess_fn = info.postprocess_fn
        return info, self._chains(info.param_info.z)

    def _chains(self, batch: Any) -> Any:
        """``batch`` (a leading chain axis), less that axis for one chain."""
        return batch if self._vectorized else jax.tree.map(lambda v: v[0], batch)

    #: ``_start(first_keys, second_keys, num_warmup, init_params, model_args, model_kwargs)``:
    #: the initial state; ``_chain_step(state, model_args, model_kwargs)``: one chain's step
    _start: Callable[..., Any]
    _chain_step: Callable[..., Any]


class EllipticalSlice(ChainKernel):
    """Elliptical slice sampling (Murray et al. 2010) of every latent site of a model whose
    latent sites all have a standard-normal prior.

    Use it on a DGP under :class:`~numpyro_dgp.handlers.exact_layers` or
    :class:`~numpyro_dgp.handlers.vecchia_layers` (non-centered, the default) with the kernel
    hyperparameters, noise and mean weights fixed (``numpyro.param`` values, or fitted ones
    given with ``numpyro.handlers.substitute``: the comparison of Ustyuzhaninov et al. 2020).
    With ``numpyro.infer.MCMC`` as any kernel: ``chain_method="vectorized"`` runs the chains
    as one program. No step size, mass matrix or gradient: warm-up only discards draws.

    Cost per step: ``num_evaluations`` model log densities (one, plus one per shrink of the
    angle bracket; a few on average), no gradients. It mixes slowly where the data pin the
    latent values far from the prior (many points, small noise): check the chains with
    :func:`numpyro_dgp.diagnostics.mcmc_health` and prefer NUTS where a gradient is
    affordable.

    :param model: the model (e.g. ``vecchia_layers(model)``).
    :param init_strategy: where chains start (default: a draw from the prior, so chains start
        dispersed).
    :raises ValueError: at ``init``, for a latent site whose prior is not a standard normal
        (named, with its distribution), a model with no latent site, or initial values where
        the log density is not finite.
    """

    #: the field collected as the sample
    sample_field = "z"
    #: the fields collected by default: the latent values and the evaluations per step
    default_fields = ("z", "num_evaluations")

    def get_diagnostics_str(self, state: EllipticalSliceState) -> str:
        """The progress-bar text, e.g. ``"loglik=-123.4, evals=3"``.

        :param state: the current state (one chain).
        :return: the text.
        """
        return f"loglik={float(state.log_likelihood):.4g}, evals={int(state.num_evaluations)}"

    def _start(self, first, second, num_warmup, init_params, model_args, model_kwargs):
        """The initial state, after checking that every latent site is standard normal."""
        info, z = self._initialize(first, self.model, model_args, model_kwargs)
        _check_standard_normal(info.model_trace)
        potential_gen = info.potential_fn

        def log_likelihood_gen(*args: Any, **kwargs: Any) -> Callable:
            potential = potential_gen(*args, **kwargs)
            return lambda z: -potential(z) + 0.5 * _squared_norm(z)

        self._log_likelihood_gen = log_likelihood_gen
        z = z if init_params is None else init_params
        log_likelihood = log_likelihood_gen(*model_args, **model_kwargs)
        value = jax.vmap(log_likelihood)(z) if self._vectorized else log_likelihood(z)
        if not bool(jnp.all(jnp.isfinite(value))):
            raise ValueError(
                "EllipticalSlice: the log density is not finite at the initial values; give "
                "init_params where it is (or another init_strategy)"
            )
        count = jnp.ones(second.shape[:1] if self._vectorized else (), jnp.int32)
        return EllipticalSliceState(z, value, count, self._chains(second))

    def _chain_step(self, state, model_args, model_kwargs):
        """One elliptical slice step (Murray et al. 2010, Figure 2) of one chain."""
        return _step(state, self._log_likelihood_gen(*model_args, **model_kwargs))


#: Bracket shrinks after which a step keeps the current state. Each shrink narrows the bracket
#: by a uniform factor, so 100 leave about 1e-43 of it; only a level above the current point's
#: own likelihood (round-off between the value kept and its recomputation) gets that far.
MAX_SHRINKS = 100


def _step(state: EllipticalSliceState, log_likelihood: Callable) -> EllipticalSliceState:
    """One elliptical slice step of one chain."""
    key, key_nu, key_level, key_angle = jax.random.split(state.rng_key, 4)
    nu = _normal_like(key_nu, state.z)
    level = state.log_likelihood + jnp.log(jax.random.uniform(key_level))
    angle = jax.random.uniform(key_angle, maxval=2 * math.pi)

    def on_ellipse(angle: jax.Array) -> dict:
        return jax.tree.map(lambda z, n: z * jnp.cos(angle) + n * jnp.sin(angle), state.z, nu)

    def rejected(carry: tuple) -> jax.Array:
        # a NaN likelihood is rejected too
        return ~(carry[1] > level) & (carry[4] <= MAX_SHRINKS)

    def shrink(carry: tuple) -> tuple:
        angle, _, low, high, count, key = carry
        low, high = jnp.where(angle < 0, angle, low), jnp.where(angle < 0, high, angle)
        key, key_angle = jax.random.split(key)
        angle = jax.random.uniform(key_angle, minval=low, maxval=high)
        return angle, log_likelihood(on_ellipse(angle)), low, high, count + 1, key

    first = log_likelihood(on_ellipse(angle))
    carry = (angle, first, angle - 2 * math.pi, angle, jnp.int32(1), key)
    angle, value, _, _, count, _ = jax.lax.while_loop(rejected, shrink, carry)
    accepted = value > level
    z = jax.tree.map(lambda new, old: jnp.where(accepted, new, old), on_ellipse(angle), state.z)
    return EllipticalSliceState(z, jnp.where(accepted, value, state.log_likelihood), count, key)


def elliptical_slice_gibbs(
    model: Callable, site_names: list[str], *args: Any, **kwargs: Any
) -> Callable:
    """A ``gibbs_fn`` for ``numpyro.infer.HMCGibbs``: one elliptical slice step of the
    standard-normal sites ``site_names`` given the others, so that NUTS samples the rest.

    For kernel hyperparameters sampled under priors (deepgp's way: Sauer et al. 2023 update
    them by Metropolis-Hastings between elliptical slice steps of the layers)::

        sites = ["h1.f_white", "h2.f_white"]
        kernel = HMCGibbs(NUTS(model), elliptical_slice_gibbs(model, sites, X, y), sites)

    Each step costs one log density more than :class:`EllipticalSlice`'s (the current
    values' likelihood given the new values of the other sites); where that is not finite,
    no point of the ellipse is accepted and the step keeps the current values.

    :param model: the model, as given to ``HMCGibbs``'s inner kernel.
    :param site_names: the sites to update (``HMCGibbs``'s ``gibbs_sites``), each with a
        standard-normal prior.
    :param args: the model's positional arguments (those given to ``MCMC.run``).
    :param kwargs: the model's keyword arguments.
    :return: ``gibbs_fn(rng_key, gibbs_sites, hmc_sites) -> gibbs_sites``.
    :raises ValueError: for a name that is not a latent site of the model, or a site whose
        prior is not a standard normal (checked by one run of the model, here).
    """
    model_trace = trace(seed(model, 0)).get_trace(*args, **kwargs)
    names = list(site_names)
    _check_standard_normal(model_trace, names, "elliptical_slice_gibbs")

    def gibbs_fn(rng_key: jax.Array, gibbs_sites: dict, hmc_sites: dict) -> dict:
        # HMCGibbs passes its arguments by these names. Every latent site is given, so the
        # seed only serves the layers' request for a key (no value is drawn).
        seeded = seed(model, rng_key)

        def log_likelihood(z: dict) -> jax.Array:
            values = {**hmc_sites, **z}
            return log_density(seeded, args, kwargs, values)[0] + 0.5 * _squared_norm(z)

        state = EllipticalSliceState(
            gibbs_sites, log_likelihood(gibbs_sites), jnp.int32(1), rng_key
        )
        return _step(state, log_likelihood).z

    return gibbs_fn


def _check_standard_normal(
    model_trace: dict, names: list[str] | None = None, caller: str = "EllipticalSlice"
) -> None:
    """Refuse latent sites (all, or those ``names``) whose prior is not ``N(0, 1)``
    elementwise."""
    latent = {
        name: site
        for name, site in model_trace.items()
        if site["type"] == "sample" and not site["is_observed"]
    }
    if not latent:
        raise ValueError(f"{caller}: the model has no latent sample sites to sample")
    missing = sorted(set(names or ()) - set(latent))
    if missing:
        raise ValueError(
            f"{caller}: {missing} are not latent sample sites of the model; it has {sorted(latent)}"
        )
    latent = latent if names is None else {name: latent[name] for name in names}
    for name, site in latent.items():
        base = unwrap_distribution(site["fn"])
        standard = isinstance(base, dist.Normal) and bool(
            jnp.all(base.loc == 0) & jnp.all(base.scale == 1)
        )
        if not standard:
            raise ValueError(
                f"{caller}: latent site {name!r} has prior {site['fn']}, not a standard "
                "normal; it samples only whitened sites (exact_layers or vecchia_layers with "
                "parameterization='noncentered'). Fix the site's value (numpyro.handlers."
                "substitute or condition), make it a numpyro.param, or sample it with NUTS"
            )


def _squared_norm(z: dict) -> jax.Array:
    return jnp.sum(jnp.stack([jnp.sum(v**2) for v in jax.tree.leaves(z)]))


def _normal_like(key: jax.Array, z: dict) -> dict:
    leaves, treedef = jax.tree.flatten(z)
    keys = jax.random.split(key, len(leaves))
    draws = [jax.random.normal(k, jnp.shape(v), jnp.result_type(v)) for k, v in zip(keys, leaves)]
    return jax.tree.unflatten(treedef, draws)

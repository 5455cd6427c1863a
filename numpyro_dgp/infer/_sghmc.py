"""Stochastic-gradient HMC with adaptive preconditioning and MW-MCEM hyperparameter learning.

:class:`SGHMC` is a NumPyro :class:`~numpyro.infer.mcmc.MCMCKernel` implementing the sampler of
Springenberg et al. (2016) in the form used by Havasi et al. (2018) ("sghmc_dgp") for deep GPs:

* the latent ``numpyro.sample`` sites are sampled with SGHMC in unconstrained space, using a
  (possibly minibatched, hence noisy) potential ``U`` (negative log joint; NumPyro's plate
  subsampling already scales the minibatch likelihood by ``N / B``, so ``U`` is unbiased);
* the model's ``numpyro.param`` sites (kernel hyperparameters, noise, inducing inputs...) are
  optimized by Moving-Window MCEM: after every step, one optimizer step on ``U(theta_w, params)``
  where ``theta_w`` is drawn uniformly from a window of the most recent latent samples.

Per step, elementwise over the flattened unconstrained latents ``theta`` (``D`` entries)::

    grad = dU/dtheta                                   # one minibatch estimate
    Minv = 1 / (sqrt(g2 + 1e-16) + 1e-16)              # preconditioner (frozen after warmup)
    eta  = step_size**2 / num_data
    v    = v - eta * Minv * grad - mdecay * v + Normal(0, 2 * eta * mdecay * Minv)
    theta = theta + v

This is sghmc_dgp's update written with ``U`` instead of the per-datapoint ``U / num_data``:
``step_size**2 * Minv * grad(U / N) == eta * Minv * grad(U)`` and its noise variance
``2 * (step_size / sqrt(N))**2 * mdecay * Minv == 2 * eta * mdecay * Minv``. During warmup the
moment estimates ``g, g2`` of ``grad / num_data`` and the window length ``xi`` adapt.

**References:**

* Springenberg, Klein, Falkner, Hutter (2016). Bayesian optimization with robust Bayesian
  neural networks. NeurIPS.
* Havasi, Hernández-Lobato, Murillo-Fuentes (2018). Inference in deep Gaussian processes
  using stochastic gradient Hamiltonian Monte Carlo. NeurIPS.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import random
from jax.flatten_util import ravel_pytree
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to
from numpyro.handlers import seed, substitute, trace
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import potential_energy, transform_fn

from numpyro_dgp._protocol import amortized_layer_names
from numpyro_dgp._validation import check_positive_int, check_positive_number, tree_all_finite
from numpyro_dgp.infer._elliptical import ChainKernel
from numpyro_dgp.infer._fit import select

# Regularizer of the moment estimates, as in the reference implementations.
_EPS = 1e-16


class SGHMCState(NamedTuple):
    """State of :class:`SGHMC` (one chain; ``chain_method="vectorized"`` adds a leading axis).

    :ivar i: ``()`` number of steps taken (warmup included).
    :ivar z: unconstrained latent values keyed by site name.
    :ivar momentum: ``(D,)`` momentum ``v`` over the flattened ``z`` (``D`` unconstrained
        latent entries).
    :ivar xi: ``(D,)`` window length of the preconditioner adaptation (warmup only).
    :ivar g: ``(D,)`` running first moment of ``grad U / num_data`` (warmup only).
    :ivar g2: ``(D,)`` running second moment of ``grad U / num_data`` (warmup only).
    :ivar params: unconstrained values of the model's ``numpyro.param`` sites.
    :ivar opt_state: state of the parameter optimizer (``()`` when parameters are not optimized).
    :ivar window: ``(window_size, D)`` ring buffer of recent flattened latent samples (MW-MCEM).
    :ivar window_count: ``()`` samples ever written to ``window`` (slot
        ``window_count % window_size`` is next).
    :ivar potential_energy: ``()`` minibatch estimate of ``U`` at the position before the
        last move (a by-product of the gradient; avoids a second evaluation).
    :ivar num_skipped: ``()`` steps rejected because the potential or a gradient was not finite.
    :ivar rng_key: PRNG key.

    The property :attr:`position` (``{**z, **params}``) is the MCMC sample field.
    """

    i: jax.Array
    z: dict
    momentum: jax.Array
    xi: jax.Array
    g: jax.Array
    g2: jax.Array
    params: dict
    opt_state: Any
    window: jax.Array
    window_count: jax.Array
    potential_energy: jax.Array
    num_skipped: jax.Array
    rng_key: jax.Array

    @property
    def position(self) -> dict:
        """Unconstrained latents and params together: the MCMC sample field.

        Keeping the params in the sample lets ``MCMC.get_samples()`` return the param value in
        force at every sample (constrained by :meth:`SGHMC.postprocess_fn`).
        """
        return {**self.z, **self.params}


def _inspect_model(model, init_strategy, rng_key, model_args, model_kwargs):
    """Latent site names, discrete latent site names and plate sizes of ``model``.

    Traced abstractly (``jax.eval_shape``): only static facts leave the trace, never values.
    """
    found = {}

    def run(key):
        tr = trace(substitute(seed(model, key), substitute_fn=init_strategy)).get_trace(
            *model_args, **model_kwargs
        )
        latent = [k for k, s in tr.items() if s["type"] == "sample" and not s["is_observed"]]
        found["latent"] = latent
        found["discrete"] = [k for k in latent if tr[k]["fn"].support.is_discrete]
        found["plates"] = [int(s["args"][0]) for s in tr.values() if s["type"] == "plate"]
        found["amortized"] = amortized_layer_names(tr)

    jax.eval_shape(run, rng_key)
    if found["amortized"]:
        # per-point inducing values at the training points say nothing about new points
        raise ValueError(
            f"SGHMC: layer(s) {found['amortized']} have per-point inducing sets "
            "(inducing='amortized'), which an encoder describes; MCMC samples global inducing "
            "values: use inducing='global'"
        )
    return found["latent"], found["discrete"], found["plates"]


class SGHMC(ChainKernel):
    """Adaptive SGHMC (Springenberg et al. 2016) with MW-MCEM parameter learning
    (Havasi et al. 2018).

    Use with :class:`numpyro.infer.MCMC`; warmup steps are the burn-in (preconditioner adaptation).
    ``mcmc.get_samples()`` contains, per sample, the constrained latent sites, the constrained
    ``numpyro.param`` values in force at that sample (so ``Predictive(model, samples)`` uses
    them, since ``substitute`` also replaces param sites), and any ``numpyro.deterministic``
    sites. The last values are ``{k: v[-1] for k, v in samples.items()}``.

    :param model: NumPyro model with continuous latent sites; minibatch with
        ``numpyro.plate(..., subsample_size=B)``. A fresh PRNG key is used for the model at
        every step (minibatch indices, sampled layer outputs).
    :param step_size: ``epsilon`` of sghmc_dgp (default 0.01); the update uses
        ``eta = step_size**2 / num_data``.
    :param mdecay: momentum decay (friction) per step, in ``(0, 1]`` (default 0.05).
    :param num_data: ``N`` scaling the step. Default: the (full) size of the model's largest
        ``numpyro.plate``, or 1 if it has none.
    :param param_optimizer: an optax optimizer for the unconstrained ``numpyro.param`` values
        (default ``optax.adam(0.01)``), minimizing ``U(theta_w, params) / num_data``
        with ``theta_w`` drawn from the window; ``None`` keeps the params at their initial values.
    :param window_size: number of recent latent samples kept for MW-MCEM (default 100).
    :param init_strategy: per-site initialization strategy (default ``init_to_uniform``).

    Notes:

    * The MCMC sample field is :attr:`SGHMCState.position` (latents and params, unconstrained);
      ``MCMC.run(init_params=...)`` takes unconstrained latent values keyed by site name, as
      for NUTS. Param initial values come from the model (``numpyro.param`` init values; use
      ``numpyro.handlers.substitute`` to change them).
    * ``numpyro.deterministic`` sites are recomputed per collected sample by replaying the
      model; a subsampled model is replayed on one fixed minibatch.
    * With ``num_chains > 1`` every chain optimizes its own copy of the params.
    * A step whose potential, latent gradient or param gradient is not finite is rejected
      whole (state kept, ``num_skipped`` incremented, shown in the progress bar).
    * ``potential_energy`` and ``num_skipped`` are collected besides the sample (arviz:
      ``sample_stats.lp``, ``sample_stats.num_skipped``); pass ``extra_fields`` to
      ``MCMC.run`` for more, e.g. ``("g2",)``.

    Example::

        kernel = SGHMC(model, step_size=0.01, param_optimizer=optax.adam(0.01))
        mcmc = MCMC(kernel, num_warmup=2000, num_samples=1000, thinning=10)
        mcmc.run(jax.random.key(0), X, y, batch_size=100)
        samples = mcmc.get_samples()  # latents, params and deterministic sites
        Predictive(model, samples)(jax.random.key(1), X_test)
    """

    def __init__(
        self,
        model: Callable,
        *,
        step_size: float = 0.01,
        mdecay: float = 0.05,
        num_data: int | None = None,
        param_optimizer: optax.GradientTransformation | None = optax.adam(0.01),
        window_size: int = 100,
        init_strategy: Callable = init_to_uniform,
    ) -> None:
        if model is None or not callable(model):
            raise ValueError(f"SGHMC: model must be a callable NumPyro model, got {model!r}")
        check_positive_number(step_size, "step_size", "SGHMC")
        if not 0 < mdecay <= 1:
            raise ValueError(f"SGHMC: mdecay must be in (0, 1], got {mdecay!r}")
        check_positive_int(window_size, "window_size", "SGHMC")
        check_positive_int(num_data, "num_data", "SGHMC", allow_none=True)
        super().__init__(model, init_strategy=init_strategy)
        self._step_size = float(step_size)
        self._mdecay = float(mdecay)
        self._num_data_arg = num_data
        self._optimizer = param_optimizer
        self._window_size = window_size
        #: ``N`` used to scale the step (known after ``init``; ``None`` before)
        self.num_data: int | None = None

    #: the field of :class:`SGHMCState` collected as the sample
    sample_field = "position"
    #: the fields collected by default: the position, the potential energy and the number of
    #: skipped steps
    default_fields = ("position", "potential_energy", "num_skipped")

    def get_diagnostics_str(self, state: SGHMCState) -> str:
        """The progress-bar text: the potential energy and the number of skipped steps.

        :param state: the current state (one chain).
        :return: e.g. ``"pe=123.4, skipped=0"``.
        """
        return "pe={:.4g}, skipped={}".format(float(state.potential_energy), int(state.num_skipped))

    def _start(self, chain_keys, init_keys, num_warmup, init_params, model_args, model_kwargs):
        """Validate the model, find ``num_data`` and the param sites, and build the initial
        state."""
        self._num_warmup = int(num_warmup)
        # Validate the model before initialize_model (which would try to enumerate discrete
        # sites); an abstract trace suffices and compiles nothing.
        latent, discrete, plate_sizes = _inspect_model(
            self.model, self._init_strategy, init_keys[0], model_args, model_kwargs
        )
        if discrete:
            raise ValueError(f"SGHMC: discrete latent sites are not supported: {discrete}")
        if not latent:
            raise ValueError("SGHMC: the model has no latent sample sites to sample")
        self.num_data = self._num_data_arg or max(plate_sizes, default=1)
        # The postprocess replay (deterministic sites) runs the model without a seed; give its
        # plate subsampling a fixed key (only plates: latents still get distinct init values).
        hide = ["sample", "prng_key", "control_flow"]
        plates_seeded = seed(self.model, rng_seed=0, hide_types=hide)
        info, z = self._initialize(init_keys, plates_seeded, model_args, model_kwargs)
        param_sites = {k: s for k, s in info.model_trace.items() if s["type"] == "param"}
        self._param_transforms = {
            k: biject_to(s["kwargs"].get("constraint", constraints.real))
            for k, s in param_sites.items()
        }
        values = {k: s["value"] for k, s in param_sites.items()}
        params = transform_fn(self._param_transforms, values, invert=True)
        # strongly typed, as a step's optimizer update returns them (a compiled step takes its
        # own output)
        params = jax.tree.map(lambda v: jnp.asarray(v, jnp.result_type(v)), params)
        z = z if init_params is None else init_params
        init_state = jax.jit(self._init_state)  # one compilation instead of many eager ops
        if self._vectorized:
            return jax.vmap(init_state, in_axes=(0, None, 0))(z, params, chain_keys)
        return init_state(z, params, chain_keys[0])

    # ------------------------------------------------------------------ internals
    def _init_state(self, z, params, rng_key):
        z_flat, _ = ravel_pytree(z)
        ones = jnp.ones_like(z_flat)
        opt_state = self._optimizer.init(params) if self._optimizer is not None and params else ()
        window = jnp.zeros((self._window_size,) + z_flat.shape, z_flat.dtype)
        # counters: int32, not a weakly typed int, so a step returns the state's own types
        # (an ahead-of-time compiled step refused its second call otherwise)
        zero = jnp.zeros((), jnp.int32)
        # zero initial momentum, as sghmc_dgp
        momentum, pe = jnp.zeros_like(z_flat), jnp.zeros((), z_flat.dtype)
        return SGHMCState(
            zero, z, momentum, ones, ones, ones, params, opt_state, window, zero, pe, zero, rng_key
        )

    def _potential(self, z, params, rng_key, model_args, model_kwargs):
        """``U(z; params)`` for unconstrained ``z`` and ``params``, with a given model key."""
        constrained = transform_fn(self._param_transforms, params)
        model = seed(substitute(self.model, data=constrained), rng_key)
        # potential_energy adds the log-Jacobians of constrained latents.
        return potential_energy(model, model_args, model_kwargs, z)

    def _chain_step(self, state: SGHMCState, model_args, model_kwargs) -> SGHMCState:
        rng_key, key_u, key_noise, key_win, key_opt = random.split(state.rng_key, 5)
        z_flat, unravel = ravel_pytree(state.z)
        dtype = z_flat.dtype
        n = self.num_data
        assert n is not None, "SGHMC.sample before init"  # init sets it
        eta, mdecay = self._step_size**2 / n, self._mdecay

        def u_flat(zf):
            return self._potential(unravel(zf), state.params, key_u, model_args, model_kwargs)

        pe, grad = jax.value_and_grad(u_flat)(z_flat)
        grad = grad.astype(dtype)

        # Preconditioner from the current (pre-update) moments; the adaptation below is a
        # simultaneous update from the old values, as in the reference implementations.
        minv = 1.0 / (jnp.sqrt(state.g2 + _EPS) + _EPS)
        grad_scaled = grad / n
        r = 1.0 / (state.xi + 1.0)
        adapted = (
            1.0 + state.xi * (1.0 - state.g * state.g / (state.g2 + _EPS)),
            (1.0 - r) * state.g + r * grad_scaled,
            (1.0 - r) * state.g2 + r * grad_scaled**2,
        )
        warmup = state.i < self._num_warmup
        xi, g, g2 = select(warmup, adapted, (state.xi, state.g, state.g2))

        noise_std = jnp.sqrt(jnp.maximum(2.0 * eta * mdecay * minv, _EPS))
        noise = noise_std * random.normal(key_noise, z_flat.shape, dtype)
        momentum = (state.momentum - eta * minv * grad - mdecay * state.momentum + noise).astype(
            dtype
        )
        z_new_flat = z_flat + momentum

        # MW-MCEM: store the new sample, then one optimizer step at a random window sample.
        window = state.window.at[state.window_count % self._window_size].set(z_new_flat)
        window_count = state.window_count + 1
        params, opt_state, ok_params = state.params, state.opt_state, jnp.array(True)
        if self._optimizer is not None and state.params:
            filled = jnp.minimum(window_count, self._window_size)
            z_w = unravel(window[random.randint(key_win, (), 0, filled)])

            def loss(p):
                return self._potential(z_w, p, key_opt, model_args, model_kwargs) / n

            p_grad = jax.grad(loss)(state.params)
            updates, opt_state = self._optimizer.update(p_grad, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
            ok_params = tree_all_finite(p_grad)

        z_new, pe = unravel(z_new_flat), pe.astype(dtype)
        proposed = state._replace(
            z=z_new, momentum=momentum, xi=xi, g=g, g2=g2, params=params, opt_state=opt_state
        )
        proposed = proposed._replace(window=window, window_count=window_count, potential_energy=pe)
        # Reject the whole step on a non-finite potential or gradient rather than poison the chain.
        ok = jnp.isfinite(pe) & tree_all_finite(grad) & ok_params
        new = select(ok, proposed, state)
        return new._replace(
            i=state.i + 1, num_skipped=state.num_skipped + (~ok).astype(jnp.int32), rng_key=rng_key
        )

"""Natural-gradient steps on the Gaussian ``q(u)`` of chosen layers, another optimizer on the rest.

For ``q(u_p) = N(m, S)`` (one per output ``p`` of a layer) with natural parameters
``theta = (S^-1 m, -S^-1 / 2)`` and expectation parameters ``eta = (m, S + m m^T)``, the
natural gradient of the loss with respect to ``theta`` is its ordinary gradient with respect
to ``eta``. One step is ``theta <- theta - gamma dL/deta``; ``dL/deta`` comes from the gradient
the objective gives for the guide's parameters ``(m, L)`` (``S = L L^T``) by the chain rule
through ``eta -> (m, chol(eta_2 - eta_1 eta_1^T))``, as GPflow's ``NaturalGradient`` computes it
(Salimbeni, Eleftheriadis & Hensman 2018). With a Gaussian likelihood and a one-layer model the
bound is a concave quadratic in ``eta`` of which ``theta`` is the linear coefficient, so one step
of size 1 lands on the optimal ``q(u)`` (Titsias' collapsed optimum).

**References:**

* Salimbeni, Eleftheriadis, Hensman (2018). Natural gradients in practice: non-conjugate
  variational inference in Gaussian process models. AISTATS.
* Hensman, Fusi, Lawrence (2013). Gaussian processes for big data. UAI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.distributions.transforms import biject_to
from numpyro.optim import optax_to_numpyro

from numpyro_dgp._compat import softplus_lower_cholesky
from numpyro_dgp._validation import check_positive_int, check_positive_number
from numpyro_dgp.core import cholesky, inverse_cholesky, triangular_inverse

if TYPE_CHECKING:
    from numpyro_dgp._compat import NumPyroOptimizer


class NaturalGradientState(NamedTuple):
    """State of :func:`natural_gradients`.

    :ivar count: steps taken (the argument of a step-size schedule).
    :ivar others: the other optimizer's state (over the parameters it updates).
    """

    # the field shadows tuple.count (optax names it so)
    count: jax.Array  # type: ignore[assignment]
    others: Any


def natural_gradient_ramp(
    initial: float = 1e-4, final: float = 0.1, num_steps: int = 5
) -> optax.Schedule:
    """A step size that grows log-linearly from ``initial`` to ``final`` over ``num_steps`` steps
    and stays there: natural-gradient steps on non-conjugate or deep models start small
    (Salimbeni et al. 2018 recommend such a ramp; large steps on inner layers are unstable).

    :param initial: the first step's size, ``> 0``.
    :param final: the size from step ``num_steps`` on, ``> 0``.
    :param num_steps: steps of the ramp, ``>= 1``.
    :return: an optax schedule (step count -> step size).
    :raises ValueError: for non-positive sizes or ``num_steps < 1``.
    """
    check_positive_number(initial, "initial", "natural_gradient_ramp")
    check_positive_number(final, "final", "natural_gradient_ramp")
    check_positive_int(num_steps, "num_steps", "natural_gradient_ramp")
    log_initial, log_final = np.log(float(initial)), np.log(float(final))

    def schedule(count: jax.Array) -> jax.Array:
        fraction = jnp.clip(count / num_steps, 0.0, 1.0)
        return jnp.exp(log_initial + fraction * (log_final - log_initial))

    return schedule


def _site_pairs(
    guide: Any, names: Sequence[str], layers: str | Sequence[str]
) -> list[tuple[str, str]]:
    """``(loc, scale_tril)`` parameter names of the inducing sites the natural gradient takes:
    those of ``layers`` (``"last"``, ``"all"`` or the model's layer names) of ``guide``, an
    :class:`~numpyro_dgp.guides.AutoFactorizedDGP` already set up, each present in ``names``
    (the parameters or gradients updated).

    :raises TypeError: for another guide.
    :raises ValueError: for a guide not set up, names that are not the model's layers, a layer
        with per-point inducing sets, or parameters without the chosen layers'.
    """
    from numpyro_dgp.guides import AutoFactorizedDGP  # a sibling package that imports the engine

    if not isinstance(guide, AutoFactorizedDGP):
        raise TypeError(
            "natural_gradients: the guide must be numpyro_dgp.guides.AutoFactorizedDGP (an "
            f"independent Gaussian per layer), got {type(guide).__name__}"
        )
    sites = guide.inducing_sites
    if not sites:
        raise ValueError(
            "natural_gradients: the guide has not been set up (svi.init or fit builds it before "
            "the optimizer)"
        )
    by_layer = {site.layer: site for site in sites}
    chosen = sites[-1:] if layers == "last" else list(sites)
    if layers not in ("last", "all"):  # natural_gradients refused any other string
        unknown = [name for name in layers if name not in by_layer]
        if unknown:
            raise ValueError(
                f"natural_gradients: layers must be 'last', 'all' or a list of the model's layers "
                f"{sorted(by_layer)}; got {layers!r}"
            )
        chosen = [by_layer[name] for name in layers]
    if any(site.inducing == "amortized" for site in chosen):
        raise ValueError(
            "natural_gradients: layers with per-point inducing sets have no global q(u)"
        )
    pairs = [
        (f"{site.name}_{guide.prefix}_loc", f"{site.name}_{guide.prefix}_scale_tril")
        for site in chosen
    ]
    missing = [name for pair in pairs for name in pair if name not in names]
    if missing:
        raise ValueError(
            f"natural_gradients: the parameters have no {missing} (another guide's parameters?)"
        )
    return pairs


def _natural_step(
    loc: jax.Array, tril_vec: jax.Array, grad_loc: jax.Array, grad_tril: jax.Array, step: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The new ``(loc, unconstrained scale_tril)`` of one layer's ``q(u)`` after a natural-gradient
    step of size ``step`` (every output ``p`` at once: ``loc (P, M)``)."""
    transform = biject_to(softplus_lower_cholesky)
    L = transform(tril_vec)  # (P, M, M)
    eta1 = loc
    eta2 = L @ jnp.swapaxes(L, -1, -2) + loc[..., :, None] * loc[..., None, :]

    def to_parameters(eta1, eta2):
        covariance = eta2 - eta1[..., :, None] * eta1[..., None, :]
        return eta1, transform.inv(cholesky(0.5 * (covariance + jnp.swapaxes(covariance, -1, -2))))

    _, pullback = jax.vjp(to_parameters, eta1, eta2)
    grad_eta1, grad_eta2 = pullback((grad_loc, grad_tril))
    grad_eta2 = 0.5 * (grad_eta2 + jnp.swapaxes(grad_eta2, -1, -2))
    L_inv = triangular_inverse(L)
    precision = jnp.swapaxes(L_inv, -1, -2) @ L_inv  # S^-1
    theta1 = precision @ loc[..., None] - step * grad_eta1[..., None]
    new_precision = precision + 2 * step * grad_eta2  # -2 theta2
    # the library's factorization, which builds the inverse beside the factor: matrix products
    # that do not compete with XLA's threads as LAPACK's calls do inside a step
    precision_inv = inverse_cholesky(new_precision)
    covariance = jnp.swapaxes(precision_inv, -1, -2) @ precision_inv
    new_loc = (covariance @ theta1)[..., 0]
    return new_loc, transform.inv(cholesky(covariance))


def natural_gradients(
    guide: Any,
    others: optax.GradientTransformation | None = None,
    step_size: float | optax.Schedule = 1.0,
    layers: str | Sequence[str] = "last",
) -> NumPyroOptimizer:
    """An optimizer for ``numpyro.infer.SVI`` (and :func:`~numpyro_dgp.fit`): natural-gradient
    steps on the Gaussian ``q(u)`` of the chosen layers of an
    :class:`~numpyro_dgp.guides.AutoFactorizedDGP`, ``others`` (default Adam, 0.01) on every
    other parameter, from the same gradient.

    ::

        optimizer = dgp.infer.natural_gradients(guide, optax.adam(0.01), step_size=0.1)
        svi = SVI(model, guide, optimizer, dgp.DGPElbo())

    A step that makes a covariance indefinite (too large a step on a noisy gradient) gives NaN
    parameters, which :func:`~numpyro_dgp.fit` does not apply (it counts the step as skipped).

    :param guide: the ``AutoFactorizedDGP`` being fitted (its layers are read when the optimizer
        is initialized, after the guide is set up).
    :param others: the optax transformation of the other parameters (kernel hyperparameters,
        inducing inputs, noise, inner layers' ``q(u)`` with ``layers="last"``).
    :param step_size: the natural-gradient step ``gamma``, a number or an optax schedule (e.g.
        :func:`natural_gradient_ramp`); 1 is exact for a one-layer Gaussian model.
    :param layers: ``"last"`` (the output layer: the common choice, natural gradients on inner
        layers are known to be unstable), ``"all"``, or a list of layer names.
    :return: a NumPyro optimizer (``numpyro.optim.optax_to_numpyro`` of the combined
        transformation).
    :raises TypeError: another guide (at initialization).
    :raises ValueError: unknown layers, or layers with per-point inducing sets.
    """
    if not callable(step_size) and not float(step_size) > 0:
        raise ValueError(f"natural_gradients: step_size must be positive, got {step_size!r}")
    if not (layers in ("last", "all") or (not isinstance(layers, str) and len(layers) > 0)):
        raise ValueError(
            "natural_gradients: layers must be 'last', 'all' or a list of layer names, "
            f"got {layers!r}"
        )
    others = optax.adam(0.01) if others is None else others
    schedule: Callable = step_size if callable(step_size) else (lambda count: step_size)

    def split(tree: dict, pairs: list) -> dict:
        taken = {name for pair in pairs for name in pair}
        return {k: v for k, v in tree.items() if k not in taken}

    def init(params: dict) -> NaturalGradientState:
        pairs = _site_pairs(guide, list(params), layers)
        return NaturalGradientState(jnp.zeros((), jnp.int32), others.init(split(params, pairs)))

    def update(
        grads: dict, state: NaturalGradientState, params: dict
    ) -> tuple[dict, NaturalGradientState]:
        # NumPyro's optimizer always passes the current params (the natural step needs q(u))
        pairs = _site_pairs(guide, list(grads), layers)
        rest = split(params, pairs)
        rest_updates, rest_state = others.update(split(grads, pairs), state.others, rest)
        updates = dict(rest_updates)
        step = jnp.asarray(schedule(state.count))
        for loc_name, tril_name in pairs:
            loc, tril = params[loc_name], params[tril_name]
            new_loc, new_tril = _natural_step(
                loc, tril, grads[loc_name], grads[tril_name], step.astype(loc.dtype)
            )
            updates[loc_name], updates[tril_name] = new_loc - loc, new_tril - tril
        return updates, NaturalGradientState(state.count + 1, rest_state)

    return optax_to_numpyro(optax.GradientTransformation(init, update))

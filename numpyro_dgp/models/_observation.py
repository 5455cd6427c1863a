"""The factories' observation site (:class:`Observation`): the likelihood, the shape of the
targets and their checks."""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.typing import ArrayLike
from numpyro.distributions import constraints

from numpyro_dgp._compat import distribution_validation_enabled
from numpyro_dgp._validation import (
    as_float_array,
    check_choice,
    check_finite,
    check_positive_int,
    concrete,
    warn_if_target_not_standardized,
)

__all__ = ["LIKELIHOODS", "MISSING_TARGETS", "Observation", "validated_normal"]

#: The factories' likelihoods: the last layer's width per target column and what ``y`` holds
#: (:mod:`numpyro_dgp.likelihoods`).
LIKELIHOODS = (
    "gaussian",
    "probit",
    "softmax",
    "robust_max",
    "student_t",
    "poisson",
    "negative_binomial",
    "heteroscedastic",
)
#: likelihoods whose targets are class labels, and those whose targets are counts
_LABELS = ("probit", "softmax", "robust_max")
_COUNTS = ("poisson", "negative_binomial")
#: the values of ``missing_targets``
MISSING_TARGETS = ("raise", "mask")


class Observation(NamedTuple):
    """A factory's observation site: the likelihood and the shape of its targets.

    :ivar likelihood: one of :data:`LIKELIHOODS`.
    :ivar num_outputs: ``T``, target columns (``y`` is ``(N,)`` for one, ``(N, T)``).
    :ivar num_classes: ``C`` for ``"softmax"`` and ``"robust_max"``.
    :ivar noise_init: initial noise variance (``"gaussian"``; ``"student_t"``: the squared scale).
    :ivar missing_targets: ``"raise"`` (NaN targets are refused) or ``"mask"`` (entries of
        ``y`` that are NaN are left out of the likelihood).
    """

    likelihood: str = "gaussian"
    num_outputs: int = 1
    num_classes: int | None = None
    noise_init: float = 0.01
    missing_targets: str = "raise"

    @property
    def continuous(self) -> bool:
        """Whether the targets are real numbers (not class labels or counts)."""
        return self.likelihood not in _LABELS + _COUNTS

    @property
    def width(self) -> int:
        """The last layer's number of outputs."""
        if self.likelihood in ("softmax", "robust_max"):
            return int(cast(int, self.num_classes))  # given for these likelihoods (see check)
        return 2 * self.num_outputs if self.likelihood == "heteroscedastic" else self.num_outputs

    def check(self, caller: str) -> None:
        """Check the options when the model is built (naming the argument).

        :raises NotImplementedError: an unknown likelihood.
        :raises ValueError: a bad ``num_outputs``, ``num_classes`` or ``missing_targets``.
        """
        check_choice(self.likelihood, LIKELIHOODS, "likelihood", caller, error=NotImplementedError)
        check_positive_int(self.num_outputs, "num_outputs", caller)
        _check_classes(self, caller)
        check_choice(self.missing_targets, MISSING_TARGETS, "missing_targets", caller)

    def targets(
        self, y: ArrayLike | None, num_points: int, dtype: Any, caller: str
    ) -> jax.Array | None:
        """``y`` at the door: ``(N,)`` (``(N, 1)`` squeezed) or ``(N, T)``; continuous targets cast
        to ``dtype`` (and, when concrete, a :class:`~numpyro_dgp.TargetScaleWarning` if far from
        standardized); NaN or infinities refused (naming ``y``; NaN entries pass when masked);
        concrete labels and counts checked.

        :raises ValueError: for another shape, non-finite values or invalid labels or counts.
        """
        if y is None:
            return None
        value = concrete(y) if self.continuous else None  # before the cast: NumPy targets too
        if value is not None:
            warn_if_target_not_standardized(np.asarray(value, np.float64), "y", caller, 5)
        y = jnp.asarray(y)
        T = self.num_outputs
        expected = (num_points,) if T == 1 else (num_points, T)
        if T == 1 and y.shape == (num_points, 1):
            y = y[:, 0]
        if y.shape != expected:
            also = f" (or ({num_points}, 1))" if T == 1 else ""
            raise ValueError(
                f"{caller}: y must have shape {expected}{also} to match the {num_points} input "
                f"points of X{'' if T == 1 else f' and its {T} target columns'}, got shape "
                f"{tuple(y.shape)}"
            )
        masked = self.missing_targets == "mask"
        if self.continuous or masked:
            y = as_float_array(y, "y", caller).astype(dtype)
        if not masked:
            check_finite(y, "y", caller)
        elif (value := concrete(y)) is not None and np.isinf(value).any():
            raise ValueError(
                f"{caller}: y contains infinite values (NaN entries are masked, infinities are not)"
            )
        if not self.continuous:
            _check_discrete_targets(y, self, caller)
        return y

    def observe(self, f: jax.Array, y: jax.Array | None, data: Any, dtype: Any) -> None:
        """The observation site ``"y"`` in the plate ``data``, given the last layer's output
        ``f``."""
        fn = self._distribution(f, dtype)
        if y is not None and self.missing_targets == "mask":
            present = ~jnp.isnan(y)
            fn = fn.mask(present)
            y = jnp.where(present, y, 0.0)
            if self.likelihood in _LABELS + _COUNTS:
                y = y.astype(jnp.int32)
        if self.num_outputs > 1:
            fn = fn.to_event(1)
        with data:
            numpyro.sample("y", fn, obs=y)

    def _distribution(self, f: jax.Array, dtype: Any) -> dist.Distribution:
        from numpyro_dgp import likelihoods

        name = self.likelihood
        if name == "gaussian":
            noise = numpyro.param(
                "noise",
                jnp.full(self._noise_shape(), self.noise_init, dtype),
                constraint=constraints.positive,
            )
            loc = f[..., 0] if self.num_outputs == 1 else f
            return validated_normal(loc, jnp.sqrt(noise))
        if name == "probit":
            return likelihoods.bernoulli_probit(f[..., 0] if self.num_outputs == 1 else f)
        if name == "softmax":
            return likelihoods.softmax(f)
        if name == "robust_max":
            return likelihoods.robust_max(f)
        if name == "student_t":
            df = numpyro.param(
                "df",
                jnp.full(self._noise_shape(), 4.0, dtype),
                constraint=constraints.greater_than(1.0),
            )
            scale = numpyro.param(
                "scale",
                jnp.full(self._noise_shape(), np.sqrt(self.noise_init), dtype),
                constraint=constraints.positive,
            )
            return likelihoods.student_t(f, df, scale)
        if name == "poisson":
            return likelihoods.poisson(f)
        if name == "negative_binomial":
            concentration = numpyro.param(
                "concentration",
                jnp.ones(self._noise_shape(), dtype),
                constraint=constraints.positive,
            )
            return likelihoods.negative_binomial(f, concentration)
        return likelihoods.heteroscedastic_normal(f)

    def _noise_shape(self) -> tuple:
        return () if self.num_outputs == 1 else (self.num_outputs,)


def _check_classes(observation: Observation, caller: str) -> None:
    """``num_classes``: an integer >= 2 for the class likelihoods (with one column of labels),
    absent for the others.

    :raises ValueError: otherwise.
    """
    likelihood, num_classes = observation.likelihood, observation.num_classes
    classes = likelihood in ("softmax", "robust_max")
    if classes and not (
        isinstance(num_classes, (int, np.integer))
        and not isinstance(num_classes, bool)
        and num_classes >= 2
    ):
        raise ValueError(
            f"{caller}: likelihood={likelihood!r} needs num_classes, an integer >= 2, got "
            f"{num_classes!r}"
        )
    if classes and observation.num_outputs != 1:
        raise ValueError(
            f"{caller}: likelihood={likelihood!r} takes one column of labels; got "
            f"num_outputs={observation.num_outputs}"
        )
    if not classes and num_classes is not None:
        raise ValueError(
            f"{caller}: num_classes is for likelihood='softmax' or 'robust_max', not {likelihood!r}"
        )


def _check_discrete_targets(y: jax.Array, observation: Observation, caller: str) -> None:
    """Refuse concrete labels outside ``0..C-1`` (0/1 for probit) and counts that are not
    non-negative integers (NaN entries pass when they are masked)."""
    value = concrete(y)
    if value is None:
        return
    value = value[~np.isnan(value)] if np.issubdtype(value.dtype, np.inexact) else value.ravel()
    if observation.likelihood in _COUNTS:
        bad = (value < 0) | (value != np.round(value))
        what = "non-negative integer counts"
    else:
        num_classes = 2 if observation.likelihood == "probit" else observation.num_classes
        assert num_classes is not None  # Observation.check: the class likelihoods have it
        bad = ~np.isin(value, np.arange(num_classes))
        what = "0/1 labels" if num_classes == 2 else f"class labels in 0..{num_classes - 1}"
    if bad.any():
        raise ValueError(
            f"{caller}: y must hold {what} for likelihood={observation.likelihood!r}; got "
            f"{int(bad.sum())} other value(s), e.g. {value[bad][0].item()!r}"
        )


def validated_normal(loc: jax.Array, scale: jax.Array) -> dist.Normal:
    """``Normal(loc, scale)``, its arguments checked as NumPyro checks them (``arg_constraints``
    in their order, NumPyro's message) but on host copies of concrete arguments: NumPyro's own
    check runs JAX operations, which run eagerly (``svi.init``) compile a program each, about
    0.15 s on a 2-core CPU; its constraints evaluate NumPy arrays with NumPy. Traced arguments,
    or validation switched off (``numpyro.enable_validation(False)``), go to NumPyro as they
    are. An instance checked here has NumPyro's validation off, so its ``log_prob`` does not
    also check the value against the support (NumPyro would give ``-inf`` and warn for a
    non-finite target): the factories' targets are refused non-finite at the door, or masked.

    :raises ValueError: for an argument outside its constraint (NumPyro's message).
    """
    args = {"loc": loc, "scale": scale}
    on_host = {name: concrete(value) for name, value in args.items()}
    if not distribution_validation_enabled() or any(v is None for v in on_host.values()):
        return dist.Normal(loc, scale)
    for name, value in on_host.items():
        if not np.all(dist.Normal.arg_constraints[name](value)):
            raise ValueError(f"Normal distribution got invalid {name} parameter.")
    return dist.Normal(loc, scale, validate_args=False)

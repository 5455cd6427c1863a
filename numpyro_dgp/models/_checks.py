"""The factories' own arguments, checked when the model is built (the likelihood's are
:meth:`~numpyro_dgp.models.Observation.check`'s)."""

from __future__ import annotations

from typing import Callable, Sequence

from jax.typing import ArrayLike

from numpyro_dgp._validation import check_positive_int, check_positive_number
from numpyro_dgp.kernels import Kernel
from numpyro_dgp.layers import MEAN_FUNCTIONS

__all__ = ["check_common", "check_diffgp_args", "check_layer_sizes", "check_regression_args"]


def check_regression_args(
    num_layers: int,
    num_inducing: int,
    hidden_width: int | None,
    kernel: Kernel | None,
    noise_init: float,
    jitter: float | None,
    inner_mean: str | Callable,
) -> None:
    """:func:`deep_gp_regression`'s own arguments (the likelihood's are
    :meth:`Observation.check`'s).

    :raises ValueError: for an invalid argument (naming it).
    :raises TypeError: if ``kernel`` is not a :class:`~numpyro_dgp.kernels.Kernel`.
    """
    caller = "deep_gp_regression"
    check_positive_int(num_layers, "num_layers", caller)
    check_positive_int(num_inducing, "num_inducing", caller)
    check_positive_int(hidden_width, "hidden_width", caller, allow_none=True)
    check_common(caller, kernel, noise_init, jitter)
    if not (callable(inner_mean) or inner_mean in MEAN_FUNCTIONS):
        raise ValueError(
            f"{caller}: inner_mean must be one of {MEAN_FUNCTIONS} or a callable, "
            f"got {inner_mean!r}"
        )


def check_common(caller, kernel, noise_init, jitter):
    """The factories' shared arguments: checked when the model is built, not at its first run."""
    if kernel is not None and not isinstance(kernel, Kernel):
        raise TypeError(
            f"{caller}: kernel must be a numpyro_dgp.kernels.Kernel, got {type(kernel).__name__}"
        )
    check_positive_number(noise_init, "noise_init", caller)
    if jitter is not None:
        check_positive_number(jitter, "jitter", caller)


def check_diffgp_args(
    T: float,
    num_steps: int,
    num_inducing: int,
    kernel: Kernel | None,
    noise_init: float,
    jitter: float | None,
    flow_kernel: Kernel | None,
    time_input: bool,
    flow_inducing_inputs: ArrayLike | None,
) -> None:
    """:func:`diffgp`'s own arguments (the likelihood's are :meth:`Observation.check`'s).

    :raises ValueError: for an invalid argument (naming it).
    :raises TypeError: if a kernel is not a :class:`~numpyro_dgp.kernels.Kernel`.
    """
    check_positive_number(T, "T", "diffgp", allow_zero=True)
    check_positive_int(num_steps, "num_steps", "diffgp")
    check_positive_int(num_inducing, "num_inducing", "diffgp")
    check_common("diffgp", kernel, noise_init, jitter)
    if flow_kernel is not None and not isinstance(flow_kernel, Kernel):
        raise TypeError(
            "diffgp: flow_kernel must be a numpyro_dgp.kernels.Kernel, "
            f"got {type(flow_kernel).__name__}"
        )
    if time_input and flow_inducing_inputs is None:
        raise ValueError(
            "diffgp: time_input=True needs flow_inducing_inputs over (x, t), e.g. "
            "numpyro_dgp.sde.temporal_inducing_inputs(X, num_inducing, jnp.linspace(0, T, 3))"
        )


def check_layer_sizes(
    widths: Sequence[int], num_inducing: Sequence[int], width: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """:func:`amortized_dgp`'s ``(widths, num_inducing)`` as tuples: positive integers, one of each
    per layer, the last width the likelihood's ``width``.

    :raises ValueError: otherwise (naming the argument).
    """
    widths, num_inducing = tuple(widths), tuple(num_inducing)
    if (
        not widths
        or any(not (isinstance(w, int) and w >= 1) for w in widths)
        or widths[-1] != width
    ):
        raise ValueError(
            f"amortized_dgp: widths must be positive integers ending in the likelihood's "
            f"{width} output(s), got {widths!r}"
        )
    if len(num_inducing) != len(widths):
        raise ValueError(
            f"amortized_dgp: num_inducing needs one entry per layer ({len(widths)}), "
            f"got {num_inducing!r}"
        )
    for i, M in enumerate(num_inducing):
        check_positive_int(M, f"num_inducing[{i}]", "amortized_dgp")
    return widths, num_inducing

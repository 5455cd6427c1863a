"""The door of the prediction functions: test inputs checked and cast to the model's dtype,
and a guide that is set up."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from numpyro_dgp._validation import as_float_array, check_finite, warn_if_not_standardized
from numpyro_dgp.io import training_arguments

__all__ = ["check_guide_is_set_up", "checked_test_inputs"]


def checked_test_inputs(
    X_new: ArrayLike,
    caller: str,
    values: Any = None,
    model: Callable | None = None,
    guide: Callable | None = None,
) -> jax.Array:
    """``X_new`` at the door: a finite float ``(N, D)`` array with at least one row (integers
    cast), in the dtype the model was fitted in (a model predicts so whatever the inputs' dtype,
    since default jitters follow the inputs' dtype): the training inputs' where ``guide`` recorded
    them for ``model``, else that of the fitted ``values`` (parameters or samples); with the
    training inputs' number of columns; a warning when its features are spread far beyond the
    unit scale kernels start at.

    :raises ValueError: no rows, NaN or inf, or another number of columns than the training
        inputs had.
    """
    X_new = as_float_array(X_new, "X_new", caller, ndim=2)
    if X_new.shape[0] == 0:
        raise ValueError(f"{caller}: X_new has no rows (shape {tuple(X_new.shape)})")
    check_finite(X_new, "X_new", caller)
    training = None if guide is None or model is None else training_arguments(model, guide)
    X_train: Any = training[0][0] if training is not None and training[0] else None
    D = X_train.shape[-1] if getattr(X_train, "ndim", 0) == 2 else X_new.shape[-1]
    if D != X_new.shape[-1]:
        raise ValueError(
            f"{caller}: X_new has {X_new.shape[-1]} columns; the model was fitted on inputs with "
            f"{D} (X_new must be (N, {D}), its columns in the training order)"
        )
    floating = [
        leaf.dtype
        for leaf in jax.tree_util.tree_leaves(values)
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating)
    ]
    if getattr(X_train, "ndim", 0) == 2 and jnp.issubdtype(X_train.dtype, jnp.floating):
        X_new = X_new.astype(X_train.dtype)  # the inputs it was fitted on, where the guide knows
    elif floating:
        X_new = X_new.astype(jnp.result_type(*floating))
    warn_if_not_standardized(X_new, "X_new", caller, upper_only=True, stacklevel=4)
    return X_new


def check_guide_is_set_up(guide: Callable, caller: str) -> None:
    # AutoGuides build themselves on first call; inside jit/eval_shape that would leak
    # tracers, and on test inputs (y absent) it would treat y as a latent site.
    if getattr(guide, "prototype_trace", "absent") is None:
        raise ValueError(
            f"{caller}: the guide has not been set up. Run svi.init(...) / fit(...) with it, or "
            "call guide.setup(rng_key, X_train, y_train) on the training data "
            "(e.g. after load_params)"
        )

"""The affine maps between a data set's units and the standardized units a model is fitted in
(:class:`Standardization`, saved with a model by :func:`numpyro_dgp.save_model`)."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np
from jax.typing import ArrayLike

__all__ = ["Standardization", "check_standardization"]


def _check_standardization_inputs(X: ArrayLike) -> np.ndarray:
    """``X`` as a float64 array, checked to be a non-empty ``(N, D)`` array.

    :raises ValueError: otherwise.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(
            f"Standardization.fit: X must be a non-empty (N, D) array, got shape {X.shape}"
        )
    return X


class Standardization(NamedTuple):
    """The affine maps between the data's units and the standardized units a model is fitted in:
    ``X_std = (X - x_mean) / x_scale`` and, for regression, ``y_std = (y - y_mean) / y_scale``.

    :ivar x_mean: ``(D,)`` feature means of the training part.
    :ivar x_scale: ``(D,)`` feature standard deviations (1 where a feature is constant).
    :ivar y_mean: target mean (0 for classification and counts; ``(T,)`` for ``T`` columns).
    :ivar y_scale: target standard deviation (1 for classification and counts; ``(T,)``).
    """

    x_mean: np.ndarray
    x_scale: np.ndarray
    y_mean: float | np.ndarray = 0.0
    y_scale: float | np.ndarray = 1.0

    @classmethod
    def fit(cls, X: ArrayLike, y: ArrayLike | None = None) -> Standardization:
        """The standardization of training data: per-feature mean and standard deviation of
        ``X`` and, if ``y`` is given, of each column of ``y`` (constant columns get scale 1;
        missing targets, NaN, are left out).

        :param X: ``(N, D)`` training inputs.
        :param y: ``(N,)`` or ``(N, T)`` regression targets, or ``None`` (classification and
            counts: targets untouched).
        :return: the :class:`Standardization`.
        """
        X = _check_standardization_inputs(X)
        x_mean = X.mean(axis=0)
        x_scale = X.std(axis=0)
        x_scale = np.where(x_scale > 0, x_scale, 1.0)
        if y is None:
            return cls(x_mean, x_scale)
        y = np.asarray(y, dtype=np.float64)
        columns = y.reshape(y.shape[0], -1)
        y_mean, y_scale = np.nanmean(columns, axis=0), np.nanstd(columns, axis=0)
        y_scale = np.where(y_scale > 0, y_scale, 1.0)
        if y.ndim == 1:
            return cls(x_mean, x_scale, float(y_mean[0]), float(y_scale[0]))
        return cls(x_mean, x_scale, y_mean, y_scale)

    def inputs(self, X: ArrayLike) -> np.ndarray:
        """``(X - x_mean) / x_scale``.

        :param X: ``(N, D)`` inputs in the data's units.
        :return: the standardized inputs (float64).
        """
        return (np.asarray(X, dtype=np.float64) - self.x_mean) / self.x_scale

    def targets(self, y: ArrayLike) -> np.ndarray:
        """``(y - y_mean) / y_scale``.

        :param y: ``(N,)`` targets in the data's units, or ``(N, T)`` for ``T`` columns (each with
            its own mean and scale).
        :return: the standardized targets (float64).
        """
        return (np.asarray(y, dtype=np.float64) - self.y_mean) / self.y_scale

    def to_data_units(self, prediction: Any) -> Any:
        """A prediction of standardized targets in the data's units: ``y = y_mean + y_scale y_std``
        (each column by its own mean and scale) for the means, variances, components and, for a
        location-scale likelihood kept as atoms (Student-t, heteroscedastic Gaussian), the atoms.
        Classification predictions, and any prediction when the targets were not standardized
        (``y_mean = 0``, ``y_scale = 1``), are returned as they are.

        :param prediction: a :class:`~numpyro_dgp.Prediction` of standardized targets.
        :return: the :class:`~numpyro_dgp.Prediction` in the data's units.
        :raises ValueError: a prediction kept as atoms of a family without location and scale
            (counts) whose targets were standardized.
        """
        import jax.numpy as jnp

        identity = np.all(np.asarray(self.y_mean) == 0.0) and np.all(
            np.asarray(self.y_scale) == 1.0
        )
        if identity or prediction.likelihood in ("bernoulli", "categorical"):
            return prediction
        m = jnp.asarray(self.y_mean, prediction.mean.dtype)
        sc = jnp.asarray(self.y_scale, prediction.mean.dtype)
        atoms = prediction.atoms
        if atoms is not None:
            if not {"loc", "scale"} <= set(atoms.arg_constraints):
                raise ValueError(
                    f"Standardization.to_data_units: a {type(atoms).__name__} prediction has no "
                    "location and scale to map to the data's units (its targets should not have "
                    "been standardized; SavedModel.predict(..., standardized=True) returns the "
                    "prediction as it is)"
                )
            params = {name: getattr(atoms, name) for name in atoms.arg_constraints}
            params["loc"], params["scale"] = params["loc"] * sc + m, params["scale"] * sc
            atoms = type(atoms)(**params, validate_args=False)
        return prediction._replace(
            mean=prediction.mean * sc + m,
            variance=prediction.variance * sc**2,
            component_means=prediction.component_means * sc + m,
            component_variances=prediction.component_variances * sc**2,
            atoms=atoms,
        )

    def to_json(self) -> dict:
        """A JSON-serializable dict (lists of floats; Python's float repr round-trips exactly).

        :return: ``{"x_mean", "x_scale", "y_mean", "y_scale"}``.
        """
        number = lambda v: (  # noqa: E731
            float(v) if np.ndim(v) == 0 else [float(x) for x in np.ravel(v)]
        )
        return {
            "x_mean": [float(v) for v in self.x_mean],
            "x_scale": [float(v) for v in self.x_scale],
            "y_mean": number(self.y_mean),
            "y_scale": number(self.y_scale),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Standardization:
        """The inverse of :meth:`to_json`.

        :param data: the dict written by :meth:`to_json`.
        :return: the :class:`Standardization`.
        """
        number = lambda v: (  # noqa: E731
            np.asarray(v, np.float64) if isinstance(v, list) else float(v)
        )
        return cls(
            np.asarray(data["x_mean"], np.float64),
            np.asarray(data["x_scale"], np.float64),
            number(data["y_mean"]),
            number(data["y_scale"]),
        )


def _check_entries(value: Any, name: str, caller: str, shape: tuple | None, positive: bool) -> None:
    """Raise unless ``value`` is finite (and positive) and, when ``shape`` is given, of that shape.

    :raises ValueError: naming the field and the first bad entry.
    """
    array = np.asarray(value, dtype=np.float64)
    if shape is not None and array.shape != shape:
        raise ValueError(
            f"{caller}: standardization.{name} has shape {array.shape}, expected {shape}"
        )
    bad = ~np.isfinite(array) | ((array <= 0) if positive else False)
    if np.any(bad):
        where = np.argwhere(np.atleast_1d(bad))[0].tolist()
        kind = "finite and positive" if positive else "finite"
        raise ValueError(
            f"{caller}: standardization.{name} must be {kind}; "
            f"entry {where} is {np.atleast_1d(array)[tuple(where)]!r}"
        )


def check_standardization(s: Standardization, input_dim: int, caller: str) -> None:
    """Raise unless ``s`` maps ``input_dim`` features and its targets by finite means and finite,
    positive scales, ``y_mean`` and ``y_scale`` of one shape (a number, or one per column).

    :raises ValueError: naming the field.
    """
    _check_entries(s.x_mean, "x_mean", caller, (int(input_dim),), False)
    _check_entries(s.x_scale, "x_scale", caller, (int(input_dim),), True)
    _check_entries(s.y_mean, "y_mean", caller, None, False)
    _check_entries(s.y_scale, "y_scale", caller, None, True)
    y_shapes = np.shape(s.y_mean), np.shape(s.y_scale)
    if y_shapes[0] != y_shapes[1] or len(y_shapes[0]) > 1:
        raise ValueError(
            f"{caller}: standardization.y_mean and y_scale must be numbers or one per target "
            f"column, of one shape; got shapes {y_shapes[0]} and {y_shapes[1]}"
        )

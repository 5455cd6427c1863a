"""Factory and guide arguments as JSON for ``model.json`` (:func:`numpyro_dgp.save_model`):
numbers, strings, arrays, kernels and lists of them, and back."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

__all__ = ["decode_value", "encode_value"]


def _check_encodable(value: Any, where: str) -> None:
    """Raise unless ``value`` is of a type ``model.json`` can hold (numbers, strings, arrays,
    kernels and lists of them; the entries of lists are checked as they are encoded).

    :raises TypeError: otherwise.
    """
    from numpyro_dgp.kernels import Kernel

    if not (
        value is None
        or isinstance(
            value,
            (
                bool,
                str,
                int,
                np.integer,
                float,
                np.floating,
                Kernel,
                jax.Array,
                np.ndarray,
                list,
                tuple,
            ),
        )
    ):
        raise TypeError(
            f"save_model: the model argument {where} = {value!r} cannot be saved (a "
            f"{type(value).__name__}; only numbers, strings, arrays, kernels and lists of them)"
        )


def encode_value(value: Any, where: str) -> Any:
    """``value`` (a factory or guide argument) as JSON: numbers and strings as they are, arrays
    and kernels as tagged dicts, lists entry by entry (``where`` names it in messages)."""
    from numpyro_dgp.kernels import Kernel

    _check_encodable(value, where)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, Kernel):
        return {"__kernel__": _encode_kernel(value, where)}
    if isinstance(value, (jax.Array, np.ndarray)):
        arr = np.asarray(value)
        return {"__array__": arr.tolist(), "dtype": arr.dtype.name}
    return [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _encode_kernel(kernel: Any, where: str) -> dict:
    from numpyro_dgp.kernels import Product, Sum

    name = type(kernel).__name__
    if isinstance(kernel, (Sum, Product)):
        return {"type": name, "kernels": [_encode_kernel(k, where) for k in kernel.kernels]}
    fields = {
        f.name: encode_value(getattr(kernel, f.name), f"{where}.{f.name}")
        for f in dataclasses.fields(kernel)
    }
    return {"type": name, "fields": fields}


def _check_encoded(value: Any) -> None:
    """Raise if ``value`` is a dict that encodes neither a kernel nor an array.

    :raises ValueError: for such a dict.
    """
    if isinstance(value, dict) and "__kernel__" not in value and "__array__" not in value:
        raise ValueError(f"unknown encoded value {value!r}")


def decode_value(value: Any) -> Any:
    """The inverse of :func:`encode_value`."""
    _check_encoded(value)
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        if "__kernel__" in value:
            return _decode_kernel(value["__kernel__"])
        return np.asarray(value["__array__"], dtype=np.dtype(value["dtype"]))
    return value


def _check_kernel_class(data: dict) -> type:
    """The kernel class ``data`` names.

    :raises ValueError: a name that is not a kernel of :mod:`numpyro_dgp.kernels`.
    """
    from numpyro_dgp import kernels

    cls = getattr(kernels, data.get("type", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, kernels.Kernel)):
        raise ValueError(f"unknown kernel type {data.get('type')!r}")
    return cls


def _decode_kernel(data: dict) -> Any:
    cls = _check_kernel_class(data)
    if "kernels" in data:
        return cls(*[_decode_kernel(k) for k in data["kernels"]])
    fields = {k: decode_value(v) for k, v in data["fields"].items()}
    return cls(**fields)

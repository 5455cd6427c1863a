"""Jittered Cholesky factorisation and triangular helpers (pure JAX)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

__all__ = [
    "default_jitter",
    "check_jitter",
    "jittered_cholesky",
    "robust_cholesky",
    "triangular_inverse",
]


def default_jitter(dtype) -> float:
    """Diagonal jitter that keeps kernel Cholesky factors finite in ``dtype``.

    float64: 1e-6, float32 (and lower): 1e-4 -- the settings of DSVI/GPflux runs; float32
    kernel matrices lose about 7 digits, so 1e-6 jitter is below their round-off.
    """
    return 1e-6 if jnp.finfo(dtype).bits >= 64 else 1e-4


def check_jitter(jitter, name: str = "jitter") -> None:
    """Raise ``ValueError`` if a concrete ``jitter`` is not a finite positive number."""
    try:
        value = float(jitter)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return  # traced: cannot check here
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"{name} must be a finite positive number, got {jitter!r}")


def jittered_cholesky(K, jitter):
    """Lower Cholesky factor of ``K + jitter * I``.

    :param K: ``(..., M, M)`` symmetric positive semi-definite matrix.
    :param jitter: positive scalar added to the diagonal.
    :return: ``(..., M, M)`` lower-triangular factor; NaN where the factorisation fails.
    """
    check_jitter(jitter)
    M = K.shape[-1]
    return jnp.linalg.cholesky(K + jitter * jnp.eye(M, dtype=K.dtype))


def robust_cholesky(K, jitter, max_tries: int = 2, factor: float = 100.0):
    """Cholesky of ``K + jitter * I``, retrying with ``factor`` times more jitter on failure.

    Kernel matrices at inducing inputs that an optimiser has pushed together become
    numerically singular; retrying with more jitter recovers instead of propagating NaN.
    The retries run only when the first factor is not finite (``lax.cond``).

    :return: ``(L, used_jitter)``; ``L`` is still NaN if every try failed.
    """
    check_jitter(jitter)
    jitter = jnp.asarray(jitter, K.dtype)

    def attempt(k, carry):
        L, used = carry
        ok = jnp.all(jnp.isfinite(L))
        new_jitter = jitter * factor**k

        def retry(_):
            return jittered_cholesky(K, new_jitter), new_jitter

        return jax.lax.cond(ok, lambda _: (L, used), retry, None)

    carry = (jittered_cholesky(K, jitter), jitter)
    for k in range(1, max_tries):
        carry = attempt(k, carry)
    return carry


def triangular_inverse(L):
    """``L^{-1}`` for lower-triangular ``L`` (``(..., M, M)``).

    One explicit inverse followed by matrix products is faster on CPU than repeated
    triangular solves against many right-hand sides (XLA's CPU triangular solve runs at a
    fraction of matmul speed, see shared/notes/performance.md).
    """
    eye = jnp.broadcast_to(jnp.eye(L.shape[-1], dtype=L.dtype), L.shape)
    return solve_triangular(L, eye, lower=True)

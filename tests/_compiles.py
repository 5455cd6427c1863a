"""Counting XLA compilations in a test (JAX's compile log)."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import jax


@contextlib.contextmanager
def compile_messages() -> Iterator[list[str]]:
    """Collect JAX's compile-log messages (``jax.log_compiles``) issued inside the block."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect()
    logging.getLogger("jax").addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield messages
    finally:
        logging.getLogger("jax").removeHandler(handler)


def xla_compilations(messages: list[str]) -> list[str]:
    """The messages of finished XLA compilations among ``messages``."""
    return [m for m in messages if m.startswith("Finished XLA compilation")]

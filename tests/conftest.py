import os
from pathlib import Path

# A persistent XLA compilation cache for the run (this process, and the notebook kernels of
# test_tutorials, which inherit the environment): many tests build the same model at the same
# shapes, and every model's eager initialisation compiles the same few hundred small programs.
# Set before jax is imported; an existing setting wins. The directory lives in the checkout
# (git-ignored), so a clean clone starts cold; one per pytest-xdist worker, because JAX writes
# entries without a lock and a worker's notebook kernel runs while that worker waits.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(
    Path(__file__).resolve().parent.parent / ".jax_cache" / os.environ.get("PYTEST_XDIST_WORKER", "main")))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import jax  # noqa: E402
import pytest  # noqa: E402

# The test suite runs in float64 (dense references to 1e-8).
jax.config.update("jax_enable_x64", True)
os.environ.setdefault("NUMPYRO_DGP_SMOKE", "1")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

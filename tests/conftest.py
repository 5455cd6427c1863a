import os

import jax
import pytest

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

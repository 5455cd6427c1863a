"""Run a check on two host CPU devices: a fresh interpreter with
``--xla_force_host_platform_device_count=2`` (the device count is fixed when JAX starts, so the
test process itself cannot have two).

The script starts with :data:`PREAMBLE` (float64, the two devices asserted, a small 2-D
regression problem ``X (64, 2)``, ``y (64,)``) and prints one JSON object as its last line;
:func:`gradient_difference` is importable from it (the repository is on its ``PYTHONPATH``).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PREAMBLE = textwrap.dedent(
    """
    import json
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    from numpyro.infer import SVI
    import numpyro_dgp as dgp
    from numpyro_dgp.handlers import data_parallel
    from tests._two_devices import gradient_difference

    assert len(jax.devices()) == 2, jax.devices()
    rs = np.random.RandomState(0)
    X = jnp.asarray(rs.uniform(-1, 1, (64, 2)))
    y = jnp.sin(3 * X[:, 0]) * X[:, 1] + 0.05 * jnp.asarray(rs.randn(64))
    """
)


def gradient_difference(reference: dict, other: dict) -> float:
    """The largest ``|other[k] - reference[k]| / |reference[k]|`` over the parameters, each norm
    floored at 1e-6 of the largest: some gradients are exactly zero, and round-off on either
    side of a zero is meaningless."""
    import jax.numpy as jnp

    norms = {k: float(jnp.linalg.norm(reference[k])) for k in reference}
    floor = 1e-6 * max(norms.values())
    return max(float(jnp.linalg.norm(reference[k] - other[k])) / max(norms[k], floor) for k in reference)


def run_on_two_devices(script: str) -> dict:
    """Run :data:`PREAMBLE` + ``script`` on two host devices; its last printed line, parsed."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", PREAMBLE + textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

"""One process of the 2-process data-parallel test (tests/infer/test_distributed.py).

    python _distributed_worker.py PROCESS_ID NUM_PROCESSES PORT OUT.npz

PROCESS_ID = -1 runs the single-process reference on the joined minibatches.
"""

import os
import sys

import jax

process_id, num_processes, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
jax.config.update("jax_enable_x64", True)
if process_id >= 0:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                               process_id=process_id)

import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from numpyro.infer import SVI  # noqa: E402
from numpyro.optim import Adam  # noqa: E402

import numpyro_dgp as dgp  # noqa: E402
from numpyro_dgp.infer import HostMinibatches, fit_minibatches  # noqa: E402

N, D, LOCAL_BATCH, STEPS = 96, 2, 12, 25
rng = np.random.default_rng(0)
X = rng.normal(size=(N, D))
y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=N)
shard = N // num_processes


def stream(p):
    """Process p's shard and its minibatch stream (seeded per process)."""
    rows = slice(p * shard, (p + 1) * shard)
    return HostMinibatches(X[rows], y[rows], LOCAL_BATCH, seed=100 + p)


class Joined:
    """The global minibatches: every process's local batch, in process order."""

    def __init__(self):
        self.streams = [stream(p) for p in range(num_processes)]

    def __iter__(self):
        return self

    def __next__(self):
        parts = [next(s) for s in self.streams]
        return tuple(np.concatenate(a) for a in zip(*parts))


model = dgp.models.deep_gp_regression(2, num_inducing=6)
guide = dgp.guides.AutoFactorizedDGP(model)
svi = SVI(model, guide, Adam(0.01), dgp.DGPElbo())
if process_id >= 0:
    mesh = Mesh(np.array(jax.devices()), ("data",))
    result = fit_minibatches(svi, jax.random.PRNGKey(0), stream(process_id), num_steps=STEPS, num_data=N, mesh=mesh,
                             progress_bar=False)
else:
    result = fit_minibatches(svi, jax.random.PRNGKey(0), Joined(), num_steps=STEPS, num_data=N,
                             progress_bar=False)
params = {k: np.asarray(jax.device_get(v.addressable_data(0) if hasattr(v, "addressable_data") else v))
          for k, v in result.params.items()}
np.savez(out, losses=result.losses, **{f"param:{k}": v for k, v in params.items()})
if process_id >= 0:
    jax.distributed.shutdown()
print("done", process_id, os.getpid())

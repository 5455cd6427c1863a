"""Data parallelism across processes: 2 local processes (jax.distributed, CPU collectives)
reach the loss and parameters of one process on the same minibatches."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

WORKER = Path(__file__).with_name("_distributed_worker.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one_process(tmp_path):
    port = _free_port()
    # no shared persistent compilation cache: the three processes would write it at once
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    # the two data-parallel processes and the one-process reference run side by side
    commands = [[str(p), "2", str(port), str(tmp_path / f"p{p}.npz")] for p in range(2)]
    commands.append(["-1", "2", "0", str(tmp_path / "ref.npz")])
    procs = [subprocess.Popen([sys.executable, str(WORKER), *c], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env) for c in commands]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    expected = np.load(tmp_path / "ref.npz")
    for p in range(2):
        got = np.load(tmp_path / f"p{p}.npz")
        assert sorted(got.files) == sorted(expected.files)
        np.testing.assert_allclose(got["losses"], expected["losses"], rtol=1e-6)
        for name in expected.files:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-6, err_msg=name)
    # training happened: the loss went down
    assert expected["losses"][-5:].mean() < expected["losses"][:5].mean()

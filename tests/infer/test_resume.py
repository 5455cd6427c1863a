"""Resumable and reproducible fits: split fits, repeated fits, checkpoints and a killed process.

All comparisons are bit for bit (``np.array_equal``) in float64.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.infer import SVI

import numpyro_dgp as dgp
from numpyro_dgp.models import deep_gp_regression

REPO_ROOT = Path(__file__).resolve().parents[2]

# The data and model of every test here, also run by the child processes of the kill test.
SETUP = """
import numpy as np, jax, jax.numpy as jnp, numpyro
from numpyro.infer import SVI
import numpyro_dgp as dgp

def problem():
    rs = np.random.RandomState(0)
    X = jnp.asarray(rs.uniform(-1, 1, (24, 1)))
    y = jnp.asarray(np.sin(3 * X[:, 0]) + 0.1 * rs.randn(24))
    # two layers: the inner one is sampled, so every step uses the key
    model = dgp.models.deep_gp_regression(2, num_inducing=4)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.02), dgp.DGPElbo())
    return svi, X, y
"""
namespace: dict = {}
exec(SETUP, namespace)
problem = namespace["problem"]


def assert_same_bits(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


@pytest.mark.parametrize("chunk_size", [1, 7, 100])
def test_a_split_fit_equals_one_fit_for_any_chunk_size(chunk_size):
    svi, X, y = problem()
    key = jax.random.PRNGKey(1)
    whole = dgp.fit(svi, key, X, y, num_steps=30, chunk_size=chunk_size, progress_bar=False)
    first = dgp.fit(svi, key, X, y, num_steps=13, chunk_size=chunk_size, progress_bar=False)
    second = dgp.fit(svi, None, X, y, num_steps=17, chunk_size=chunk_size, progress_bar=False, init_state=first.state)
    assert_same_bits(whole.params, second.params)
    assert np.array_equal(whole.losses, np.concatenate([first.losses, second.losses]))
    assert np.array_equal(whole.state.rng_key, second.state.rng_key)
    if chunk_size == 7:  # and cutting the same steps into other chunks changes nothing either
        other = dgp.fit(svi, key, X, y, num_steps=30, chunk_size=30, progress_bar=False)
        assert_same_bits(whole.params, other.params)


def test_fitting_the_same_svi_twice_with_the_same_key_gives_the_same_result():
    svi, X, y = problem()
    key = jax.random.PRNGKey(2)
    a = dgp.fit(svi, key, X, y, num_steps=10, progress_bar=False)
    b = dgp.fit(svi, key, X, y, num_steps=10, progress_bar=False)  # the guide is set up now
    assert_same_bits(a.params, b.params)
    fresh, _, _ = problem()  # a new guide and SVI object: the same run again
    assert_same_bits(a.params, dgp.fit(fresh, key, X, y, num_steps=10, progress_bar=False).params)


def test_a_resumed_fit_continues_the_averaging_and_the_losses(tmp_path):
    """A fit that stopped at a checkpoint and is resumed (here: to a larger num_steps) ends where
    the uninterrupted fit does, iterate averaging included."""
    svi, X, y = problem()
    key, path = jax.random.PRNGKey(3), tmp_path / "fit.ckpt"
    whole = dgp.fit(svi, key, X, y, num_steps=20, chunk_size=6, average_from=5, progress_bar=False)
    dgp.fit(svi, key, X, y, num_steps=12, chunk_size=6, average_from=5, progress_bar=False,
            checkpoint_path=path, checkpoint_every=4)
    _, meta = dgp.load_params(path, return_metadata=True)
    assert meta["step"] == 12 and meta["num_steps"] == 12
    resumed = dgp.fit(svi, key, X, y, num_steps=20, chunk_size=6, average_from=5, progress_bar=False,
                      checkpoint_path=path, resume=True)
    assert_same_bits(whole.params, resumed.params)
    assert_same_bits(whole.averaged_params, resumed.averaged_params)
    assert np.array_equal(whole.losses, resumed.losses)
    # resume=True without a checkpoint file starts afresh: the same call serves every restart
    fresh = dgp.fit(svi, key, X, y, num_steps=20, chunk_size=6, average_from=5, progress_bar=False,
                    checkpoint_path=tmp_path / "new.ckpt", checkpoint_every=10, resume=True)
    assert_same_bits(whole.params, fresh.params)
    assert (tmp_path / "new.ckpt").exists()


def test_a_checkpoint_of_another_fit_is_refused(tmp_path):
    svi, X, y = problem()
    path = tmp_path / "fit.ckpt"
    dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=4, progress_bar=False, checkpoint_path=path)
    with pytest.raises(ValueError, match="average_from is 2 here, None in the"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=8, average_from=2, progress_bar=False,
                checkpoint_path=path, resume=True)
    with pytest.raises(ValueError, match="beyond this fit's num_steps=2"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=2, progress_bar=False, checkpoint_path=path, resume=True)
    other = deep_gp_regression(1, num_inducing=4)
    other_svi = SVI(other, dgp.guides.AutoFactorizedDGP(other), numpyro.optim.Adam(0.02), dgp.DGPElbo())
    with pytest.raises(ValueError, match=r"written by another fit: params\.h2\."):
        dgp.fit(other_svi, jax.random.PRNGKey(0), X, y, num_steps=8, progress_bar=False, checkpoint_path=path,
                resume=True)
    dgp.save_params(tmp_path / "params.npz", {"a": jnp.ones(2)})
    with pytest.raises(FileExistsError, match="not a fit checkpoint"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=8, progress_bar=False,
                checkpoint_path=tmp_path / "params.npz", resume=True)
    with pytest.raises(ValueError, match="need checkpoint_path"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=8, checkpoint_every=2)


CHILD = SETUP + """
import sys, time
from numpyro_dgp.infer import _fit

jax.config.update("jax_enable_x64", True)
mode, path, out = sys.argv[1:]
if mode == "slow":
    # pause after each checkpoint, so that the parent kills this process mid-fit
    write = _fit.Checkpoints.after_chunk
    def write_and_wait(self, log, carry):
        write(self, log, carry)
        if log.done % 8 == 0:  # a checkpoint was written
            time.sleep(60)
    _fit.Checkpoints.after_chunk = write_and_wait
svi, X, y = problem()
result = dgp.fit(svi, jax.random.PRNGKey(4), X, y, num_steps=24, chunk_size=5, average_from=10, progress_bar=False,
                 checkpoint_path=path, checkpoint_every=8, resume=True)
dgp.save_params(out, {"params": result.params, "averaged": result.averaged_params, "losses": result.losses})
"""


def test_a_fit_killed_mid_run_resumes_bit_for_bit(tmp_path):
    """A process fitting with checkpoints is killed (SIGKILL) after its first checkpoint; a fresh
    process resumes from it; the result equals the uninterrupted run's bit for bit."""
    script, checkpoint, out = tmp_path / "child.py", tmp_path / "fit.ckpt", tmp_path / "out.npz"
    script.write_text(textwrap.dedent(CHILD))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen([sys.executable, str(script), "slow", str(checkpoint), str(out)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.exists():
            assert child.poll() is None, f"the child ended early:\n{child.stdout.read().decode()}"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL and not out.exists()
    _, meta = dgp.load_params(checkpoint, return_metadata=True)
    assert meta["step"] == 8 and meta["num_steps"] == 24  # killed mid-fit, after the first checkpoint

    resumed = subprocess.run([sys.executable, str(script), "resume", str(checkpoint), str(out)], env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    got = dgp.load_params(out)

    svi, X, y = problem()
    whole = dgp.fit(svi, jax.random.PRNGKey(4), X, y, num_steps=24, chunk_size=5, average_from=10,
                    progress_bar=False)
    assert_same_bits(whole.params, got["params"])
    assert_same_bits(whole.averaged_params, got["averaged"])
    assert np.array_equal(whole.losses, got["losses"])

"""Headline timings on an accelerator (or any JAX device), in one short run of timed sections.

Each section is a name, a function and a time budget; they run one after another in this
process, each timed with its warm-up excluded (compile seconds reported apart), and a
section's exception or overrun is recorded in the result rather than ending the run. The
result file is rewritten after every section, so a run stopped from outside keeps what
finished. Sections:

* ``matmul``: a float32 matrix product at the default and at ``"highest"`` matmul precision
  (GFLOP/s, error against a float64 product on the host: an error near 1e-3 is TF32), and
  float64;
* ``dsvi_step_float64``: the DSVI training step (2 layers, width 8, D = 8, batch 1000 drawn
  inside the step, ``AutoFactorizedDGP``, ``DGPElbo``, Adam; synthetic kin8nm-like data,
  N = 8192) at M = 500 and 1,000, steps inside ``lax.scan`` as ``fit`` runs them;
* ``dsvi_step_float32``: the same step in float32 at JAX's default matmul precision and at
  ``"highest"``, and the loss of both at the same parameters and key (the first step's);
* ``nuts_exact``: NUTS on the exact 2-layer DGP (``handlers.exact_layers``, N = 100, 1-D
  inputs, fixed kernels), 8 chains vectorized: warm-up, then the sampling phase, each with
  its compilation taken out (JAX's monitoring events: NumPyro compiles the sampling loop
  anew on every run): seconds per draw of all chains, per gradient, leapfrog steps;
* ``dsvi_epoch_n40000``: ``fit`` on 40,000 synthetic points, one epoch (40 steps of batch
  1000, M = 100) per chunk, the first epoch not counted: seconds per epoch in float32 and
  float64;
* ``vecchia_nuts``: as ``nuts_exact`` at N = 2,000 under ``handlers.vecchia_layers`` (25
  neighbours; 4 chains, 20 warm-up iterations, tree depth 5: its non-centred prior takes a
  pass of N steps per gradient);
* ``elliptical_slice_n10000``: elliptical slice sampling (``infer.EllipticalSlice``) of the
  Vecchia DGP at N = 10,000, chains vectorized: seconds per step and per log density.

A budget is kept two ways: the sections stop adding timed blocks, sizes or draws when their
budget runs low (what was left out is recorded), and a timer interrupts a section that overruns it
(status ``timeout``, with what it had measured). The timer acts when Python regains control,
so one long compiled call can overrun it; ``device_check.sh`` bounds the whole process with
``timeout``.

Usage::

    bash benchmarks/device_check.sh          # tests, then this: results/device_check.{json,md}
    python benchmarks/device_check.py        # this script alone
    python benchmarks/device_check.py --dry  # tiny sizes on any machine, to a temporary file

``--dry`` runs every section at tiny sizes on any machine (with XLA's optimization passes
off, as in the test suite) and writes to a temporary file unless ``--output`` is given: it
checks that the script still runs (benchmarks/tests/test_device_check.py), not its speed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, NamedTuple

from _harness import RESULTS, command, header, now, table

DEFAULT_OUTPUT = RESULTS / "device_check.json"
DRY_OUTPUT = Path(tempfile.gettempdir()) / "numpyro_dgp_device_check_dry" / "device_check.json"
#: seconds a section may run past its budget before the timer stops it (the soft checks
#: inside the sections aim to end within the budget)
GRACE = 10.0
#: seconds for all sections (device_check.sh bounds the process at this plus start-up)
TOTAL_BUDGET = 270.0

#: sizes of the full run (a GPU: about 5 minutes of sections) and of the dry run (any CPU)
# fmt: off
SIZES = {
    "full": {
        "matmul_n": 4096, "matmul_repeats": 10,
        # the DSVI step: kin8nm's shape (D = 8, N = 8192), width 8, batch 1000
        "step_n": 8192, "step_dim": 8, "step_width": 8, "step_batch": 1000, "step_m": [500, 1000],
        "step_chunk": 20, "step_blocks": 5,
        "nuts_n": 100, "nuts_chains": 8, "nuts_warmup": 200, "nuts_samples": 200,
        "nuts_tree_depth": 8,
        "epoch_n": 40_000, "epoch_m": 100, "epoch_epochs": 4,
        "epoch_dtypes": ["float32", "float64"],
        # fewer, shallower draws: the non-centred Vecchia prior has a pass of N steps per gradient
        "vecchia_n": 2000, "vecchia_neighbors": 25, "vecchia_chains": 4, "vecchia_warmup": 20,
        "vecchia_samples": 50, "vecchia_tree_depth": 5,
        "ess_n": 10_000, "ess_chains": 4, "ess_steps": 50,
    },
    "dry": {
        "matmul_n": 64, "matmul_repeats": 2,
        "step_n": 256, "step_dim": 2, "step_width": 2, "step_batch": 32, "step_m": [4],
        "step_chunk": 2, "step_blocks": 2,
        "nuts_n": 8, "nuts_chains": 2, "nuts_warmup": 4, "nuts_samples": 4, "nuts_tree_depth": 3,
        "epoch_n": 256, "epoch_m": 4, "epoch_epochs": 2, "epoch_dtypes": ["float32"],
        "vecchia_n": 16, "vecchia_neighbors": 4, "vecchia_chains": 2, "vecchia_warmup": 4,
        "vecchia_samples": 4, "vecchia_tree_depth": 3,
        "ess_n": 16, "ess_chains": 2, "ess_steps": 4,
    },
}
# fmt: on


class Skip(Exception):
    """A section that does not apply here; its message is the recorded reason."""


class SectionTimeout(Exception):
    """A section ran past its budget and the grace."""


class Clock:
    """The time left of a section's budget."""

    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()


class Section(NamedTuple):
    name: str
    fn: Callable  # fn(sizes, out, clock): fills ``out`` as it goes, so an overrun keeps the numbers
    budget_s: float
    what: str


class CompileMeter:
    """Wall seconds of a ``with`` block and the seconds JAX spent in it tracing, lowering and
    compiling programs (its monitoring events), for timings with compilation taken out where
    it cannot be done ahead of time (``MCMC.run``)."""

    EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )
    _total = 0.0
    _registered = False

    @classmethod
    def _listen(cls, event, duration, **kwargs):
        if event in cls.EVENTS:
            cls._total += duration

    def __enter__(self):
        from jax import monitoring

        if not CompileMeter._registered:  # listeners cannot be removed one by one: register once
            monitoring.register_event_duration_secs_listener(CompileMeter._listen)
            CompileMeter._registered = True
        self._c0, self._t0 = CompileMeter._total, time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._t0
        self.compile = CompileMeter._total - self._c0


def _set_x64(on: bool) -> None:
    # A global flag, part of the compile cache key: sections set the precision they need.
    import jax

    jax.config.update("jax_enable_x64", on)


def _precision(name: str | None):
    import jax

    return contextlib.nullcontext() if name is None else jax.default_matmul_precision(name)


def _synthetic(n, dim, dtype, seed=0):
    """kin8nm-like regression data: uniform inputs, a smooth nonlinear target with noise."""
    import jax.numpy as jnp
    import numpy as np

    rs = np.random.RandomState(seed)
    X = rs.uniform(-1.0, 1.0, (n, dim))
    y = np.sin(3.0 * X[:, 0]) * (X[:, 1] if dim > 1 else 1.0) + 0.1 * rs.randn(n)
    return jnp.asarray(X, dtype), jnp.asarray(y, dtype)


def _block_median(run, carry, deadline, blocks):
    """Call ``run(carry) -> (carry, losses)`` up to ``blocks`` times, and not again once one
    more block would end past ``deadline`` (a ``perf_counter`` time): (carry, seconds per
    block, last losses)."""
    import jax

    seconds, losses = [], None
    while len(seconds) < blocks:
        t0 = time.perf_counter()
        carry, losses = run(carry)
        jax.block_until_ready(losses)
        seconds.append(time.perf_counter() - t0)
        if time.perf_counter() + max(seconds) > deadline:
            break
    return carry, seconds, losses


def _dsvi(sizes, M, dtype, n=None, batch=None):
    """The kin8nm-like 2-layer DSVI set-up: (svi, state, X, y, init seconds)."""
    import jax
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp
    from numpyro_dgp.models import deep_gp_regression

    n, batch = n or sizes["step_n"], batch or sizes["step_batch"]
    X, y = _synthetic(n, sizes["step_dim"], dtype)
    model = deep_gp_regression(2, num_inducing=M, hidden_width=sizes["step_width"])
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    t0 = time.perf_counter()
    state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=batch)
    jax.block_until_ready(state)
    return svi, state, X, y, time.perf_counter() - t0


def _time_steps(svi, state, X, y, sizes, deadline):
    """Steps inside a compiled ``lax.scan`` of ``step_chunk`` steps (how ``fit`` runs them):
    compile seconds, then the median over timed chunks after one untimed one."""
    import jax
    import numpy as np

    batch, chunk = sizes["step_batch"], sizes["step_chunk"]

    def scan(s, X, y):
        return jax.lax.scan(
            lambda c, _: svi.update(c, X, y, batch_size=batch), s, None, length=chunk
        )

    t0 = time.perf_counter()
    compiled = jax.jit(scan).lower(state, X, y).compile()
    compile_s = time.perf_counter() - t0
    run = lambda s: compiled(s, X, y)  # noqa: E731
    state, first = run(state)  # warm-up: the first call's transfers and allocations
    jax.block_until_ready(first)
    state, seconds, losses = _block_median(run, state, deadline, sizes["step_blocks"])
    return {
        # the first step's loss is the loss at the initial parameters and key
        "loss_at_start": float(first[0]),
        "compile_seconds": compile_s,
        "ms_per_step": 1e3 * float(np.median(seconds)) / chunk,
        "ms_per_step_min": 1e3 * min(seconds) / chunk,
        "timed_chunks": len(seconds),
        "chunk": chunk,
        "losses_finite": bool(np.all(np.isfinite(np.asarray(losses)))),
    }


# ---- sections ------------------------------------------------------------------------------


def section_matmul(sizes, out, clock):
    import jax
    import jax.numpy as jnp
    import numpy as np

    n, repeats = sizes["matmul_n"], sizes["matmul_repeats"]
    rs = np.random.RandomState(0)
    a, b = rs.randn(n, n), rs.randn(n, n)
    exact = a @ b  # float64 on the host: the reference of the errors
    for label, dtype, prec, x64 in [
        ("float32_default", jnp.float32, None, False),
        ("float32_highest", jnp.float32, "highest", False),
        ("float64", jnp.float64, None, True),
    ]:
        _set_x64(x64)
        A, B = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
        with _precision(prec):
            f = jax.jit(lambda x, y: x @ y)
            C = f(A, B).block_until_ready()  # compile and warm up
            t0 = time.perf_counter()
            for _ in range(repeats):
                C = f(A, B)
            C.block_until_ready()
        seconds = (time.perf_counter() - t0) / repeats
        err = float(np.abs(np.asarray(C, np.float64) - exact).max() / np.abs(exact).max())
        out[label] = {"gflops": 2 * n**3 / seconds / 1e9, "max_rel_error": err}
    out["n"] = n
    # float32 round-off of an n-term sum is ~1e-6 relative; TF32 (10-bit mantissa) ~1e-3
    out["float32_default_looks_like_tf32"] = out["float32_default"]["max_rel_error"] > 1e-4


def section_dsvi_step_float64(sizes, out, clock):
    import jax.numpy as jnp

    _set_x64(True)
    _steps_over_m(sizes, out, clock, jnp.float64, [None])


def section_dsvi_step_float32(sizes, out, clock):
    import jax.numpy as jnp

    _set_x64(False)
    _steps_over_m(sizes, out, clock, jnp.float32, ["default", "highest"])
    for row in out.values():
        if isinstance(row, dict) and "default" in row and "highest" in row:
            a, b = row["default"]["loss_at_start"], row["highest"]["loss_at_start"]
            row["loss_difference"] = a - b
            row["loss_relative_difference"] = abs(a - b) / abs(b) if b else None


def _steps_over_m(sizes, out, clock, dtype, precisions):
    """Per M: one set-up; per precision the step's timings and its loss at the initial state
    (the same parameters and key for every precision). Each measurement gets an equal share
    of the time left; what the budget cannot fit is listed in ``not_run``."""
    import jax.numpy as jnp

    todo = [(M, prec) for M in sizes["step_m"] for prec in precisions]
    setup: dict = {}
    for i, (M, prec) in enumerate(todo):
        if clock.left() < 0.1 * clock.budget_s:
            out.setdefault("not_run", []).append(
                {"M": M, "precision": prec or "default", "reason": "budget spent"}
            )
            continue
        deadline = time.perf_counter() + clock.left() / (len(todo) - i)
        if M not in setup:
            setup.clear()  # the previous M's arrays
            setup[M] = _dsvi(sizes, M, dtype)
            out[f"M{M}"] = {"M": M, "init_seconds": setup[M][-1]}
        svi, state, X, y, _ = setup[M]
        with _precision(prec):  # every precision starts from the same parameters and key
            out[f"M{M}"][prec or "default"] = _time_steps(svi, state, X, y, sizes, deadline)
    out.update(
        num_layers=2,
        hidden_width=sizes["step_width"],
        dim=sizes["step_dim"],
        N=sizes["step_n"],
        batch_size=sizes["step_batch"],
        dtype=jnp.dtype(dtype).name,
    )


def _two_layer_model(num_inducing):
    """A 2-layer DGP of 1-D inputs with fixed kernels (as tests/handlers/test_mcmc.py)."""
    import numpyro
    import numpyro.distributions as dist

    import numpyro_dgp as dgp
    from numpyro_dgp import kernels

    k1, k2 = kernels.RBF(variance=1.0, lengthscale=0.6), kernels.RBF(variance=0.8, lengthscale=0.9)

    def model(X, y=None):
        h = dgp.gp_layer("h1", X, k1, num_inducing=num_inducing, mean="identity")
        f = dgp.gp_layer("h2", h, k2, num_inducing=num_inducing)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)

    return model


def _nuts(model, n, chains, warmup, samples, tree_depth, out, clock):
    """Warm-up, then the sampling phase, each timed with its compilation (traced, lowered and
    compiled programs, from JAX's monitoring events) taken out: seconds per draw of all chains
    and per gradient evaluation of one chain."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from numpyro.infer import MCMC, NUTS

    X = jnp.linspace(-1.0, 1.0, n)[:, None]
    y = jnp.sign(X[:, 0]) + 0.05 * jax.random.normal(jax.random.PRNGKey(1), (n,))  # a step
    mcmc = MCMC(
        NUTS(model, max_tree_depth=tree_depth),
        num_warmup=warmup,
        num_samples=samples,
        num_chains=chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    out.update(
        N=n,
        chains=chains,
        chain_method="vectorized",
        warmup=warmup,
        samples=samples,
        max_tree_depth=tree_depth,
    )
    fields = ("num_steps", "diverging")
    with CompileMeter() as meter:
        mcmc.warmup(jax.random.PRNGKey(0), X, y, extra_fields=fields, collect_warmup=False)
        jax.block_until_ready(mcmc.post_warmup_state)
    out.update(warmup_seconds=meter.wall - meter.compile, warmup_compile_seconds=meter.compile)
    # as many draws as the budget leaves room for, at the warm-up's time per iteration (its
    # early, untuned iterations are the slower ones) and the sampling loop's compilation again
    per_iteration = max(meter.wall - meter.compile, 1e-9) / warmup
    room = int((clock.left() - 1.5 * meter.compile - 2.0) / per_iteration)
    if room < samples:
        samples = max(2, room)
        mcmc.num_samples = samples
        out.update(samples=samples, samples_reason="fewer draws: the budget left room for these")
    # numpyro compiles the sampling loop again on every run (a new closure each time), so the
    # compilation is measured inside the run rather than by a second run
    with CompileMeter() as meter:
        mcmc.run(jax.random.PRNGKey(2), X, y, extra_fields=fields)
        jax.block_until_ready(mcmc.get_samples())
    seconds = meter.wall - meter.compile
    steps = float(np.mean(np.asarray(mcmc.get_extra_fields()["num_steps"])))
    out.update(
        sampling_seconds=seconds,
        compile_seconds=meter.compile,
        seconds_per_sample=seconds / samples,
        seconds_per_chain_sample=seconds / (samples * chains),
        mean_leapfrog_steps=steps,
        seconds_per_gradient=seconds / (samples * steps),
        divergences=int(np.asarray(mcmc.get_extra_fields()["diverging"]).sum()),
    )


def section_nuts_exact(sizes, out, clock):
    from numpyro_dgp.handlers import exact_layers

    _set_x64(True)
    model = exact_layers(_two_layer_model(4), parameterization="noncentered", jitter=1e-6)
    _nuts(
        model,
        sizes["nuts_n"],
        sizes["nuts_chains"],
        sizes["nuts_warmup"],
        sizes["nuts_samples"],
        sizes["nuts_tree_depth"],
        out,
        clock,
    )


def section_dsvi_epoch(sizes, out, clock):
    import jax.numpy as jnp
    import numpy as np

    import numpyro_dgp as dgp

    n, batch = sizes["epoch_n"], sizes["step_batch"]
    steps = n // batch  # an epoch: as many minibatch steps as the data have batches
    for i, label in enumerate(sizes["epoch_dtypes"]):
        if i and clock.left() < 0.4 * clock.budget_s:
            out.setdefault("not_run", []).append({"dtype": label, "reason": "budget spent"})
            continue
        dtype, x64 = jnp.dtype(label), label == "float64"
        _set_x64(x64)
        svi, state, X, y, init_s = _dsvi(sizes, sizes["epoch_m"], dtype, n=n, batch=batch)
        result = dgp.fit(
            svi,
            None,
            X,
            y,
            num_steps=steps * sizes["epoch_epochs"],
            chunk_size=steps,
            progress_bar=False,
            init_state=state,
            batch_size=batch,
        )
        epochs = np.asarray(result.chunk_seconds)
        # the first epoch is the warm-up (first call's transfers and allocations)
        epoch_s = float(np.median(epochs[1:] if len(epochs) > 1 else epochs))
        out[label] = {
            "init_seconds": init_s,
            "compile_seconds": result.compile_seconds,
            "seconds_per_epoch": epoch_s,
            "epoch_seconds": epochs.tolist(),
            "ms_per_step": 1e3 * epoch_s / steps,
            "num_skipped": int(result.num_skipped),
            "final_loss_finite": bool(np.isfinite(np.asarray(result.losses)[-1])),
        }
    out.update(
        N=n,
        M=sizes["epoch_m"],
        batch_size=batch,
        steps_per_epoch=steps,
        num_layers=2,
        hidden_width=sizes["step_width"],
        dim=sizes["step_dim"],
    )


def section_vecchia_nuts(sizes, out, clock):
    from numpyro_dgp.handlers import vecchia_layers

    _set_x64(True)
    model = vecchia_layers(_two_layer_model(4), num_neighbors=sizes["vecchia_neighbors"])
    out["num_neighbors"] = sizes["vecchia_neighbors"]
    _nuts(
        model,
        sizes["vecchia_n"],
        sizes["vecchia_chains"],
        sizes["vecchia_warmup"],
        sizes["vecchia_samples"],
        sizes["vecchia_tree_depth"],
        out,
        clock,
    )


def section_elliptical_slice(sizes, out, clock):
    """Elliptical slice sampling (infer.EllipticalSlice) of the Vecchia 2-layer DGP: seconds
    per step of all chains (vectorized) and per log density, compilation taken out."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from numpyro.infer import MCMC

    from numpyro_dgp.handlers import vecchia_layers
    from numpyro_dgp.infer import EllipticalSlice

    _set_x64(True)
    n, chains, steps = sizes["ess_n"], sizes["ess_chains"], sizes["ess_steps"]
    model = vecchia_layers(_two_layer_model(4), num_neighbors=sizes["vecchia_neighbors"])
    X = jnp.linspace(-1.0, 1.0, n)[:, None]
    y = jnp.sign(X[:, 0]) + 0.05 * jax.random.normal(jax.random.PRNGKey(1), (n,))
    out.update(N=n, chains=chains, num_neighbors=sizes["vecchia_neighbors"], steps=steps)
    mcmc = MCMC(
        EllipticalSlice(model),
        num_warmup=0,
        num_samples=steps,
        num_chains=chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    with CompileMeter() as meter:
        mcmc.run(jax.random.PRNGKey(0), X, y)
        jax.block_until_ready(mcmc.get_samples())
    seconds = meter.wall - meter.compile
    evaluations = float(np.mean(np.asarray(mcmc.get_extra_fields()["num_evaluations"])))
    out.update(
        sampling_seconds=seconds,
        compile_seconds=meter.compile,
        seconds_per_step=seconds / steps,
        mean_evaluations=evaluations,
        seconds_per_evaluation=seconds / (steps * evaluations),
    )


# (name, function, budget in seconds, what); the sizes are SIZES[mode]
SECTIONS = [
    Section(
        "matmul", section_matmul, 15, "matmul: float32 at default and highest precision; float64"
    ),
    Section("dsvi_step_float64", section_dsvi_step_float64, 50, "DSVI step, float64, per M"),
    Section(
        "dsvi_step_float32",
        section_dsvi_step_float32,
        60,
        "DSVI step, float32, per M at default and highest matmul precision; loss difference",
    ),
    Section(
        "nuts_exact", section_nuts_exact, 45, "NUTS on the exact 2-layer DGP, vectorized chains"
    ),
    Section("dsvi_epoch_n40000", section_dsvi_epoch, 40, "DSVI epoch (fit, one epoch a chunk)"),
    Section("vecchia_nuts", section_vecchia_nuts, 60, "NUTS on the Vecchia 2-layer DGP"),
    Section("elliptical_slice_n10000", section_elliptical_slice, 30, "elliptical slice sampling"),
]


# ---- running and reporting -----------------------------------------------------------------


def _on_alarm(signum, frame):
    raise SectionTimeout


def run_section(section, sizes, budget_s):
    """One section under its budget: ``{status, seconds, budget_s, result | reason | error}``."""
    out: dict = {}
    clock = Clock(budget_s)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, budget_s + GRACE)
    try:
        section.fn(sizes, out, clock)
        entry = {"status": "ok"}
    except Skip as exc:
        entry = {"status": "skipped", "reason": str(exc)}
    except SectionTimeout:
        entry = {
            "status": "timeout",
            "error": f"stopped after {clock.elapsed():.1f} s (budget {budget_s} s)",
        }
    except Exception as exc:  # recorded, and the next section runs
        entry = {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-3000:],
        }
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return {
        "name": section.name,
        "what": section.what,
        **entry,
        "seconds": clock.elapsed(),
        "budget_s": budget_s,
        "result": out,
    }


def environment() -> dict:
    import importlib.metadata as metadata
    import platform

    import jax

    versions = {"python": platform.python_version()}
    for dist in ("numpyro-dgp", "numpyro", "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "backend": jax.default_backend(),
        "versions": versions,
        "cpu_cores": os.cpu_count(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
        "env": {
            k: os.environ[k]
            for k in (
                "JAX_DISABLE_MOST_OPTIMIZATIONS",
                "JAX_DEFAULT_MATMUL_PRECISION",
                "XLA_FLAGS",
                "XLA_PYTHON_CLIENT_PREALLOCATE",
                "XLA_PYTHON_CLIENT_MEM_FRACTION",
                "JAX_PLATFORMS",
                "CUDA_VISIBLE_DEVICES",
            )
            if k in os.environ
        },
    }


def tests_entry(args) -> dict:
    """The test step of ``device_check.sh`` as the script passed it on."""
    if args.tests_rc is None:
        reason = (
            args.tests_skipped
            or "not run: benchmarks/device_check.sh runs the tests before this script"
        )
        return {
            "name": "tests",
            "status": "skipped",
            "reason": reason,
            "command": args.tests_command,
        }
    summary = ""
    if args.tests_log and Path(args.tests_log).is_file():
        lines = [ln for ln in Path(args.tests_log).read_text().splitlines() if ln.strip()]
        summary = lines[-1] if lines else ""
    status = (
        "ok" if args.tests_rc == 0 else ("timeout" if args.tests_rc in (124, 137) else "failed")
    )
    return {
        "name": "tests",
        "status": status,
        "rc": args.tests_rc,
        "command": args.tests_command,
        "seconds": args.tests_seconds,
        "summary": summary,
    }


def markdown(record) -> str:
    env = record["environment"]
    lines = [
        *header(
            "Device check",
            record["command"],
            env["machine"],
            f"{env['backend']} ({env['device_kind']})",
            record["date"],
            record["mode"],
        ),
        "",
        f"Devices: `{', '.join(env['devices'])}`",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        "",
        f"Default matmul precision: `{env['jax_default_matmul_precision']}`"
        + (f"; environment: `{env['env']}`" if env["env"] else ""),
        "",
    ]
    t = record["tests"]
    lines += [
        f"Tests: {t['status']}"
        + (f" ({t['seconds']:.0f} s): {t['summary']}" if t.get("seconds") else "")
        + (f" -- {t['reason']}" if t.get("reason") else "")
        + (f"; `{t['command']}`" if t.get("command") else ""),
        "",
    ]
    lines += table(
        ["section", "status", "seconds (budget)", "what"],
        [
            [
                s["name"],
                s["status"]
                + (f": {s.get('reason') or s.get('error')}" if s["status"] != "ok" else ""),
                f"{s['seconds']:.1f} ({s['budget_s']:.0f})",
                s["what"],
            ]
            for s in record["sections"]
        ],
    )
    lines += ["", *_headlines(record["sections"]), ""]
    lines += [
        "Each section's full numbers (and any traceback) are in the JSON file beside this one.",
        "",
    ]
    return "\n".join(lines)


def _headlines(sections) -> list[str]:
    """The headline rows of the sections that produced numbers."""
    rows = []
    by = {s["name"]: s["result"] for s in sections}
    mm = by.get("matmul", {})
    for label in ("float32_default", "float32_highest", "float64"):
        if label in mm:
            rows.append(
                [
                    "matmul",
                    f"{label}, n = {mm['n']}",
                    f"{mm[label]['gflops']:.0f} GFLOP/s",
                    f"max rel. error {mm[label]['max_rel_error']:.1e}",
                ]
            )
    for name in ("dsvi_step_float64", "dsvi_step_float32"):
        for key, row in by.get(name, {}).items():
            if not (isinstance(row, dict) and key.startswith("M")):
                continue
            for prec in ("default", "highest"):
                if prec in row:
                    r = row[prec]
                    rows.append(
                        [
                            name,
                            f"M = {row['M']}, {prec} precision",
                            f"{r['ms_per_step']:.2f} ms/step",
                            f"compile {r['compile_seconds']:.1f} s; "
                            f"loss at start {r['loss_at_start']:.6g}",
                        ]
                    )
            if "loss_difference" in row:
                rows.append(
                    [
                        name,
                        f"M = {row['M']}, loss default - highest",
                        f"{row['loss_difference']:.3g}",
                        f"relative {row['loss_relative_difference'] or 0.0:.2e}",
                    ]
                )
    for name in ("nuts_exact", "vecchia_nuts"):
        r = by.get(name, {})
        if "seconds_per_sample" in r:
            rows.append(
                [
                    name,
                    f"N = {r['N']}, {r['chains']} chains",
                    f"{r['seconds_per_sample'] * 1e3:.1f} ms/sample",
                    f"{r['mean_leapfrog_steps']:.1f} leapfrog steps/sample; compile "
                    + (
                        f"{r['compile_seconds']:.1f} s"
                        if r["compile_seconds"] is not None
                        else "not separated"
                    )
                    + f"; {r['divergences']} divergences",
                ]
            )
    ep = by.get("dsvi_epoch_n40000", {})
    for label in ("float32", "float64"):
        if label in ep:
            rows.append(
                [
                    "dsvi_epoch_n40000",
                    f"N = {ep['N']}, M = {ep['M']}, {label}",
                    f"{ep[label]['seconds_per_epoch']:.3f} s/epoch",
                    f"compile {ep[label]['compile_seconds']:.1f} s; "
                    f"{ep['steps_per_epoch']} steps of {ep['batch_size']}",
                ]
            )
    ess = by.get("elliptical_slice_n10000", {})
    if "seconds_per_step" in ess:
        rows.append(
            [
                "elliptical_slice_n10000",
                f"N = {ess['N']}, {ess['chains']} chains, m = {ess['num_neighbors']}",
                f"{ess['seconds_per_step'] * 1e3:.1f} ms/step",
                f"{ess['mean_evaluations']:.1f} log densities/step; "
                f"compile {ess['compile_seconds']:.1f} s",
            ]
        )
    return table(["section", "setting", "headline", "notes"], rows) if rows else ["(no numbers)"]


def write(record, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=2) + "\n")
    output.with_suffix(".md").write_text(markdown(record))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dry", action="store_true", help="tiny sizes on any machine; written to a temporary file"
    )
    parser.add_argument(
        "--output",
        type=Path,
        help=f"result file (.json; .md beside it; default {DEFAULT_OUTPUT}, "
        f"with --dry {DRY_OUTPUT})",
    )
    parser.add_argument("--sections", help="comma-separated section names to run (default: all)")
    parser.add_argument(
        "--total-budget",
        type=float,
        default=TOTAL_BUDGET,
        help="seconds for all sections; a section gets at most what is left (default %(default)s)",
    )
    parser.add_argument(
        "--command",
        dest="record_command",
        help="the command to record (device_check.sh passes its own)",
    )
    parser.add_argument("--tests-rc", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tests-log", help=argparse.SUPPRESS)
    parser.add_argument("--tests-seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--tests-command", help=argparse.SUPPRESS)
    parser.add_argument("--tests-skipped", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    output = (args.output or (DRY_OUTPUT if args.dry else DEFAULT_OUTPUT)).resolve()
    if args.dry and output == DEFAULT_OUTPUT.resolve():
        parser.error("--dry does not write over the committed result file; pass another --output")
    if output.suffix != ".json":
        parser.error("--output must end in .json")
    chosen = (
        SECTIONS
        if not args.sections
        else [s for s in SECTIONS if s.name in args.sections.split(",")]
    )
    sizes = SIZES["dry" if args.dry else "full"]
    if args.dry:
        # the dry run checks that the sections run, not their speed: skip XLA's costly
        # optimization passes, as the test suite does (set before JAX is imported)
        os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

    record = {
        "command": args.record_command or command("device_check.py", argv),
        "date": now(),
        "mode": "dry (tiny sizes)" if args.dry else "full",
        "environment": environment(),
        "tests": tests_entry(args),
        "sizes": sizes,
        "sections": [],
    }
    t_start = time.perf_counter()
    for section in chosen:
        left = args.total_budget - (time.perf_counter() - t_start)
        if left < 1.0:
            entry = {
                "name": section.name,
                "what": section.what,
                "status": "skipped",
                "seconds": 0.0,
                "budget_s": section.budget_s,
                "reason": "the total budget was spent",
                "result": {},
            }
        else:
            entry = run_section(section, sizes, min(section.budget_s, left))
        record["sections"].append(entry)
        print(
            f"{section.name}: {entry['status']} in {entry['seconds']:.1f} s"
            + (
                f" ({entry.get('reason') or entry.get('error')})" if entry["status"] != "ok" else ""
            ),
            flush=True,
        )
        write(record, output)  # after every section: a run stopped from outside keeps what finished
    record["total_seconds"] = time.perf_counter() - t_start
    write(record, output)
    print(f"wrote {output} and {output.with_suffix('.md')} ({record['total_seconds']:.1f} s)")
    failed = [s["name"] for s in record["sections"] if s["status"] in ("failed", "timeout")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

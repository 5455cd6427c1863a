"""Start-up: "fast from the first keystroke". Fresh processes, interleaved rounds, this machine.

For each configuration, every run a fresh process, the marks in seconds from the process's
launch:

* ``dsvi-f64``, ``dsvi-f32``: the kin8nm DSVI model of ``speed.py`` (2 layers, width 8,
  M = 100 k-means, whitened, inner q_sqrt x 1e-5, ``AutoFactorizedDGP`` + ``DGPElbo``,
  Adam 0.01, batch 1000 drawn inside the step, 1 sample), split 0, float64 / float32;
* ``amortized``: ``benchmarks/amortized.py``'s kin8nm AR2P configuration (``amortized_dgp``
  widths (16, 4, 1), per-point M = (8, 4, 4), ``AutoAmortizedDGP(rule="AR2P",
  num_branches=32)``, ``DGPElbo``, Adam 0.005, batch 100, random 8:1:1 split with seed 0,
  float64);
* ``chain``: the DSVI model with ``AutoChainDGP`` (float64);
* ``fit-f64``, ``fit-f32``: the DSVI model with no separate initialization:
  ``numpyro_dgp.fit(svi, rng_key, ...)`` initializes, compiling its first chunk beside the
  initialization's program (a second thread); its ``model init`` phase is only the model built,
  its ``first step`` the initialization not hidden behind the chunk's compile and the step;
* ``svi-init``: the DSVI model (float64) initialized with NumPyro's own ``svi.init`` (each
  operation run eagerly, as ``SVI.run`` does), not ``numpyro_dgp.infer.init``;
* ``dsvi-f64-warm``, ``dsvi-f32-warm``, ``svi-init-warm``: the same three with a warm persistent
  compilation cache (a second and later launch): the children share a fresh cache directory
  (``JAX_COMPILATION_CACHE_DIR``, with ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0`` so that
  the small eager programs are cached too), filled by the discarded warm-up runs and removed at
  the end;
* with ``--with-peers``: GPflux and GPyTorch (``benchmarks/peers``, ``--startup``) on the
  DSVI configuration in both precisions, in the same rounds.

Marks (ours): ``script_entry`` (this script's first statement: interpreter start), ``import``
(``import jax`` and ``numpyro_dgp``), ``data`` (``load_uci`` and the arrays on the device),
``init`` (model, guide and ``SVI`` built and initialized: ``numpyro_dgp.infer.init`` when the
package has it, else ``svi.init``, which is what ``fit`` runs before compiling), then one
``numpyro_dgp.fit(..., num_steps=1, chunk_size=1, init_state=...)``: its
``FitResult.compile_seconds`` is the first-step compile, and ``first_step`` (the end of that
call, the step's result on the host) is the time to the first finished step. The peers
report ``import``, ``data``, ``init`` (k-means and the model built) and ``first_step`` (for
GPflux the ``tf.function`` trace is inside it).

With ``--accuracy``: time to accuracy from process start. kin8nm split 0 less a validation part
(the last 10% of ``default_rng(0).permutation`` of the training rows, the same rows as
``peers/common.py``'s ``validation_indices``; everything standardized with the remaining
training rows' statistics); train and, every ``--check-every`` steps, compute the validation
log-likelihood in original units from the 100-sample predictive mixture; stop at the first
check >= ``--target-ll`` (or at ``--max-steps``). The evaluations are inside the wall clock (they
are part of reaching the accuracy); the test LL at that point is computed after the clock
stops. Ours in both precisions (``fit`` in chunks of ``--check-every`` steps) and, with
``--with-peers``, GPflux (``gpflux_kin8nm.py --until-ll``).

Process start: the parent writes its ``time.time()`` into ``$NUMPYRO_DGP_STARTUP_T0`` just
before it launches a child, so fork, exec and the interpreter's start are counted; a child run
by hand uses the kernel's start time from ``/proc/self/stat`` instead (10 ms ticks). Each
child also reports the difference of the two (a check on the origin). Cold cache: each child's
environment has no ``JAX_COMPILATION_CACHE_DIR`` (the ``-warm`` configurations': the shared
directory) and nothing here sets ``jax_compilation_cache_dir``; each child reports the cache
directory in effect at its end and the persistent-cache hits it saw (both shown in the table).

Usage::

    python benchmarks/startup.py --rounds 5 --with-peers --accuracy      # the full measurement
    python benchmarks/startup.py --rounds 1 --configs dsvi-f64           # one configuration, ours
    python benchmarks/startup.py --child dsvi-f64                        # one child, JSON on stdout

writes ``benchmarks/results/startup[_<tag>].{json,md}``.
"""

from __future__ import annotations

import time

_ENTRY = (time.time(), time.perf_counter())  # the script's first statement: the marks start here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from _harness import add_data_dir, command, header, machine, now, table, write_results  # noqa: E402

HERE = Path(__file__).resolve().parent

STARTUP_T0_ENV_VAR = "NUMPYRO_DGP_STARTUP_T0"  # as peers/common.py
PEER_SCRIPTS = {"gpflux": "gpflux_kin8nm.py", "gpytorch": "gpytorch_kin8nm.py"}  # as speed.py's PEERS
BATCH = 1000
AMORTIZED = {"widths": (16, 4, 1), "num_inducing": (8, 4, 4), "branches": 32, "lr": 0.005, "batch": 100}
VALID_FRACTION, VALID_SEED = 0.1, 0  # as peers/common.py
TARGETS = {"init_seconds": 2.0, "svi_init_seconds": 2.0, "first_step_ratio": 0.5,
           "amortized_compile_seconds": 8.0}

#: startup configurations: name -> (library, model, precision)
CONFIGS = {
    "dsvi-f64": ("numpyro_dgp", "dsvi", "float64"),
    "dsvi-f32": ("numpyro_dgp", "dsvi", "float32"),
    "amortized": ("numpyro_dgp", "amortized", "float64"),
    "chain": ("numpyro_dgp", "chain", "float64"),
    # the DSVI configuration fit straight away: fit initializes, compiling its first chunk beside
    # the initialization
    "fit-f64": ("numpyro_dgp", "dsvi", "float64"),
    "fit-f32": ("numpyro_dgp", "dsvi", "float32"),
    # the DSVI configuration initialized with NumPyro's own svi.init (what SVI.run does)
    "svi-init": ("numpyro_dgp", "dsvi", "float64"),
    # the same three launched again with a warm persistent compilation cache
    "dsvi-f64-warm": ("numpyro_dgp", "dsvi", "float64"),
    "dsvi-f32-warm": ("numpyro_dgp", "dsvi", "float32"),
    "svi-init-warm": ("numpyro_dgp", "dsvi", "float64"),
    "gpflux-f64": ("gpflux", "dsvi", "float64"),
    "gpflux-f32": ("gpflux", "dsvi", "float32"),
    "gpytorch-f64": ("gpytorch", "dsvi", "float64"),
    "gpytorch-f32": ("gpytorch", "dsvi", "float32"),
}
#: time-to-accuracy configurations
ACCURACY_CONFIGS = {
    "ll-dsvi-f64": ("numpyro_dgp", "dsvi", "float64"),
    "ll-dsvi-f32": ("numpyro_dgp", "dsvi", "float32"),
    "ll-gpflux-f64": ("gpflux", "dsvi", "float64"),
    "ll-gpflux-f32": ("gpflux", "dsvi", "float32"),
}
ALL_CONFIGS = {**CONFIGS, **ACCURACY_CONFIGS}
PRECISION_SHORT = {"float64": "f64", "float32": "f32"}
WARM = "-warm"  # suffix of the configurations run with a warm persistent compilation cache


def is_warm(config):
    return config.endswith(WARM)


# ----------------------------------------------------------------------------------------
# Child: clock (stdlib only, so that nothing heavy runs before the first marks)
# ----------------------------------------------------------------------------------------


def proc_start_wall():
    """Wall-clock time of this process's start from ``/proc/self/stat`` (``starttime``, field 22)
    and ``/proc/uptime``, or ``None``: as ``peers/common.py``'s ``proc_start_wall``."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class Clock:
    """Seconds since the process's launch (the parent's ``$NUMPYRO_DGP_STARTUP_T0``, else the
    kernel's start time); the same origin and marks as ``peers/common.py``'s ``StartupClock``."""

    def __init__(self, entry=_ENTRY):
        entry_wall, self._entry_perf = entry
        proc = proc_start_wall()
        env = os.environ.get(STARTUP_T0_ENV_VAR)
        if env:
            self.t0, self.source = float(env), "parent launch time ($" + STARTUP_T0_ENV_VAR + ")"
        elif proc is not None:
            self.t0, self.source = proc, "/proc/self/stat starttime"
        else:
            self.t0, self.source = entry_wall, "script entry (no /proc)"
        self._entry = entry_wall - self.t0
        self.proc_minus_origin = None if proc is None else proc - self.t0
        self.marks = {"script_entry": self._entry}

    def now(self):
        return self._entry + time.perf_counter() - self._entry_perf

    def mark(self, name):
        self.marks[name] = self.now()
        return self.marks[name]

    def info(self):
        return {"source": self.source, "proc_minus_origin": self.proc_minus_origin}


class XlaLog:
    """Counts XLA backend compilations, their seconds and jaxpr tracing seconds (``jax.monitoring``),
    and persistent-cache hits; ``snapshot()`` at each mark."""

    def __init__(self):
        from jax import monitoring

        self.count, self.seconds, self.trace_seconds, self.cache_hits = 0, 0.0, 0.0, 0
        self.snapshots = {}
        monitoring.register_event_duration_secs_listener(self._duration)
        monitoring.register_event_listener(self._event)

    def _duration(self, event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1
            self.seconds += duration
        elif event == "/jax/core/compile/jaxpr_trace_duration":
            self.trace_seconds += duration

    def _event(self, event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            self.cache_hits += 1

    def snapshot(self, name):
        self.snapshots[name] = {"compiles": self.count, "compile_seconds": round(self.seconds, 4),
                                "trace_seconds": round(self.trace_seconds, 4)}


def max_rss_mib():
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    except (ImportError, OSError):
        return None


# ----------------------------------------------------------------------------------------
# Child: ours
# ----------------------------------------------------------------------------------------


def validation_indices(num_train, fraction=VALID_FRACTION, seed=VALID_SEED):
    """Mirror of ``peers/common.py``'s ``validation_indices``: ``(fit rows, validation rows)`` as
    sorted positions into the training split; the validation rows are the last
    ``round(fraction * N)`` of ``np.random.default_rng(seed).permutation(N)``."""
    import numpy as np

    perm = np.random.default_rng(int(seed)).permutation(int(num_train))
    num_valid = int(round(fraction * num_train))
    if not 0 < num_valid < num_train:
        raise ValueError(f"validation part of {num_valid} rows out of {num_train}")
    return np.sort(perm[: num_train - num_valid]), np.sort(perm[num_train - num_valid:])


def validation_split(data):
    """``(X_fit, y_fit, X_valid, y_valid, X_test, y_test, y_std)`` from a ``load_uci`` split, in
    float64, standardized with the fit rows' statistics (population std, 1 for a constant column,
    as ``load_uci``). The raw values are recovered from ``load_uci``'s standardized arrays and
    statistics (float64 round-off, ~1e-16 relative)."""
    import numpy as np

    X = data.X_train.astype(np.float64) * data.x_std + data.x_mean
    y = data.y_train.astype(np.float64) * data.y_std + data.y_mean
    Xt = data.X_test.astype(np.float64) * data.x_std + data.x_mean
    yt = data.y_test.astype(np.float64) * data.y_std + data.y_mean
    fit, valid = validation_indices(len(y))

    def stats(v):
        s = v.std(axis=0)
        return v.mean(axis=0), np.where(s > 0, s, 1.0)

    x_mean, x_std = stats(X[fit])
    y_mean, y_std = stats(y[fit])
    return ((X[fit] - x_mean) / x_std, (y[fit] - y_mean) / y_std, (X[valid] - x_mean) / x_std,
            (y[valid] - y_mean) / y_std, (Xt - x_mean) / x_std, (yt - y_mean) / y_std, float(y_std))


def _initializer(dgp):
    """The package's public initializer when it has one (``numpyro_dgp.infer.init``,
    ``numpyro_dgp.init``), else ``None`` (then ``svi.init``, what ``fit`` runs today)."""
    for owner, name in ((dgp.infer, "init"), (dgp, "init")):
        fn = getattr(owner, name, None)
        if callable(fn):
            return fn, f"{owner.__name__}.{name}"
    return None, None


def _initialize(dgp, svi, rng_key, args, kwargs):
    """``(state, how)``: ``numpyro_dgp.infer.init(svi, rng_key, *args, **kwargs)`` when present and
    its signature takes those arguments, else ``svi.init(rng_key, *args, **kwargs)``."""
    import inspect

    fn, name = _initializer(dgp)
    if fn is not None:
        try:
            inspect.signature(fn).bind(svi, rng_key, *args, **kwargs)
        except (TypeError, ValueError) as e:
            return svi.init(rng_key, *args, **kwargs), f"svi.init ({name} present, but does not take (svi, rng_key, *args, **kwargs): {e})"
        return fn(svi, rng_key, *args, **kwargs), name
    return svi.init(rng_key, *args, **kwargs), "svi.init"


def child(config, data_dir, until_ll=None, check_every=250, max_steps=20000):
    """One fresh-process run of ours: the start-up marks, or (``until_ll``) the time to accuracy."""
    clock = Clock()
    _, model_name, precision = ALL_CONFIGS[config]
    import jax

    if precision == "float64":
        jax.config.update("jax_enable_x64", True)
    xla = XlaLog()
    clock.mark("import_jax")
    import jax.numpy as jnp
    import numpyro

    import numpyro_dgp as dgp

    clock.mark("import")
    xla.snapshot("import")
    cache_dir_at_import = jax.config.jax_compilation_cache_dir
    dtype = jnp.float64 if precision == "float64" else jnp.float32

    # ---- data -----------------------------------------------------------------------------
    if model_name == "amortized":  # as benchmarks/amortized.py: random 8:1:1 split, seed 0
        data = dgp.datasets.random_uci_split("kin8nm", 0, data_dir=data_dir)
    else:
        data = dgp.datasets.load_uci("kin8nm", 0, data_dir=data_dir)
    if until_ll is not None:
        X_np, y_np, Xv_np, yv_np, Xt_np, yt_np, y_std = validation_split(data)
    else:
        X_np, y_np, y_std = data.X_train, data.y_train, data.y_std
    clock.mark("data_files")
    X, y = jnp.asarray(X_np, dtype), jnp.asarray(y_np, dtype)
    jax.block_until_ready((X, y))
    clock.mark("data")
    xla.snapshot("data")

    # ---- model, guide, SVI, initialization -----------------------------------------------
    from numpyro.infer import SVI

    if model_name == "amortized":
        model = dgp.models.amortized_dgp(widths=AMORTIZED["widths"], num_inducing=AMORTIZED["num_inducing"])
        guide = dgp.guides.AutoAmortizedDGP(model, rule="AR2P", num_branches=AMORTIZED["branches"])
        svi = SVI(model, guide, numpyro.optim.Adam(AMORTIZED["lr"]), dgp.DGPElbo())
        fit_args, fit_kwargs = (X, y, AMORTIZED["batch"]), {}  # as amortized.py: batch size positional
    else:
        model = dgp.models.deep_gp_regression(2, num_inducing=100, hidden_width=8)
        guide = (dgp.guides.AutoChainDGP if model_name == "chain" else dgp.guides.AutoFactorizedDGP)(model)
        svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
        fit_args, fit_kwargs = (X, y), {"batch_size": BATCH}
    rng_key = jax.random.PRNGKey(0)
    if config.removesuffix(WARM) == "svi-init":
        state, init_how = svi.init(rng_key, *fit_args, **fit_kwargs), "svi.init"
    elif config.startswith("fit-"):
        state, init_how = None, "fit (no separate initialization)"
    else:
        state, init_how = _initialize(dgp, svi, rng_key, fit_args, fit_kwargs)
    jax.block_until_ready(state)
    clock.mark("init")
    xla.snapshot("init")

    result = {
        "config": config, "library": "numpyro_dgp", "precision": precision,
        "version": f"numpyro_dgp {dgp.__version__}, numpyro {numpyro.__version__}, jax {jax.__version__}",
        "init_fn": init_how,
    }
    if until_ll is None:
        # ---- first step: fit's compile, then the step; the result on the host ends fit ------
        fitted = dgp.fit(svi, rng_key, *fit_args, num_steps=1, chunk_size=1, progress_bar=False, init_state=state,
                         **fit_kwargs)
        clock.mark("first_step")
        xla.snapshot("first_step")
        result.update(mode="startup", compile_seconds=fitted.compile_seconds,
                      first_loss=float(fitted.losses[0]), num_skipped=int(fitted.num_skipped))
    else:
        Xv, yv = jnp.asarray(Xv_np, dtype), jnp.asarray(yv_np, dtype)
        steps, history, eval_seconds, compile_seconds, ll, reached = 0, [], 0.0, None, None, False
        while steps < max_steps:
            n = min(check_every, max_steps - steps)
            fitted = dgp.fit(svi, rng_key, *fit_args, num_steps=n, chunk_size=check_every, progress_bar=False,
                             init_state=state, **fit_kwargs)
            state, steps = fitted.state, steps + n
            compile_seconds = fitted.compile_seconds if compile_seconds is None else compile_seconds
            if steps == n:
                clock.mark("first_chunk")
            t0 = time.perf_counter()
            pred = dgp.predict(model, guide, fitted.params, jax.random.PRNGKey(1), Xv, num_samples=100)
            ll = float(dgp.metrics(pred, yv, y_scale=y_std)["log_likelihood"])
            eval_seconds += time.perf_counter() - t0
            history.append({"step": steps, "seconds": round(clock.now(), 3), "valid_ll": round(ll, 5)})
            print(f"  step {steps}: validation LL {ll:.4f} at {clock.now():.1f} s", file=sys.stderr, flush=True)
            if ll >= until_ll:
                reached = True
                break
        seconds = clock.mark("target" if reached else "gave_up")
        xla.snapshot("end")
        # test LL of the parameters at the deciding check, after the clock stopped
        pred = dgp.predict(model, guide, fitted.params, jax.random.PRNGKey(1), jnp.asarray(Xt_np, dtype), num_samples=100)
        test = dgp.metrics(pred, jnp.asarray(yt_np, dtype), y_scale=y_std)
        result.update(mode="until_ll", target_ll=until_ll, check_every=check_every, max_steps=max_steps,
                      reached=reached, steps=steps, seconds=seconds, valid_ll=ll, eval_seconds=eval_seconds,
                      history=history, compile_seconds=compile_seconds, test_ll=float(test["log_likelihood"]),
                      test_rmse=float(test["rmse"]), num_fit=int(len(y_np)), num_valid=int(len(yv_np)))
    result.update(
        marks=clock.marks, clock=clock.info(), xla=xla.snapshots,
        cache={"dir_at_import": cache_dir_at_import, "dir_at_end": jax.config.jax_compilation_cache_dir,
               "hits": xla.cache_hits, "env": os.environ.get("JAX_COMPILATION_CACHE_DIR")},
        max_rss_mib=max_rss_mib(),
    )
    return result


# ----------------------------------------------------------------------------------------
# Parent
# ----------------------------------------------------------------------------------------


def child_command(config, args):
    """The command line of one fresh-process run of ``config``."""
    library, _, precision = ALL_CONFIGS[config]
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    accuracy = config in ACCURACY_CONFIGS
    until = ["--until-ll", str(args.target_ll), "--check-every", str(args.check_every),
             "--max-steps", str(args.max_steps)] if accuracy else []
    if library == "numpyro_dgp":
        return [sys.executable, str(Path(__file__).resolve()), "--child", config] + until + data
    from speed import peers_python

    return ([str(peers_python(library)), str(HERE / "peers" / PEER_SCRIPTS[library]), "--precision", precision]
            + (until if accuracy else ["--startup"]) + data)


def child_env(cache_dir=None):
    """The parent's environment without a persistent compilation cache, or with ``cache_dir`` as
    one that keeps every program (however short its compile); the launch time is added per run."""
    env = dict(os.environ)
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "JAX_ENABLE_COMPILATION_CACHE",
                 "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", STARTUP_T0_ENV_VAR):
        env.pop(name, None)
    if cache_dir is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def run_child(config, args):
    """Run ``config`` in a fresh process: its JSON record, or ``{"error": ...}``."""
    cmd = child_command(config, args)
    env = child_env(args.cache_dir if is_warm(config) else None)
    env[STARTUP_T0_ENV_VAR] = repr(time.time())  # just before the launch: the child's origin
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        status = (f"killed by signal {-out.returncode}" + (" (out of memory?)" if out.returncode == -9 else "")
                  if out.returncode < 0 else f"exit {out.returncode}")
        return {"config": config, "error": f"{status}: " + (out.stderr.strip().splitlines() or ["(no stderr)"])[-1],
                "stderr_tail": out.stderr[-3000:], "wall_seconds": wall}
    result = json.loads(lines[-1])
    result["config"] = config
    result["wall_seconds"] = wall  # the parent's view: launch to exit
    return result


def round_order(configs, r):
    """Round ``r``'s order: the list rotated by ``r`` places."""
    k = r % len(configs) if configs else 0
    return configs[k:] + configs[:k]


# ----------------------------------------------------------------------------------------
# Summaries, verdicts and the table (pure functions of the record: tested in benchmarks/tests)
# ----------------------------------------------------------------------------------------


def phases(result):
    """Seconds per start-up phase of one run, from its marks: ``interpreter`` (launch to the
    script's first statement), ``import``, ``data``, ``init`` (ours: model, guide, SVI and
    initialization; peers: k-means and model), ``compile`` (ours: ``fit``'s compile; peers:
    ``None``), ``step`` (the rest of the first step: ours ``fit`` less its compile; GPflux includes
    the trace), ``total`` (launch to the first finished step)."""
    m = result["marks"]
    compile_s = result.get("compile_seconds") if result.get("library") == "numpyro_dgp" else None
    return {
        "interpreter": m["script_entry"],
        "import": m["import"] - m["script_entry"],
        "data": m["data"] - m["import"],
        "init": m["init"] - m["data"],
        "compile": compile_s,
        "step": m["first_step"] - m["init"] - (compile_s or 0.0),
        "total": m["first_step"],
    }


def _ok(run):
    return "error" not in run


def runs_of(record, config):
    return [run for run in record["runs"] if run["config"] == config and _ok(run)]


def _median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])


def _cell(values, spec=".2f"):
    """``median (min–max)`` of the values (``–`` if none; one value alone)."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(_median(values), spec)} ({format(min(values), spec)}–{format(max(values), spec)})"


def _same_round_pairs(record, ours, peer, value):
    """``[(round, value(ours run), value(peer run))]`` for rounds where both ran without error."""
    by_round = {}
    for run in record["runs"]:
        if run["config"] in (ours, peer) and _ok(run):
            by_round.setdefault(run["round"], {})[run["config"]] = run
    return [(r, value(d[ours]), value(d[peer])) for r, d in sorted(by_round.items()) if ours in d and peer in d]


def _accuracy_seconds(run):
    return run["seconds"] if run.get("reached") else float("inf")


def _ratio(a, b):
    if a == float("inf"):
        return float("inf")
    if b == float("inf"):
        return 0.0  # ours reached the target, the peer did not
    return a / b


def first_step_ratios(record, precision, warm=False, variant="dsvi"):
    """Ours' (DSVI, ``warm``: with a warm compilation cache; ``variant="fit"``: ``fit`` straight
    away) launch-to-first-step over GPflux's in the same round, per round."""
    short = PRECISION_SHORT[precision]
    return [a / b for _, a, b in _same_round_pairs(record, f"{variant}-{short}" + (WARM if warm else ""),
                                                    f"gpflux-{short}", lambda run: phases(run)["total"])]


def accuracy_ratios(record, precision):
    """Ours' seconds to the target LL over GPflux's in the same round (``inf``: ours not reached;
    0: only GPflux not reached)."""
    short = PRECISION_SHORT[precision]
    return [_ratio(a, b) for _, a, b in _same_round_pairs(record, f"ll-dsvi-{short}", f"ll-gpflux-{short}",
                                                          _accuracy_seconds)]


def verdicts(record):
    """``[(target, met: True | False | None (not measured), text)]`` for the must-show targets."""
    out = []
    for config, key, text in (("dsvi-f64", "init_seconds", "kin8nm DSVI model initialization"),
                              ("svi-init", "svi_init_seconds", "the same model initialized by NumPyro's svi.init")):
        limit = TARGETS[key]
        name = f"{text} <= {limit:g} s (float64, fresh process, cold cache)"
        runs = runs_of(record, config)
        init = [phases(run)["init"] for run in runs]
        if not init:
            out.append((name, None, "not measured in this run"))
            continue
        med = _median(init)
        warm = [run for run in runs if (run.get("cache") or {}).get("hits") or (run.get("cache") or {}).get("dir_at_end")]
        out.append((name, med <= limit and not warm,
                    f"median {med:.2f} s over {len(init)} runs (range {min(init):.2f}–{max(init):.2f})"
                    + (f"; {len(warm)} of them had a persistent compilation cache in effect: not a cold-cache measurement"
                       if warm else "")))
    limit = TARGETS["first_step_ratio"]
    for precision in ("float64", "float32"):
        ratios = first_step_ratios(record, precision)
        name = f"process start to first finished step <= {limit:g}x GPflux's in the same round ({precision})"
        if ratios:
            med = _median(ratios)
            short = PRECISION_SHORT[precision]
            ours = _median([phases(r)["total"] for r in runs_of(record, f"dsvi-{short}")])
            theirs = _median([phases(r)["total"] for r in runs_of(record, f"gpflux-{short}")])
            out.append((name, med <= limit, f"ratio {med:.2f}x, median over {len(ratios)} rounds (range "
                        f"{min(ratios):.2f}–{max(ratios):.2f}); ours {ours:.2f} s, GPflux {theirs:.2f} s"))
        else:
            out.append((name, None, "not measured in this run"))
    compile_s = [run["compile_seconds"] for run in runs_of(record, "amortized")]
    limit = TARGETS["amortized_compile_seconds"]
    name = f"amortized first-step compile <= {limit:g} s"
    if compile_s:
        med = _median(compile_s)
        out.append((name, med <= limit, f"median {med:.2f} s over {len(compile_s)} runs (range "
                    f"{min(compile_s):.2f}–{max(compile_s):.2f})"))
    else:
        out.append((name, None, "not measured in this run"))
    for precision in ("float64", "float32"):
        target = _target_ll(record)
        name = f"time from process start to kin8nm validation LL >= {target:g} below GPflux's in the same round ({precision})"
        ratios = accuracy_ratios(record, precision)
        if ratios:
            med = _median(ratios)
            short = PRECISION_SHORT[precision]
            ours = _median([_accuracy_seconds(r) for r in runs_of(record, f"ll-dsvi-{short}")])
            theirs = _median([_accuracy_seconds(r) for r in runs_of(record, f"ll-gpflux-{short}")])
            out.append((name, med < 1.0, f"ratio {_fmt_ratio(med)}, median over {len(ratios)} rounds (range "
                        f"{_fmt_ratio(min(ratios))}–{_fmt_ratio(max(ratios))}); ours {_fmt_s(ours)}, GPflux {_fmt_s(theirs)}"))
        else:
            out.append((name, None, "not measured in this run"))
    return out


def _target_ll(record):
    return record.get("settings", {}).get("target_ll", 1.25)


def _fmt_ratio(x):
    return "∞ (ours not reached)" if x == float("inf") else ("0 (GPflux not reached)" if x == 0.0 else f"{x:.2f}x")


def _fmt_s(x):
    return "not reached" if x is None or x == float("inf") else f"{x:.1f} s"


def render(record):
    """The Markdown report of a record (``write_markdown`` writes it)."""
    rounds = record.get("settings", {}).get("rounds", "?")
    lines = [
        *header("Start-up at the kin8nm configuration: time to the first step and to accuracy", record["command"],
                record["machine"], f"{record['date']}  ", compact=True),
        "Versions: " + "; ".join(f"{k}: {v}" for k, v in record.get("versions", {}).items()),
        "",
        f"Every run a fresh process; {rounds} round{'' if rounds == 1 else 's'}, each running every configuration once in an order "
        "rotated by one place per round. Seconds from the process's launch: the parent's `time.time()` just "
        "before it starts the child (fork, exec and the interpreter's start included). Cells: median "
        "(min–max) over rounds. Cold compilation cache: the children's environment has no "
        "`JAX_COMPILATION_CACHE_DIR` and nothing sets `jax_compilation_cache_dir`"
        + _cache_note(record) + ". Python's bytecode and the OS file cache are as any second run leaves them"
        + (f" ({record['settings']['warmup_runs']} discarded run(s) of each start-up configuration before the rounds)."
           if record.get("settings", {}).get("warmup_runs") else ".") + _warm_note(record),
        "",
        "Ours: `dsvi-*` the kin8nm DSVI model of `speed.py` (2 layers, width 8, M = 100, batch 1000, Adam 0.01, "
        "`AutoFactorizedDGP` + `DGPElbo`), `chain` the same with `AutoChainDGP` (float64), `svi-init` the "
        "`dsvi-f64` model initialized by NumPyro's `svi.init` (what `SVI.run` runs), `*-warm` the same launched "
        "again with a warm persistent compilation cache, `amortized` "
        "`amortized.py`'s kin8nm AR2P (widths (16, 4, 1), per-point M = (8, 4, 4), 32 branches, batch 100, "
        "Adam 0.005, float64). Phases: interpreter = launch to the script's first statement; import = to "
        "`numpyro_dgp` (peers: TensorFlow + GPflow + GPflux / torch + GPyTorch) imported; data = "
        "`load_uci` and the arrays on the device; model init = model, guide and `SVI` built and initialized "
        f"({_init_fn_note(record)}; peers: k-means and the model built); first-step compile = "
        "`FitResult.compile_seconds` of `fit(..., num_steps=1, chunk_size=1)` (peers: inside their first "
        "step; GPflux traces its `tf.function` there); first step = the rest of that `fit` call (its "
        "checks, the step, the result on the host); total = launch to the first finished step.",
        "",
    ]
    rows = []
    for config in record["configs"]:
        if config not in CONFIGS:
            continue
        rs = runs_of(record, config)
        ph = [phases(r) for r in rs]

        def col(key, ph=ph):
            return _cell([p[key] for p in ph])

        xla_init = [_xla_delta(r, "data", "init") for r in rs if r.get("xla")]
        xla_cell = "–" if not xla_init else (
            f"{_median([x[0] for x in xla_init]):.0f} / {_median([x[1] for x in xla_init]):.2f}")
        rows.append([config, f"{len(rs)}{_failed(record, config)}", col("interpreter"), col("import"), col("data"),
                     col("init"), col("compile"), col("step"), col("total"), xla_cell,
                     _cell([r.get("max_rss_mib") for r in rs], ".0f")])
    lines += table(["configuration", "runs", "interpreter", "import", "data", "model init", "first-step compile",
                    "first step", "launch → first finished step", "XLA compiles in init (n / s)", "peak RSS (MiB)"],
                   rows)

    rows = []
    variants = (("dsvi", False, ""), ("dsvi", True, ", ours with a warm cache"),
                ("fit", False, ", ours `fit` straight away"))
    for variant, warm, label in variants:
        for precision in ("float64", "float32"):
            short = PRECISION_SHORT[precision]
            ours = f"{variant}-{short}" + (WARM if warm else "")
            if (warm or variant == "fit") and ours not in record["configs"]:
                continue
            ratios = first_step_ratios(record, precision, warm, variant)
            totals = {c: _cell([phases(r)["total"] for r in runs_of(record, c)])
                      for c in (ours, f"gpflux-{short}", f"gpytorch-{short}")}
            rows.append([precision + label, totals[ours], totals[f"gpflux-{short}"],
                         totals[f"gpytorch-{short}"], _cell(ratios, ".2f"),
                         "–" if warm else f"<= {TARGETS['first_step_ratio']:g}"])
    lines += ["", "## Ours against GPflux in the same round: launch to the first finished step", "",
              *table(["precision", "ours (DSVI)", "GPflux", "GPyTorch", "ours / GPflux, same round", "target"], rows)]

    if any(c in ACCURACY_CONFIGS for c in record["configs"]):
        s = record.get("settings", {})
        sizes = sorted({(r.get("num_fit"), r.get("num_valid")) for r in record["runs"]
                        if _ok(r) and r.get("mode") == "until_ll"})
        held = ", ".join(f"{v} of {f + v}" for f, v in sizes if f and v) or "10%"
        lines += ["", "## Time to accuracy from process start", "",
                  f"kin8nm split 0 less a validation part ({held} of its training rows: the last "
                  f"10% of `default_rng({VALID_SEED}).permutation`, the same rows for ours and GPflux; standardized with "
                  "the remaining rows' statistics). Validation LL in original units from the 100-sample predictive "
                  f"mixture every {s.get('check_every', '?')} steps; stop at the first check >= {_target_ll(record):g} "
                  f"(cap {s.get('max_steps', '?')} steps). The checks are inside the wall clock; the test LL of the "
                  "parameters at that check is computed after the clock stops.",
                  ""]
        rows = []
        for config in record["configs"]:
            if config not in ACCURACY_CONFIGS:
                continue
            rs = runs_of(record, config)
            reached = [r for r in rs if r.get("reached")]
            rows.append([config, f"{len(reached)} / {len(rs)}{_failed(record, config)}",
                         _cell([r["seconds"] for r in reached], ".1f") if reached else "not reached",
                         _cell([r["steps"] for r in rs], ".0f"), _cell([r.get("eval_seconds") for r in rs], ".1f"),
                         _cell([r.get("valid_ll") for r in rs], ".3f"), _cell([r.get("test_ll") for r in rs], ".3f"),
                         _cell([r.get("test_rmse") for r in rs], ".4f")])
        lines += table(["configuration", "reached / runs", "seconds from launch", "steps", "checks' seconds",
                        "validation LL at stop", "test LL at stop", "test RMSE at stop"], rows)
        for precision in ("float64", "float32"):
            ratios = accuracy_ratios(record, precision)
            if ratios:
                finite = [x for x in ratios if x not in (0.0, float("inf"))]
                lines.append("")
                lines.append(f"Ours / GPflux, same round ({precision}): median {_fmt_ratio(_median(ratios))} over "
                             f"{len(ratios)} rounds" + (f"; finite ratios {_cell(finite, '.2f')}" if finite else ""))

    lines += ["", "## Targets", ""]
    for name, met, text in verdicts(record):
        word = "not measured" if met is None else ("met" if met else "NOT met")
        lines.append(f"- {name}: **{word}** ({text})")

    ours = [c for c in record["configs"] if c in CONFIGS and CONFIGS[c][0] == "numpyro_dgp"]
    if ours:
        lines += ["", "## Ours: XLA compilations and tracing per phase (median over rounds)", "",
                  "Counted with `jax.monitoring` (backend compilations and jaxpr tracing) in the same processes: "
                  "many small compilations in a phase are eager operations each compiled on its own.", ""]
        rows = []
        for config in ours:
            rs = [r for r in runs_of(record, config) if r.get("xla")]
            for phase, (a, b) in {"import": (None, "import"), "data": ("import", "data"), "model init": ("data", "init"),
                                  "first step (compile + step)": ("init", "first_step")}.items():
                deltas = [_xla_delta(r, a, b) for r in rs]
                deltas = [d for d in deltas if d is not None]
                secs = [(r["marks"][b] - (r["marks"][a] if a else r["marks"]["script_entry"])) for r in rs]
                if deltas:
                    rows.append([config, phase, _cell(secs), _cell([d[0] for d in deltas], ".0f"),
                                 _cell([d[1] for d in deltas]), _cell([d[2] for d in deltas])])
        lines += table(["configuration", "phase", "seconds", "XLA compilations", "backend compile (s)",
                        "jaxpr tracing (s)"], rows)

    failed = [run for run in record["runs"] if not _ok(run)]
    if failed:
        lines += ["", "## Failed runs", ""] + [f"- round {run.get('round')}, {run['config']}: {run['error']}" for run in failed]
    lines.append("")
    return "\n".join(lines)


def _xla_delta(run, a, b):
    """``(compiles, backend seconds, trace seconds)`` between snapshots ``a`` (``None``: process start)
    and ``b``, or ``None``."""
    x = run.get("xla") or {}
    if b not in x or (a is not None and a not in x):
        return None
    zero = {"compiles": 0, "compile_seconds": 0.0, "trace_seconds": 0.0}
    lo = x[a] if a is not None else zero
    return (x[b]["compiles"] - lo["compiles"], x[b]["compile_seconds"] - lo["compile_seconds"],
            x[b]["trace_seconds"] - lo["trace_seconds"])


def _failed(record, config):
    n = sum(1 for run in record["runs"] if run["config"] == config and not _ok(run))
    return f" ({n} failed)" if n else ""


def _cache_note(record):
    ours = [run for run in record["runs"] if _ok(run) and run.get("cache") and not is_warm(run["config"])]
    if not ours:
        return ""
    dirs = {run["cache"].get("dir_at_end") for run in ours} | {run["cache"].get("dir_at_import") for run in ours}
    hits = sum(run["cache"].get("hits", 0) for run in ours)
    if dirs == {None} and hits == 0:
        return " (every run of ours reported no cache directory in effect and 0 persistent-cache hits)"
    return (f" — BUT runs of ours reported cache directories {sorted(str(d) for d in dirs)} and {hits} persistent-cache "
            "hits: these runs are not cold")


def _warm_note(record):
    """How warm the ``-warm`` runs' cache was (their persistent-cache hits), or ``""``."""
    warm = [run for run in record["runs"] if _ok(run) and is_warm(run["config"]) and run.get("cache")]
    if not warm:
        return ""
    hits = [run["cache"].get("hits", 0) for run in warm]
    size = record.get("warm_cache")
    cold = [run for run in warm if not run["cache"].get("hits") or not run["cache"].get("dir_at_end")]
    return (f" The `-warm` configurations ran with a persistent compilation cache (`JAX_COMPILATION_CACHE_DIR`, "
            "`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0`) that the discarded runs filled: a second and later "
            f"launch; {min(hits)}–{max(hits)} persistent-cache hits per run"
            + (f"; the cache held {size['files']} files, {size['bytes'] / 2**20:.1f} MiB, after the warm-up" if size else "")
            + "." + (f" BUT {len(cold)} of them reported no cache directory or no hits: not warm." if cold else "")
            + (" Failed warm-up runs: " + "; ".join(record["warmup_failures"]) + "." if record.get("warmup_failures")
               else ""))


def _init_fn_note(record):
    how = sorted({run.get("init_fn") for run in record["runs"] if _ok(run) and run.get("init_fn")})
    return "initialized with " + ", ".join(f"`{h}`" for h in how) if how else "`svi.init`"


def write_markdown(path, record):
    Path(path).write_text(render(record))


# ----------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup-runs", type=int, default=1,
                        help="discarded runs of each start-up configuration before the rounds, so that Python's "
                             "bytecode and the OS file cache are as a second run leaves them for every library")
    parser.add_argument("--with-peers", action="store_true", help="also GPflux and GPyTorch (benchmarks/peers)")
    parser.add_argument("--accuracy", action="store_true",
                        help="add the time-to-accuracy runs (ours in both precisions; GPflux with --with-peers)")
    parser.add_argument("--configs", default=None,
                        help=f"comma-separated subset of {','.join(ALL_CONFIGS)} (default: all that the flags select)")
    parser.add_argument("--target-ll", type=float, default=1.25, help="time to accuracy: validation LL target (original units)")
    parser.add_argument("--check-every", type=int, default=250, help="time to accuracy: steps between checks")
    parser.add_argument("--max-steps", type=int, default=20000, help="time to accuracy: give up after this many steps")
    add_data_dir(parser)
    parser.add_argument("--tag", default="", help="results file suffix: results/startup_<tag>.{json,md}")
    parser.add_argument("--child", choices=list(ALL_CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--until-ll", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.cache_dir = None
    if args.child:
        if args.until_ll is None and args.child in ACCURACY_CONFIGS:
            args.until_ll = args.target_ll
        print(json.dumps(child(args.child, args.data_dir, args.until_ll, args.check_every, args.max_steps)), flush=True)
        return

    if args.configs:
        configs = args.configs.split(",")
        unknown = [c for c in configs if c not in ALL_CONFIGS]
        if unknown:
            parser.error(f"unknown configurations {unknown}; choose from {list(ALL_CONFIGS)}")
    else:
        configs = [c for c, (lib, _, _) in CONFIGS.items() if lib == "numpyro_dgp" or args.with_peers]
        if args.accuracy:
            configs += [c for c, (lib, _, _) in ACCURACY_CONFIGS.items() if lib == "numpyro_dgp" or args.with_peers]
    if any(is_warm(c) for c in configs):
        if args.warmup_runs < 1:
            parser.error("the -warm configurations need --warmup-runs >= 1 (the discarded runs fill their cache)")
    peers = sorted({ALL_CONFIGS[c][0] for c in configs} - {"numpyro_dgp"})
    if peers:
        from speed import peers_python

        if not all(peers_python(lib).exists() for lib in peers):
            subprocess.run(["bash", str(HERE / "peers" / "setup.sh")], check=True)

    stem = f"startup_{args.tag}" if args.tag else "startup"
    record = {
        "command": command("startup.py", argv),
        "machine": machine(with_jax=False),  # JAX is the children's: the parent does not import it
        "date": now(),
        "settings": {"rounds": args.rounds, "warmup_runs": args.warmup_runs, "target_ll": args.target_ll, "check_every": args.check_every,
                     "max_steps": args.max_steps,
                     "env": {k: v for k, v in os.environ.items() if k.startswith(("JAX_", "XLA_"))}},
        "configs": configs,
        "versions": {},
        "runs": [],
    }
    if any(is_warm(c) for c in configs):
        args.cache_dir = tempfile.mkdtemp(prefix="startup_jax_cache_")
    try:
        _run_rounds(configs, args, record, stem)
    finally:
        if args.cache_dir:
            shutil.rmtree(args.cache_dir, ignore_errors=True)
    print(render(record))


def _run_rounds(configs, args, record, stem):
    """The discarded warm-up runs, then the rounds, ``record`` and its files updated after each run."""
    # A library's first launch after its files left the OS cache is slower (TensorFlow's import:
    # 7.5 s against 4.2-4.5 s in one such run), and would favour whoever ran second.
    for _ in range(args.warmup_runs):
        for config in configs:
            if config not in ACCURACY_CONFIGS:
                result = run_child(config, args)
                if "error" in result:  # a -warm configuration's cache may be incomplete: said in the report
                    record.setdefault("warmup_failures", []).append(f"{config}: {result['error']}")
                    print(f"warm-up {config}: FAILED {result['error']}", flush=True)
    if args.cache_dir:
        files = [f for f in Path(args.cache_dir).rglob("*") if f.is_file()]
        record["warm_cache"] = {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}
    for r in range(args.rounds):
        for i, config in enumerate(round_order(configs, r)):
            result = run_child(config, args)
            result.update(round=r, position=i)
            record["runs"].append(result)
            if "version" in result:
                record["versions"].setdefault(ALL_CONFIGS[config][0], result["version"])
            if "error" in result:
                print(f"round {r} {config}: FAILED {result['error']}", flush=True)
            elif result.get("mode") == "until_ll":
                print(f"round {r} {config}: {'reached' if result['reached'] else 'NOT reached'} LL {result['valid_ll']:.3f} "
                      f"after {result['steps']} steps, {result['seconds']:.1f} s from launch (test LL {result['test_ll']:.3f})",
                      flush=True)
            else:
                p = phases(result)
                print(f"round {r} {config}: " + ", ".join(f"{k} {v:.2f}" for k, v in p.items() if v is not None), flush=True)
            write_results(stem, record, render(record))


if __name__ == "__main__":
    main()

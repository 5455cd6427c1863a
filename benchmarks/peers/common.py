"""NumPy-only helpers shared by the peer benchmarks (GPflux, GPyTorch).

Each peer script runs in its own virtualenv (see ``setup.sh``) and imports this module with
``benchmarks/peers`` on ``sys.path``; nothing here imports numpyro_dgp or JAX.

* :func:`load_kin8nm` replicates ``numpyro_dgp.datasets.load_uci`` exactly: columns from
  ``index_features.txt`` / ``index_target.txt``, rows from ``index_{train,test}_K.txt``,
  inputs and target standardized with the training mean and population std (``ddof=0``;
  a constant column gets std 1).
* :func:`kmeans_init` gives the M inducing inputs (scipy ``kmeans2``, k-means++ start, seed 0).
* :func:`mixture_metrics` matches ``numpyro_dgp.metrics`` for a Normal likelihood:
  ``LL = mean_n [logsumexp_s log N(y_n | m_sn, v_sn) - log S] - log(y_std)`` and
  ``RMSE = sqrt(mean_n (y_n - mean_s m_sn)^2) * y_std`` (v includes the noise variance).
* :func:`block_statistics`, :func:`parse_args` and :func:`emit` keep the two scripts'
  timing protocol, command line and output identical.
* :func:`load_kin8nm_validation` holds back a validation part of the training split (the rows
  :func:`validation_indices` picks; ``benchmarks/startup.py`` mirrors the rule for ours);
  :class:`StartupClock` and :func:`train_until` serve the ``--startup`` and ``--until-ll``
  modes that ``benchmarks/startup.py`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

DATA_DIR_ENV_VAR = "NUMPYRO_DGP_DATA"
REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_INDUCING = 100
HIDDEN_WIDTH = 8
BATCH_SIZE = 1000
LEARNING_RATE = 0.01
NOISE_INIT = 0.01
INNER_Q_SQRT_SCALE = 1e-5
NUM_TEST_SAMPLES = 100
JITTER = {"float64": 1e-6, "float32": 1e-4}
VALID_FRACTION = 0.1  # share of the training split held back by --until-ll
VALID_SEED = 0
#: wall-clock time (``time.time()``) at which the parent launched this process (benchmarks/startup.py)
STARTUP_T0_ENV_VAR = "NUMPYRO_DGP_STARTUP_T0"


def log(*args):
    """Progress messages go to stderr; stdout carries only the JSON result line."""
    print(*args, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------


def resolve_data_dir(data_dir=None) -> Path:
    """``--data-dir``, else ``$NUMPYRO_DGP_DATA``, else ``../shared/data/uci`` relative to the
    repository root, else relative to the working directory (as ``default_data_dir``)."""
    if data_dir:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"--data-dir {str(path)!r} is not an existing directory")
        return path.resolve()
    env_value = os.environ.get(DATA_DIR_ENV_VAR, "")
    if env_value:
        path = Path(env_value).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"${DATA_DIR_ENV_VAR}={env_value!r} is not an existing directory")
        return path.resolve()
    tried = []
    for base in (REPO_ROOT, Path.cwd()):
        path = (base / ".." / "shared" / "data" / "uci").resolve()
        tried.append(str(path))
        if path.is_dir():
            return path
    raise FileNotFoundError(f"no UCI data directory found (tried {tried}); pass --data-dir or set ${DATA_DIR_ENV_VAR}")


def _read_indices(path: Path) -> np.ndarray:
    raw = np.loadtxt(path, dtype=np.float64, ndmin=1).reshape(-1)
    if not np.all(raw == np.round(raw)):
        raise ValueError(f"index file {path} holds non-integer indices")
    return raw.astype(np.int64)


def _standardize_stats(values):
    mean = values.mean(axis=0)
    std = values.std(axis=0)  # population std (ddof=0), as numpyro_dgp.datasets
    return mean, np.where(std > 0.0, std, 1.0)


def _raw_split(split: int, data_dir, name: str):
    """Unstandardized ``(X_train, y_train, X_test, y_test)`` of one split, float64."""
    folder = resolve_data_dir(data_dir) / name
    data = np.loadtxt(folder / "data.txt", dtype=np.float64, ndmin=2)
    features = _read_indices(folder / "index_features.txt")
    target = _read_indices(folder / "index_target.txt")
    assert target.size == 1, "index_target.txt must hold one column"
    X, y = data[:, features], data[:, target[0]]
    train = _read_indices(folder / f"index_train_{split}.txt")
    test = _read_indices(folder / f"index_test_{split}.txt")
    if np.intersect1d(train, test).size:
        raise ValueError(f"split {split}: train and test indices overlap")
    return X[train], y[train], X[test], y[test]


def load_kin8nm(split: int = 0, data_dir=None, name: str = "kin8nm") -> dict:
    """One standardized split, float64: ``X_train (N, D)``, ``y_train (N,)``, ``X_test``,
    ``y_test`` (standardized with training statistics), ``y_mean``, ``y_std``."""
    X_train, y_train, X_test, y_test = _raw_split(split, data_dir, name)
    x_mean, x_std = _standardize_stats(X_train)
    y_mean, y_std = _standardize_stats(y_train)
    return {
        "X_train": (X_train - x_mean) / x_std,
        "y_train": (y_train - y_mean) / y_std,
        "X_test": (X_test - x_mean) / x_std,
        "y_test": (y_test - y_mean) / y_std,
        "y_mean": float(y_mean),
        "y_std": float(y_std),
    }


def validation_indices(num_train: int, fraction: float = VALID_FRACTION, seed: int = VALID_SEED):
    """Positions (into the training split's rows, in ``index_train_K.txt`` order) of the rows kept
    for fitting and of the rows held back for validation: the last ``round(fraction * N)`` entries
    of ``np.random.default_rng(seed).permutation(N)`` are the validation rows; both returned
    sorted. ``benchmarks/startup.py`` (``validation_indices``) mirrors this exactly for ours."""
    perm = np.random.default_rng(int(seed)).permutation(int(num_train))
    num_valid = int(round(fraction * num_train))
    if not 0 < num_valid < num_train:
        raise ValueError(f"validation part of {num_valid} rows out of {num_train}")
    return np.sort(perm[: num_train - num_valid]), np.sort(perm[num_train - num_valid:])


def load_kin8nm_validation(split: int = 0, data_dir=None, name: str = "kin8nm",
                           fraction: float = VALID_FRACTION, seed: int = VALID_SEED) -> dict:
    """Split ``split`` with a validation part held back from its training rows
    (:func:`validation_indices`), all standardized with the statistics of the remaining
    training rows: ``X_train``/``y_train`` (the rows fitted), ``X_valid``/``y_valid``,
    ``X_test``/``y_test``, ``y_mean``, ``y_std``."""
    X_train, y_train, X_test, y_test = _raw_split(split, data_dir, name)
    fit, valid = validation_indices(len(y_train), fraction, seed)
    x_mean, x_std = _standardize_stats(X_train[fit])
    y_mean, y_std = _standardize_stats(y_train[fit])
    return {
        "X_train": (X_train[fit] - x_mean) / x_std,
        "y_train": (y_train[fit] - y_mean) / y_std,
        "X_valid": (X_train[valid] - x_mean) / x_std,
        "y_valid": (y_train[valid] - y_mean) / y_std,
        "X_test": (X_test - x_mean) / x_std,
        "y_test": (y_test - y_mean) / y_std,
        "y_mean": float(y_mean),
        "y_std": float(y_std),
        "num_fit": int(fit.size),
        "num_valid": int(valid.size),
    }


def kmeans_init(X: np.ndarray, num_inducing: int = NUM_INDUCING, seed: int = 0, iters: int = 25) -> np.ndarray:
    """``num_inducing`` k-means centers of ``X`` (k-means++ start, ``iters`` Lloyd steps), float64."""
    from scipy.cluster.vq import kmeans2

    X = np.asarray(X, np.float64)
    try:
        Z, _ = kmeans2(X, num_inducing, iter=iters, minit="++", rng=np.random.default_rng(seed))
    except TypeError:  # older scipy: the generator argument is called ``seed``
        Z, _ = kmeans2(X, num_inducing, iter=iters, minit="++", seed=np.random.default_rng(seed))
    return np.asarray(Z, np.float64)


# ----------------------------------------------------------------------------------------
# Metrics and timing
# ----------------------------------------------------------------------------------------


def mixture_metrics(component_means, component_variances, y_test, y_std: float) -> dict:
    """Test LL and RMSE of an equally weighted Gaussian mixture, in original units.

    :param component_means: ``(S, N)`` predictive means of ``y`` (standardized units).
    :param component_variances: ``(S, N)`` predictive variances of ``y`` (noise included).
    :param y_test: ``(N,)`` standardized targets.
    :param y_std: training-target std (``ll_orig = ll_std - log y_std``, ``rmse_orig = rmse_std * y_std``).
    """
    from scipy.special import logsumexp

    m = np.asarray(component_means, np.float64)
    v = np.asarray(component_variances, np.float64)
    y = np.asarray(y_test, np.float64).reshape(-1)
    lp = -0.5 * (np.log(2 * np.pi * v) + (y[None, :] - m) ** 2 / v)
    ll = float(np.mean(logsumexp(lp, axis=0) - np.log(m.shape[0])) - np.log(y_std))
    rmse = float(np.sqrt(np.mean((y - m.mean(0)) ** 2)) * y_std)
    return {"test_ll": ll, "test_rmse": rmse}


def block_statistics(block_seconds, steps_per_block: int) -> dict:
    """Median steps/s over timed blocks, and every block's rate."""
    rates = [steps_per_block / s for s in block_seconds]
    return {"steps_per_second": float(np.median(rates)), "block_rates": [round(r, 3) for r in rates]}


def train_for(step, seconds: float):
    """Call ``step()`` until ``seconds`` of wall clock have passed: ``(steps, elapsed, last loss)``."""
    steps = 0
    t0 = time.perf_counter()
    while True:
        loss = step()
        steps += 1
        if time.perf_counter() - t0 >= seconds:
            return steps, time.perf_counter() - t0, loss


def parse_args(description: str, argv=None):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--precision", choices=("float32", "float64"), default="float64")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--data-dir", default=None, help=f"UCI folder (default ${DATA_DIR_ENV_VAR} or ../shared/data/uci)")
    p.add_argument("--timed-steps", type=int, default=200, help="steps per timed block")
    p.add_argument("--repeats", type=int, default=5, help="number of timed blocks")
    p.add_argument("--warmup-steps", type=int, default=20, help="untimed steps after the first")
    p.add_argument("--budget-seconds", type=float, default=0.0, help="wall-clock training budget from a fresh model (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads (default: os.cpu_count(); TF's own default is also all cores)")
    p.add_argument("--startup", action="store_true",
                   help="only time the start-up (import, data, model, first finished step) from process start")
    p.add_argument("--until-ll", type=float, default=None, metavar="LL",
                   help="train until the validation LL (original units) reaches LL; report the wall clock from process start")
    p.add_argument("--check-every", type=int, default=250, help="with --until-ll: steps between validation checks")
    p.add_argument("--max-steps", type=int, default=20000, help="with --until-ll: give up after this many steps")
    return p.parse_args(argv)


def speed_result(library, version, args, compile_s, blocks, num_threads) -> dict:
    """The JSON fields both peer scripts report before their budget run fills the rest."""
    return {
        "library": library,
        "version": version,
        "precision": args.precision,
        "compile_seconds": compile_s,
        **block_statistics(blocks, args.timed_steps),
        **empty_budget_fields(),
        "budget_seconds": args.budget_seconds or None,
        "num_threads": num_threads,
    }


def empty_budget_fields() -> dict:
    return {"budget_steps": None, "test_ll": None, "test_rmse": None, "final_elbo": None}


# ----------------------------------------------------------------------------------------
# Start-up and time-to-accuracy modes (benchmarks/startup.py)
# ----------------------------------------------------------------------------------------


def proc_start_wall():
    """Wall-clock time at which this process started, from ``/proc/self/stat`` (field 22,
    ``starttime``, clock ticks after boot) and ``/proc/uptime``; resolution one clock tick
    (10 ms); ``None`` where ``/proc`` is missing."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """Seconds since this process was launched.

    The origin is the parent's ``time.time()`` just before it launched this process
    (``$NUMPYRO_DGP_STARTUP_T0``, set by ``benchmarks/startup.py``), so fork, exec and the
    interpreter's own start are included; run by hand, the kernel's record of the process start
    (:func:`proc_start_wall`) stands in. Marks after the script's entry use ``perf_counter``.

    :param entry: ``(time.time(), time.perf_counter())`` taken at the script's first statement.
    """

    def __init__(self, entry):
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
        # the kernel's start time minus the parent's launch time: a check on the origin (~0 to 0.01 s)
        self.proc_minus_origin = None if proc is None else proc - self.t0
        self.marks = {"script_entry": self._entry}

    def now(self) -> float:
        return self._entry + time.perf_counter() - self._entry_perf

    def mark(self, name: str) -> float:
        self.marks[name] = self.now()
        return self.marks[name]

    def info(self) -> dict:
        return {"source": self.source, "proc_minus_origin": self.proc_minus_origin}


def max_rss_mib():
    """Peak resident memory of this process (MiB), or ``None``."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    except (ImportError, OSError):
        return None


def startup_result(library, version, args, clock, num_threads) -> dict:
    """The ``--startup`` JSON line: marks in seconds from process start (``script_entry``,
    ``import``, ``data``, ``init`` = k-means and model built, ``first_step`` = first training
    step finished)."""
    return {"library": library, "version": version, "precision": args.precision, "mode": "startup",
            "marks": dict(clock.marks), "clock": clock.info(), "num_threads": num_threads,
            "max_rss_mib": max_rss_mib()}


def train_until(step, validation_ll, clock, target: float, check_every: int, max_steps: int, steps_done: int = 0,
                sync=None) -> dict:
    """Call ``step()`` and, every ``check_every`` steps (counted from the first), ``validation_ll()``
    until it returns ``>= target`` or ``max_steps`` steps are done. The evaluations are in the
    wall clock (they are part of reaching the accuracy). ``sync(loss)`` blocks on a step's result
    before each evaluation (TF: ``loss.numpy()``).

    :return: ``{"reached", "steps", "seconds" (from process start, at the deciding check),
        "valid_ll", "eval_seconds" (all checks), "history": [{"step", "seconds", "valid_ll"}]}``.
    """
    steps, history, eval_seconds, ll = steps_done, [], 0.0, None
    while steps < max_steps:
        loss = None
        for _ in range(min(check_every - steps % check_every, max_steps - steps)):
            loss = step()
            steps += 1
        if sync is not None and loss is not None:
            sync(loss)
        t0 = time.perf_counter()
        ll = float(validation_ll())
        eval_seconds += time.perf_counter() - t0
        history.append({"step": steps, "seconds": round(clock.now(), 3), "valid_ll": round(ll, 5)})
        log(f"  step {steps}: validation LL {ll:.4f} at {clock.now():.1f} s")
        if ll >= target:
            return {"reached": True, "steps": steps, "seconds": clock.now(), "valid_ll": ll,
                    "eval_seconds": eval_seconds, "history": history}
    return {"reached": False, "steps": steps, "seconds": clock.now(), "valid_ll": ll,
            "eval_seconds": eval_seconds, "history": history}


def until_ll_result(library, version, args, clock, outcome, test_metrics, num_threads, data) -> dict:
    """The ``--until-ll`` JSON line."""
    return {"library": library, "version": version, "precision": args.precision, "mode": "until_ll",
            "target_ll": args.until_ll, "check_every": args.check_every, "max_steps": args.max_steps,
            **outcome, "test_ll": test_metrics["test_ll"], "test_rmse": test_metrics["test_rmse"],
            "num_fit": data["num_fit"], "num_valid": data["num_valid"],
            "marks": dict(clock.marks), "clock": clock.info(), "num_threads": num_threads,
            "max_rss_mib": max_rss_mib()}


def emit(result: dict) -> None:
    """The one JSON line on stdout."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------------------
# benchmarks/scale.py --grid peers
# ----------------------------------------------------------------------------------------


def parse_scale_args(description, argv=None):
    """The command line both ``*_scale.py`` peers take (one grid point)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--num-data", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=90, help="input dimension D")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--precision", choices=("float32", "float64"), default="float32")
    parser.add_argument("--steps", type=int, default=30, help="steps per timed block (3 blocks, median)")
    parser.add_argument("--device", default="cpu", help="PyTorch device of the GPyTorch peer (cpu, cuda)")
    return parser.parse_args(argv)


def scale_data(N, D, dtype, seed=0):
    """The grid peers' synthetic year-like data ``(X (N, D), y (N,))``, standardized ``y``."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D)).astype(dtype)
    proj = X.astype(np.float64) @ (rng.standard_normal((D, 3)) / np.sqrt(D))
    y = np.sin(2 * proj[:, 0]) + 0.5 * proj[:, 1] * proj[:, 2] + 0.1 * rng.standard_normal(N)
    return X, ((y - y.mean()) / y.std()).astype(dtype)

"""``benchmarks/startup.py``: phases, same-round ratios, verdicts and the table from a synthetic record
(no subprocess, no training), and the validation rows shared with ``peers/common.py``."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import their sibling modules


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def startup():
    return _load(REPO / "benchmarks" / "startup.py", "bench_startup")


@pytest.fixture(scope="module")
def common():
    return _load(REPO / "benchmarks" / "peers" / "common.py", "bench_peers_common")


def _ours(config, rnd, init, compile_s, total, hits=0):
    marks = {"script_entry": 0.05, "import_jax": 0.6, "import": 1.5, "data_files": 1.6, "data": 1.7,
             "init": 1.7 + init, "first_step": total}
    return {"config": config, "library": "numpyro_dgp", "mode": "startup", "round": rnd, "precision": "float64",
            "version": "numpyro_dgp 0.1.0", "init_fn": "svi.init", "compile_seconds": compile_s, "marks": marks,
            "xla": {"import": {"compiles": 0, "compile_seconds": 0.0, "trace_seconds": 0.0},
                    "data": {"compiles": 1, "compile_seconds": 0.01, "trace_seconds": 0.0},
                    "init": {"compiles": 101, "compile_seconds": 3.01, "trace_seconds": 0.5},
                    "first_step": {"compiles": 110, "compile_seconds": 6.0, "trace_seconds": 1.2}},
            "cache": {"dir_at_import": None, "dir_at_end": None, "hits": hits, "env": None}, "max_rss_mib": 400.0}


def _peer(config, rnd, total):
    return {"config": config, "library": config.split("-")[0], "mode": "startup", "round": rnd,
            "version": "gpflux 0.4.5", "marks": {"script_entry": 0.05, "import": 4.0, "data": 4.1, "init": 5.0,
                                                 "first_step": total}}


def _acc(config, rnd, seconds, reached=True):
    return {"config": config, "library": "numpyro_dgp" if "dsvi" in config else "gpflux", "mode": "until_ll",
            "round": rnd, "reached": reached, "seconds": seconds, "steps": 1500, "valid_ll": 1.26 if reached else 1.2,
            "test_ll": 1.27, "test_rmse": 0.07, "eval_seconds": 3.0, "num_fit": 6636, "num_valid": 737,
            "marks": {"script_entry": 0.05}}


def _record(init=(1.5, 1.8, 2.5), amortized_compile=(7.0, 9.0, 7.5)):
    runs = []
    for r in range(3):
        runs += [
            _ours("dsvi-f64", r, init[r], 3.0, 10.0 + r),
            _ours("dsvi-f32", r, init[r], 2.5, 8.0),
            _ours("amortized", r, 4.0, amortized_compile[r], 20.0),
            _ours("svi-init", r, 2.5 + r / 2, 3.0, 12.0),  # median init 3.0: NOT met
            _peer("gpflux-f64", r, 22.0),       # ratios 0.45, 0.50, 0.55 -> median 0.50: met
            _peer("gpflux-f32", r, 15.0),       # 8 / 15 = 0.53: NOT met
            _acc("ll-dsvi-f64", r, 50.0 + r),
            _acc("ll-gpflux-f64", r, 100.0),    # ratios ~0.5: met
            _acc("ll-dsvi-f32", r, 80.0, reached=r != 1),
            _acc("ll-gpflux-f32", r, 60.0),     # 1.33, inf, 1.33 -> NOT met
        ]
    runs.append({"config": "chain", "round": 0, "error": "exit 1: boom"})
    return {"command": "python benchmarks/startup.py --rounds 3 --with-peers --accuracy", "machine": "test",
            "date": "today", "versions": {"numpyro_dgp": "numpyro_dgp 0.1.0"},
            "settings": {"rounds": 3, "target_ll": 1.25, "check_every": 250, "max_steps": 20000},
            "configs": ["dsvi-f64", "dsvi-f32", "amortized", "chain", "svi-init", "gpflux-f64", "gpflux-f32",
                        "ll-dsvi-f64", "ll-dsvi-f32", "ll-gpflux-f64", "ll-gpflux-f32"],
            "runs": runs}


def test_phases_split_the_marks(startup):
    p = startup.phases(_ours("dsvi-f64", 0, 1.5, 3.0, 10.0))
    assert p["import"] == pytest.approx(1.45) and p["data"] == pytest.approx(0.2)
    assert p["init"] == pytest.approx(1.5) and p["compile"] == 3.0
    assert p["step"] == pytest.approx(10.0 - 3.2 - 3.0) and p["total"] == 10.0
    peer = startup.phases(_peer("gpflux-f64", 0, 20.0))
    assert peer["compile"] is None and peer["step"] == pytest.approx(15.0)


def test_verdicts_from_a_synthetic_record(startup):
    verdicts = {name: (met, text) for name, met, text in startup.verdicts(_record())}
    by_start = {name.split(" (")[0] + (" f32" if "float32" in name else ""): v for name, v in verdicts.items()}
    assert by_start["kin8nm DSVI model initialization <= 2 s"][0] is True  # median 1.8
    assert "median 1.80 s" in by_start["kin8nm DSVI model initialization <= 2 s"][1]
    svi_init = "the same model initialized by NumPyro's svi.init <= 2 s"
    assert by_start[svi_init][0] is False and "median 3.00 s over 3 runs" in by_start[svi_init][1]
    assert by_start["process start to first finished step <= 0.5x GPflux's in the same round"][0] is True
    assert "ratio 0.50x" in by_start["process start to first finished step <= 0.5x GPflux's in the same round"][1]
    assert by_start["process start to first finished step <= 0.5x GPflux's in the same round f32"][0] is False
    assert by_start["amortized first-step compile <= 8 s"][0] is True  # median 7.5
    acc = "time from process start to kin8nm validation LL >= 1.25 below GPflux's in the same round"
    assert by_start[acc][0] is True
    assert by_start[acc + " f32"][0] is False and "∞ (ours not reached)" in by_start[acc + " f32"][1]

    worse = {name: met for name, met, _ in startup.verdicts(_record(init=(2.5, 2.6, 1.0), amortized_compile=(9, 9, 1)))}
    assert [met for name, met in worse.items() if name.startswith("kin8nm DSVI")] == [False]
    assert [met for name, met in worse.items() if name.startswith("amortized")] == [False]


def test_a_warm_cache_fails_the_cold_cache_target(startup):
    record = _record()
    for run in record["runs"]:
        if run["config"] == "dsvi-f64":
            run["cache"]["hits"] = 3
    (name, met, text), = [v for v in startup.verdicts(record) if v[0].startswith("kin8nm DSVI")]
    assert met is False and "not a cold-cache measurement" in text
    assert "these runs are not cold" in startup.render(record)


def test_unmeasured_targets_say_so(startup):
    record = _record()
    record["runs"] = [run for run in record["runs"] if run["config"] == "dsvi-f64"]
    record["configs"] = ["dsvi-f64"]
    verdicts = startup.verdicts(record)
    assert [met for _, met, _ in verdicts].count(None) == len(verdicts) - 1
    text = startup.render(record)
    assert "**not measured**" in text and "nan" not in text


def test_table_renders_every_section(startup, tmp_path):
    path = tmp_path / "startup.md"
    startup.write_markdown(path, _record())
    text = path.read_text()
    assert "Command: `python benchmarks/startup.py --rounds 3 --with-peers --accuracy`" in text
    rows = {}  # the first row of each name: the start-up, comparison and accuracy tables
    for line in text.splitlines():
        if line.startswith("| "):
            rows.setdefault(line.split(" | ")[0].lstrip("| "), line)
    assert "| 3 | 0.05 (0.05–0.05) |" in rows["dsvi-f64"]
    assert "1.80 (1.50–2.50)" in rows["dsvi-f64"]  # model init: median (min–max)
    assert "11.00 (10.00–12.00)" in rows["dsvi-f64"]  # launch -> first finished step
    assert "| 100 / 3.00 |" in rows["dsvi-f64"]  # XLA compilations in init
    assert rows["chain"].startswith("| chain | 0 (1 failed) |")
    assert "0.50 (0.45–0.55)" in rows["float64"] and "0.53" in rows["float32"]
    assert "| 2 / 3 |" in rows["ll-dsvi-f32"] and "| 3 / 3 |" in rows["ll-dsvi-f64"]
    assert "737 of 7373" in text
    assert "- process start to first finished step <= 0.5x GPflux's in the same round (float64): **met**" in text
    assert "(float32): **NOT met**" in text
    assert "round 0, chain: exit 1: boom" in text
    assert "every run of ours reported no cache directory in effect" in text
    assert "nan" not in text


def test_round_order_rotates(startup):
    configs = ["a", "b", "c"]
    assert [startup.round_order(configs, r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_children_get_no_compilation_cache(startup, monkeypatch):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/tmp/somewhere")
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    env = startup.child_env()
    assert "JAX_COMPILATION_CACHE_DIR" not in env and "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in env


def test_warm_children_share_a_cache_that_keeps_every_program(startup, monkeypatch):
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "5")
    env = startup.child_env("/tmp/shared")
    assert env["JAX_COMPILATION_CACHE_DIR"] == "/tmp/shared"
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert [c for c in startup.CONFIGS if startup.is_warm(c)] == ["dsvi-f64-warm", "dsvi-f32-warm", "svi-init-warm"]


def test_warm_runs_get_their_own_rows_and_leave_the_cold_targets_alone(startup):
    record = _record()
    for r in range(3):
        warm = _ours("dsvi-f64-warm", r, 0.5, 1.0, 4.4, hits=40)
        warm["cache"].update(dir_at_import="/tmp/shared", dir_at_end="/tmp/shared")
        record["runs"].append(warm)
    record["configs"].append("dsvi-f64-warm")
    assert startup.first_step_ratios(record, "float64", warm=True) == pytest.approx([0.2] * 3)
    assert startup.verdicts(record) == startup.verdicts(_record())  # the targets stay cold-cache ones
    text = startup.render(record)
    assert "| float64, ours with a warm cache | 4.40 (4.40–4.40) | 22.00 (22.00–22.00) | – | 0.20 (0.20–0.20) | – |" in text
    assert "every run of ours reported no cache directory in effect" in text  # the cold runs
    assert "40–40 persistent-cache hits per run" in text


def test_fit_straight_away_runs_get_their_own_rows(startup):
    record = _record()
    for r in range(3):
        record["runs"].append(_ours("fit-f64", r, 0.1, 7.0, 8.8))
    record["configs"].append("fit-f64")
    assert startup.first_step_ratios(record, "float64", variant="fit") == pytest.approx([0.4] * 3)
    assert startup.verdicts(record) == startup.verdicts(_record())  # the targets stay the dsvi ones
    text = startup.render(record)
    assert "| float64, ours `fit` straight away | 8.80 (8.80–8.80) | 22.00 (22.00–22.00) | – | 0.40 (0.40–0.40) | <= 0.5 |" in text
    assert "float32, ours `fit` straight away" not in text  # not run


@pytest.mark.parametrize("n", [10, 7373, 9830])
def test_validation_rows_match_the_peers(startup, common, n):
    ours, theirs = startup.validation_indices(n), common.validation_indices(n)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)
    fit, valid = ours
    assert len(valid) == round(0.1 * n) and np.array_equal(np.sort(np.concatenate([fit, valid])), np.arange(n))


def test_clock_origin_from_the_parent(startup, common, monkeypatch):
    monkeypatch.setenv("NUMPYRO_DGP_STARTUP_T0", "100.0")
    import time

    entry = (102.5, time.perf_counter())
    for clock in (startup.Clock(entry), common.StartupClock(entry)):
        assert clock.marks["script_entry"] == pytest.approx(2.5)
        assert clock.mark("x") == pytest.approx(2.5, abs=0.5)
        assert "parent" in clock.info()["source"]


class _Done:
    def __init__(self, stdout):
        self.stdout, self.stderr, self.returncode = stdout, "", 0


def test_run_child_gives_the_cache_to_warm_configurations_only(startup, monkeypatch):
    seen = {}
    def run(cmd, env, **kwargs):
        seen[cmd[cmd.index("--child") + 1]] = env
        return _Done('{"a": 1}')

    monkeypatch.setattr(startup.subprocess, "run", run)
    args = startup.argparse.Namespace(data_dir=None, cache_dir="/tmp/shared", target_ll=1.25, check_every=250,
                                      max_steps=10)
    for config in ("dsvi-f64", "dsvi-f64-warm", "svi-init", "svi-init-warm"):
        assert startup.run_child(config, args)["config"] == config
    assert "JAX_COMPILATION_CACHE_DIR" not in seen["dsvi-f64"] and "JAX_COMPILATION_CACHE_DIR" not in seen["svi-init"]
    assert seen["dsvi-f64-warm"]["JAX_COMPILATION_CACHE_DIR"] == seen["svi-init-warm"]["JAX_COMPILATION_CACHE_DIR"] \
        == "/tmp/shared"


def _fake_children(startup, monkeypatch):
    """``main`` with children that fill the shared cache in the warm-up and report a fixed run; the
    records it would write are kept in the returned list (nothing is written to results/)."""
    written, folders = [], []

    def run_child(config, args):
        if args.cache_dir:
            folders.append(Path(args.cache_dir))
            (Path(args.cache_dir) / f"{config}.entry").write_bytes(b"x" * 10)
        return _ours(config, 0, 1.0, 2.0, 5.0, hits=9 if startup.is_warm(config) else 0)

    monkeypatch.setattr(startup, "run_child", run_child)
    monkeypatch.setattr(startup, "write_results", lambda stem, record, text: written.append(record))
    return written, folders


def test_main_fills_measures_and_removes_the_warm_cache(startup, monkeypatch):
    written, folders = _fake_children(startup, monkeypatch)
    startup.main(["--rounds", "1", "--configs", "dsvi-f64,dsvi-f64-warm,svi-init-warm", "--tag", "t"])
    record = written[-1]
    assert record["warm_cache"] == {"files": 3, "bytes": 30}  # after the warm-up run of each
    assert folders and not any(folder.exists() for folder in folders)
    assert "the cache held 3 files" in startup.render(record)


def test_main_removes_the_cache_when_a_run_fails_and_refuses_warm_runs_without_warm_up(startup, monkeypatch):
    _, folders = _fake_children(startup, monkeypatch)

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(startup, "write_results", boom)  # the first round's report
    with pytest.raises(KeyboardInterrupt):
        startup.main(["--rounds", "1", "--configs", "dsvi-f64-warm", "--tag", "t"])
    assert folders and not any(folder.exists() for folder in folders)
    with pytest.raises(SystemExit):
        startup.main(["--rounds", "1", "--warmup-runs", "0", "--configs", "dsvi-f64-warm", "--tag", "t"])


def test_a_warm_run_without_hits_and_a_failed_warm_up_are_reported(startup):
    record = _record()
    for config, hits in (("dsvi-f64-warm", 5), ("svi-init-warm", 0)):
        run = _ours(config, 0, 0.5, 1.0, 4.4, hits=hits)
        run["cache"].update(dir_at_end="/tmp/shared")
        record["runs"].append(run)
        record["configs"].append(config)
    record["warmup_failures"] = ["svi-init-warm: exit 1: boom"]
    text = startup.render(record)
    assert "BUT 1 of them reported no cache directory or no hits: not warm" in text
    assert "Failed warm-up runs: svi-init-warm: exit 1: boom" in text
    assert startup.verdicts(record) == startup.verdicts(_record())

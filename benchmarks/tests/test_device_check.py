"""``benchmarks/device_check.sh --dry``: every section of ``device_check.py`` runs at tiny sizes
(a fresh process, as on a device machine) and its result file lists each section with numbers
or a recorded skip reason, none failed or over its budget."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import their sibling modules


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location(
        "bench_device_check", REPO / "benchmarks" / "device_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_section_that_fails_skips_or_overruns_is_recorded_and_the_next_runs(check, monkeypatch):
    monkeypatch.setattr(check, "GRACE", 0.0)

    def fails(sizes, out, clock):
        out["partial"] = 1.0
        raise ValueError("boom")

    def skips(sizes, out, clock):
        raise check.Skip("not built yet: nothing")

    def overruns(sizes, out, clock):
        out["partial"] = 2.0
        time.sleep(5)  # the timer interrupts the sleep

    def runs(sizes, out, clock):
        out["value"] = clock.left() > 0

    results = [
        check.run_section(check.Section(fn.__name__, fn, budget, ""), {}, budget)
        for fn, budget in ((fails, 5), (skips, 5), (overruns, 0.2), (runs, 5))
    ]
    assert [r["status"] for r in results] == ["failed", "skipped", "timeout", "ok"]
    assert results[0]["error"] == "ValueError: boom" and results[0]["result"] == {"partial": 1.0}
    assert results[1]["reason"] == "not built yet: nothing"
    assert results[2]["result"] == {"partial": 2.0} and results[2]["seconds"] < 2
    assert results[3]["result"] == {"value": True}


def test_the_dry_run_does_not_write_over_the_committed_result(check):
    with pytest.raises(SystemExit):
        check.main(["--dry", "--output", str(check.DEFAULT_OUTPUT)])


def _env():
    env = dict(os.environ)
    # the test suite's persistent compilation cache (tests/conftest.py): a rerun compiles little
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".jax_cache" / "main"))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
    env["PYTHON"] = sys.executable
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _check(record):
    names = [s["name"] for s in record["sections"]]
    assert names == [
        "matmul",
        "dsvi_step_float64",
        "dsvi_step_float32",
        "nuts_exact",
        "dsvi_epoch_n40000",
        "vecchia_nuts",
        "elliptical_slice_n10000",
    ]
    for s in record["sections"]:
        assert s["status"] in ("ok", "skipped"), (s["name"], s.get("error"), s.get("traceback"))
        if s["status"] == "skipped":
            assert s["reason"], s["name"]
        else:
            assert s["result"], s["name"]
    by = {s["name"]: s for s in record["sections"]}
    for name in ("dsvi_step_float64", "dsvi_step_float32"):
        rows = [v for k, v in by[name]["result"].items() if k.startswith("M")]
        assert rows and all(r["default"]["ms_per_step"] > 0 for r in rows), name
        assert all(r["default"]["losses_finite"] for r in rows), name
    f32 = [v for k, v in by["dsvi_step_float32"]["result"].items() if k.startswith("M")]
    assert all("highest" in r and "loss_difference" in r for r in f32)
    assert by["nuts_exact"]["result"]["seconds_per_sample"] > 0
    assert by["dsvi_epoch_n40000"]["result"]["float32"]["seconds_per_epoch"] > 0
    assert by["vecchia_nuts"]["result"]["seconds_per_gradient"] > 0
    assert by["elliptical_slice_n10000"]["result"]["seconds_per_evaluation"] > 0
    env = record["environment"]
    assert env["devices"] and env["versions"]["jax"] and record["date"]
    assert record["tests"]["status"] == "skipped" and "--dry" in record["tests"]["reason"]


def test_dry_run_of_the_shell_script_writes_every_section(tmp_path):
    output = tmp_path / "device_check.json"
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "device_check.sh"), "--dry", "--output", str(output)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(output.read_text())
    assert record["command"] == f"bash benchmarks/device_check.sh --dry --output {output}"
    assert record["mode"].startswith("dry")
    _check(record)
    text = output.with_suffix(".md").read_text()
    assert "# Device check" in text and "`bash benchmarks/device_check.sh --dry" in text
    assert "| elliptical_slice_n10000 | N = 16, 2 chains, m = 4 |" in text

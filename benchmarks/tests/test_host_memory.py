"""``benchmarks/host_memory.py``: its arguments, the children's environment, the report from a
synthetic record, and one tiny child per driver end to end."""

import argparse
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import their sibling modules

import host_memory  # noqa: E402


def test_points_are_parsed_and_a_bad_one_is_named():
    assert host_memory.parse_point("float64:500:32") == ("float64", 500, 32)
    for bad in ("float16:500:8", "float32:500", "float32:M:8"):
        with pytest.raises(argparse.ArgumentTypeError, match="--points.*" + bad):
            host_memory.parse_point(bad)


def test_the_default_setting_drops_the_tunables_and_the_tuned_one_sets_them(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    assert "GLIBC_TUNABLES" not in host_memory.setting_env("default", "x")
    assert host_memory.setting_env("tuned", "glibc.malloc.mmap_max=0")["GLIBC_TUNABLES"] == "glibc.malloc.mmap_max=0"


def _run(driver, setting, rnd, ms, faults=None):
    run = {"precision": "float32", "M": 500, "width": 8, "driver": driver, "setting": setting, "round": rnd, "ms": ms}
    if faults is not None:
        run.update(faults=faults, sys_ms=faults / 1000, temp_mb=65.0)
    return run


def test_summary_and_report():
    runs = [_run("loop", "default", 0, 110.0, 18000), _run("loop", "default", 1, 114.0, 17000),
            _run("loop", "tuned", 0, 88.0, 1), _run("loop", "tuned", 1, 90.0, 3),
            _run("gpflux", "default", 0, 139.0), _run("gpflux", "tuned", 0, 132.0)]
    record = {"command": "python benchmarks/host_memory.py", "machine": "x86_64, 2 cores", "date": "2026-11-29",
              "points": [("float32", 500, 8)], "dim": 8, "steps": 20, "rounds": 2, "tunables": "t", "runs": runs}
    medians = host_memory.summary(runs)
    assert medians[("float32", 500, 8, "loop", "default")]["ms"] == 112.0
    assert medians[("float32", 500, 8, "loop", "tuned")]["faults"] == 2
    assert "faults" not in medians[("float32", 500, 8, "gpflux", "tuned")]
    text = host_memory.markdown(record)
    loop_row = next(line for line in text.splitlines() if "| loop |" in line)
    assert "| 112.0 | 89.0 | 0.795 | 17500 | 2 |" in loop_row
    gpflux_row = next(line for line in text.splitlines() if "| gpflux |" in line)
    assert "| - | 139.0 | 132.0 | 0.950 | - | - |" in gpflux_row
    assert "| fit |" not in text  # a driver not run is left out, not shown empty
    assert "GPflux / ours" not in text  # no comparison without both drivers

    record["runs"] += [_run("fit", "default", 0, 100.0, 1500), _run("fit", "tuned", 0, 88.0, 70)]
    text = host_memory.markdown(record)
    versus = [line for line in text.splitlines() if line.startswith("| float32 | 500 | 8 | default | 139.0")]
    assert versus == ["| float32 | 500 | 8 | default | 139.0 | 1.24 | 1.39 |"]
    assert "| float32 | 500 | 8 | tuned | 132.0 | 1.48 | 1.50 |" in text


@pytest.mark.parametrize("driver, setting", [("loop", "tuned"), ("fit", "default")])
def test_a_child_runs_each_driver_in_its_setting(driver, setting, monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.check=0")  # a default run drops it
    result = host_memory.run_ours(("float32", 10, 1), 3, driver, setting, 2, "glibc.malloc.mmap_max=0")
    assert result["glibc_tunables"] == ("glibc.malloc.mmap_max=0" if setting == "tuned" else None)
    assert result["finite"] and result["ms"] > 0 and result["temp_mb"] > 0


def test_the_report_names_the_allocator_it_ran_on():
    info = host_memory.system_info()
    assert set(info) == {"glibc", "transparent_hugepages"}
    record = {"command": "c", "machine": "m", "date": "d", "points": [], "dim": 8, "steps": 20, "rounds": 1,
              "tunables": "t", "runs": [], "glibc": "glibc 2.36", "transparent_hugepages": "always [madvise] never"}
    assert "glibc 2.36; transparent huge pages: `always [madvise] never`." in host_memory.markdown(record)

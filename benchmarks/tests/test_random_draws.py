"""``benchmarks/random_draws.py``: its arguments, small measurements end to end, the reports."""

import argparse
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import their sibling modules

import random_draws  # noqa: E402


def test_arguments_are_parsed_and_a_bad_one_is_named():
    assert random_draws.parse_size("10000:1000") == (10000, 1000)
    assert random_draws.parse_shape("1000x8") == (1000, 8)
    assert random_draws.parse_point("float64:500:8") == ("float64", 500, 8)
    for parse, option, bad in [(random_draws.parse_size, "--sizes", "1000:10000"),
                               (random_draws.parse_size, "--sizes", "a:b"),
                               (random_draws.parse_shape, "--normals", "1000x0"),
                               (random_draws.parse_shape, "--normals", "8,8"),
                               (random_draws.parse_point, "--steps", "float16:50:1"),
                               (random_draws.parse_point, "--steps", "float32:M:1")]:
        with pytest.raises(argparse.ArgumentTypeError, match=option + ".*" + bad):
            parse(bad)


def test_small_measurements_compare_the_draws_and_the_report_shows_them():
    # 500 of 20,000: the candidates' short path, on which the indices are compared
    subsample = random_draws.measure_subsample(20_000, 500, rounds=2, calls=3)
    assert subsample["same"] is True and set(subsample["us"]) == {"plain", "library"}
    normal = random_draws.measure_normal((100, 8), rounds=2, calls=3)
    assert normal["max_ulps"] <= 1
    record = {"command": "python benchmarks/random_draws.py", "machine": "x86_64, 2 cores", "date": "2026-12-01",
              "rounds": 2, "calls": 3, "points": [subsample, {**subsample, "same": False}],
              "normal_points": [normal], "step_rounds": 8, "step_points": []}
    text = random_draws.markdown(record)
    assert "| 20000 | 500 |" in text and "| yes |" in text and "| **no** |" in text and "| 100x8 |" in text


def test_the_step_table_shows_the_three_programs_and_gpflux():
    point = {"precision": "float32", "M": 50, "width": 8,
             "ms": {"plain": 5.0, "subsample": 4.8, "library": 4.5},
             "ratio": {"plain": 1.0, "subsample": 0.96, "library": 0.9},
             "ratio_range": {"plain": [1, 1], "subsample": [0.9, 1.0], "library": [0.85, 0.95]},
             "loss_rel_diff": {"plain": 0.0, "subsample": 0.0, "library": 3e-7}, "gpflux_ms": 10.0}
    text = "\n".join(random_draws.step_markdown({"step_rounds": 8, "step_points": [point]}))
    assert ("| float32 | 50 | 8 | 5.00 | 4.80 | 4.50 | 0.960 (0.900-1.000) | 0.0e+00 | 0.900 (0.850-0.950) "
            "| 3.0e-07 | 10.00 | 2.00 / 2.22 |") in text

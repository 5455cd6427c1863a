"""``benchmarks/subsample_draw.py``: its sizes, a small measurement end to end, and the report."""

import argparse
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import their sibling modules

import subsample_draw  # noqa: E402


def test_sizes_are_parsed_and_a_bad_one_is_named():
    assert subsample_draw.parse_size("10000:1000") == (10000, 1000)
    for bad in ("10000", "1000:10000", "a:b", "10:0"):
        with pytest.raises(argparse.ArgumentTypeError, match="--sizes.*" + bad):
            subsample_draw.parse_size(bad)


def test_a_measurement_checks_the_indices_and_the_report_shows_them():
    # 500 of 20,000: the candidates' short path, on which the indices are compared
    point = subsample_draw.measure(20_000, 500, rounds=2, calls=3)
    assert point["same_indices"] is True
    assert set(point["us"]) == {"top_k", "fast_subsample"} and point["ratio"] > 0
    record = {"command": "python benchmarks/subsample_draw.py", "machine": "x86_64, 2 cores",
              "date": "2026-12-01", "rounds": 2, "calls": 3, "points": [point, {**point, "same_indices": False}]}
    text = subsample_draw.markdown(record)
    assert "| 20000 | 500 |" in text and "| yes |" in text and "| **no** |" in text


def test_step_points_are_parsed_and_a_bad_one_is_named():
    assert subsample_draw.parse_point("float64:500:8") == ("float64", 500, 8)
    for bad in ("float16:50:1", "float32:50", "float32:M:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="--steps.*" + bad):
            subsample_draw.parse_point(bad)


def test_the_step_table_shows_both_draws_and_gpflux():
    point = {"precision": "float32", "M": 50, "width": 1, "ms": {"top_k": 2.5, "fast_subsample": 2.3},
             "ratio": 0.92, "ratio_range": [0.9, 0.95], "same_losses": True, "gpflux_ms": 5.0}
    text = "\n".join(subsample_draw.step_markdown({"step_rounds": 8, "step_points": [point]}))
    assert "| float32 | 50 | 1 | 2.50 | 2.30 | 0.920 (0.900-0.950) | yes | 5.00 | 2.00 / 2.17 |" in text

"""Merging benchmark result files written by separate processes."""

import pytest
from papers.results import extend_by_split, merge_by_split


def test_merge_by_split_joins_disjoint_splits_in_order_and_refuses_a_repeated_split():
    a = {"kin8nm": {"dsvi": [{"split": 2, "ll": 1.0}], "nvc": [{"split": 2, "ll": 0.9}]}}
    b = {"kin8nm": {"dsvi": [{"split": 0, "ll": 1.1}]}, "energy": {"dsvi": [{"split": 1, "ll": -1.2}]}}
    merged = merge_by_split([a, b], "--combine")
    assert [r["split"] for r in merged["kin8nm"]["dsvi"]] == [0, 2]
    assert merged["kin8nm"]["nvc"] == [{"split": 2, "ll": 0.9}]
    assert merged["energy"]["dsvi"] == [{"split": 1, "ll": -1.2}]
    assert a["kin8nm"]["dsvi"] == [{"split": 2, "ll": 1.0}]  # the inputs are not changed
    with pytest.raises(ValueError, match=r"--combine: kin8nm dsvi: split\(s\) \[2\] appear in more than one file"):
        merge_by_split([a, a], "--combine")
    with pytest.raises(ValueError, match="what: split"):
        extend_by_split([{"split": 1}], [{"split": 1}], "what")

"""The list of slow cases (tests/slow_cases.txt): listed ids are marked slow, and a stale id
fails a whole-suite run instead of letting a renamed test slip back into the default suite."""

from types import SimpleNamespace

import pytest

from tests import conftest


class _Item:
    def __init__(self, nodeid):
        self.nodeid, self.markers = nodeid, []

    def add_marker(self, marker):
        self.markers.append(marker.name)


def _config(args_source):
    return SimpleNamespace(args_source=args_source, option=SimpleNamespace(keyword="", markexpr=""))


def test_listed_cases_are_marked_slow_and_a_stale_id_fails_a_whole_suite_run(tmp_path, monkeypatch):
    listing = tmp_path / "slow_cases.txt"
    listing.write_text("# a header\ntests/a.py::test_kept[x, y]  # 9 s\ntests/a.py::test_renamed  # 8 s\n")
    monkeypatch.setattr(conftest, "SLOW_CASES", listing)
    kept, other = _Item("tests/a.py::test_kept[x, y]"), _Item("tests/a.py::test_other")
    conftest._mark_slow_cases(_config(pytest.Config.ArgsSource.ARGS), [kept, other])  # a chosen subset
    assert kept.markers == ["slow"] and other.markers == []
    with pytest.raises(pytest.UsageError, match=r"name no test: \['tests/a.py::test_renamed'\]"):
        conftest._mark_slow_cases(_config(pytest.Config.ArgsSource.TESTPATHS), [kept, other])


def test_every_listed_case_names_a_test_file():
    for nodeid in conftest._slow_case_ids():
        path = conftest.SLOW_CASES.parent.parent / nodeid.split("::")[0]
        name = nodeid.split("::")[1].split("[")[0]
        assert path.is_file() and f"def {name}(" in path.read_text(), nodeid

"""``benchmarks/README.md`` reaches every committed result file, and its links resolve."""

import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
README = BENCHMARKS / "README.md"


def _linked_topics() -> list[Path]:
    return [BENCHMARKS / name for name in re.findall(r"\]\((topics/[\w.-]+\.md)\)", README.read_text())]


def _named(name: str, text: str) -> bool:
    """``name`` occurs in ``text`` as a whole file name (not as part of a longer one)."""
    return re.search(r"(?<![\w.-])" + re.escape(name) + r"(?![\w-])", text) is not None


def unreachable(results: Path, text: str) -> list[str]:
    """The files of ``results`` that ``text`` does not name: by their own name, as a backticked
    stem (`` `name` ``, for a group of files listed by stem), or, for a ``.json`` or figure, by
    the ``.md`` beside it (the README's "``name.md`` + ``.json`` + ``.png``")."""
    return [f.name for f in sorted(results.iterdir())
            if not (_named(f.name, text) or f"`{f.stem}`" in text
                    or (f.suffix in (".json", ".png") and _named(f.stem + ".md", text)))]


def test_every_result_file_is_named_in_the_readme_or_a_topic_it_links():
    topics = _linked_topics()
    assert topics and all(t.exists() for t in topics)
    text = "\n".join([README.read_text(), *(t.read_text() for t in topics)])
    assert unreachable(BENCHMARKS / "results", text) == []


def test_the_reachability_check_catches_a_file_no_one_names(tmp_path):
    for name in ("a.md", "a.json", "a.png", "b_c.md", "b.json", "d.json"):
        (tmp_path / name).write_text("")
    text = "[`a.md`](results/a.md) + `.json` + `.png`; `b_c.md`; `d`"
    assert unreachable(tmp_path, text) == ["b.json"]


def test_the_readme_and_topic_links_resolve():
    for source in [README, *_linked_topics()]:
        for target in re.findall(r"\]\(([^)#:\s]+)\)", source.read_text()):
            assert (source.parent / target).exists(), f"{source.name} links to a missing {target}"

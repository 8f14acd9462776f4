"""The README and docs/ cannot rot: every relative link reaches a file (and its heading, for an
anchor), every repository path a page names in backticks exists, every page is reachable from the
index, and the README's first screen holds the two commands, true to the Makefile and CI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"`((?:autotuner|tests|tools|benchmarks|docker|scenarios)/[\w./-]*\w)`")
FIRST_SCREEN = 45  # lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", page.read_text(), re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_reaches_its_file_and_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # an external address
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no such heading)")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_repository_path_exists(page: Path) -> None:
    missing = [p for p in PATH.findall(page.read_text()) if not (ROOT / p).exists()]
    assert missing == []


def test_every_page_is_reachable_from_the_index() -> None:
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall((ROOT / "docs" / "index.md").read_text())}
    assert sorted(p.name for p in PAGES[1:] if p.name != "index.md" and p.name not in linked) == []


def test_the_first_screen_holds_the_two_commands_and_they_are_true() -> None:
    first = (ROOT / "README.md").read_text().splitlines()[:FIRST_SCREEN]
    commands = [line.strip() for line in first if line.startswith("    make ")]
    assert commands == ["make quickstart", "make test"]
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
    assert {"quickstart", "test"} <= set(targets)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_stays_an_entry_point() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_the_slug_follows_github() -> None:
    assert slug("Start from what you run: `autotuner init`") == "start-from-what-you-run-autotuner-init"


def test_the_generated_references_are_current() -> None:
    """Run `python -m tools.docs_reference` after changing a scenario or daemon-config model, or after
    `benchmarks/sim_accuracy.py` rewrote the simulator's accuracy figures."""
    from tools.docs_reference import ACCURACY_PAGE, FIGURES, pages

    generated = pages()
    # The accuracy page is generated once the benchmark has written its figures (and then must match them).
    assert (ACCURACY_PAGE in generated) == FIGURES.is_file()
    stale = [str(path.relative_to(ROOT)) for path, text in generated.items() if path.read_text() != text]
    assert stale == []


# Two classes, a metric without rows (stored as NaN, as the benchmark writes it) and a class the page
# does not know yet.
FIGURES_SAMPLE = """{"runs": 7, "measured": "2026-01-02", "digest": "x", "classes": {
 "rtx-3090": {"tput": {"n": 3, "median_pct": 4.25, "worst_pct": -19.1, "worst_row": "3090-a"},
              "ttft": {"n": 0, "median_pct": NaN, "worst_pct": NaN, "worst_row": "-"}},
 "all": {"tput": {"n": 5, "median_pct": 9.8, "worst_pct": 57.4, "worst_row": "4090-b"}},
 "mi300": {"tpot": {"n": 1, "median_pct": 2.0, "worst_pct": 2.0, "worst_row": "mi-c"}}}}"""


def test_the_accuracy_page_renders_the_figures() -> None:
    import json

    from tools.docs_reference import accuracy_page

    text = accuracy_page(json.loads(FIGURES_SAMPLE))
    assert "measured on 2026-01-02 against 7 published runs" in text
    assert "`python benchmarks/sim_accuracy.py`" in text
    assert re.findall(r"^## (.+)$", text, re.M) == ["All published runs", "RTX 3090", "mi300"]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "metric" not in line]
    # Within a class TTFT comes before throughput whatever the file's order; no rows reads as such.
    assert rows == ["| throughput | 5 | ±9.8 % | +57.4 % | `4090-b` |",
                    "| TTFT | 0 | — | — | — |",
                    "| throughput | 3 | ±4.2 % | -19.1 % | `3090-a` |",
                    "| TPOT | 1 | ±2.0 % | +2.0 % | `mi-c` |"]


def test_no_accuracy_page_before_the_figures_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tools import docs_reference

    assert docs_reference.accuracy_pages(tmp_path / "accuracy_figures.json") == {}
    (tmp_path / "accuracy_figures.json").write_text(FIGURES_SAMPLE)
    assert list(docs_reference.accuracy_pages(tmp_path / "accuracy_figures.json")) == [docs_reference.ACCURACY_PAGE]
    # main() writes nothing here (no pages) and says why the accuracy page is missing.
    monkeypatch.setattr(docs_reference, "pages", dict)
    monkeypatch.setattr(docs_reference, "FIGURES", docs_reference.ROOT / "no-such-figures.json")
    assert docs_reference.main() == 0
    assert "skipped docs/simulator-accuracy.md: no-such-figures.json does not exist yet" in capsys.readouterr().err

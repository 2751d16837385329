"""Numbers in README.md come from committed outputs.

(a) Every generated block (`<!-- generated:NAME begin/end -->`) equals what
`analysis.report.readme` renders from the committed notebooks' outputs.
(b) Every number in the hand-written prose around the blocks (code, blockquotes and double
quotes left out, as `analysis.report.prose` reads prose) is printed by some committed notebook
(`notebooks/*.ipynb`, `figures/cpu-study/*.ipynb`) at its printed precision, or is an input: a
notebook's parameter, a value in `configs/` or the Makefile, a small integer, a year, a version.
No measured duration (`13m44s`, `14 minutes`) is quoted in prose: no committed output records
how long `make report`, `make test` or `make study` took.
(c) The check finds a made-up number planted in a copy of the README.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analysis.report import prose, readme

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(ROOT.glob("notebooks/[0-9][0-9]-*.ipynb")) + sorted(
    ROOT.glob("figures/cpu-study/[0-9][0-9]-*.ipynb")
)
INPUT_FILES = [*sorted(ROOT.glob("configs/*.toml")), ROOT / "Makefile"]
PARAMETER_TAGS = {"parameters", "injected-parameters"}
DURATION = re.compile(
    r"\b\d+m\d{1,2}s\b|\b\d+(?:\.\d+)?\s?(?:min|mins|minutes|hours?|h)\b", re.IGNORECASE
)


@pytest.fixture(scope="module")
def candidates() -> list[float]:
    """Every number the committed notebooks print, their parameters, configs and Makefile."""
    numbers: list[float] = []
    for path in NOTEBOOKS:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        numbers += prose.numbers_in_outputs(notebook)
        parameters = [
            cell
            for cell in notebook["cells"]
            if cell.get("cell_type") == "code"
            and PARAMETER_TAGS & set(cell.get("metadata", {}).get("tags", []))
        ]
        numbers += prose.numbers_in_sources({"cells": parameters})
    for path in INPUT_FILES:
        text = re.sub(r"#[^\n]*", "", path.read_text(encoding="utf-8"))  # comments are not inputs
        numbers += [float(m.replace(",", "")) for m in re.findall(r"\d+(?:\.\d+)?", text)]
    return numbers


@pytest.fixture(scope="module")
def markdown() -> str:
    return (ROOT / readme.README).read_text(encoding="utf-8")


def unsupported_numbers(markdown: str, candidates: list[float]) -> list[str]:
    """`line: number | the line` for each prose number outside the generated blocks that no
    committed output or input supports."""
    prose_only = readme.strip_generated(markdown)
    lines = prose_only.split("\n")
    return [
        f"{n.line}: {n.text!r} | {lines[n.line - 1].strip()}"
        for n in prose.unsupported(prose_only, candidates)
    ]


def quoted_durations(markdown: str) -> list[str]:
    """Measured durations in prose outside the generated blocks, code and blockquotes."""
    text, fenced, found = readme.strip_generated(markdown), False, []
    for number, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced or line.lstrip().startswith(">"):
            continue
        visible = re.sub(r"(`+).+?\1", "", line)
        found += [f"{number}: {m.group()!r} | {line.strip()}" for m in DURATION.finditer(visible)]
    return found


def test_every_generated_block_is_current(markdown: str) -> None:
    names = [block.name for block in readme.blocks(markdown)]
    assert sorted(names) == sorted(readme.SECTIONS), "README.md lacks or repeats a block"
    _, changed = readme.update(markdown)
    assert not changed, f"stale blocks {changed}: run `python -m analysis readme`"


def test_prose_numbers_are_in_committed_outputs(markdown: str, candidates: list[float]) -> None:
    missing = unsupported_numbers(markdown, candidates)
    assert not missing, "numbers in README.md prose that no committed output prints:\n" + (
        "\n".join(missing)
    )


def test_prose_quotes_no_measured_duration(markdown: str) -> None:
    assert not quoted_durations(markdown), "\n".join(quoted_durations(markdown))


def test_a_made_up_number_is_reported(markdown: str, candidates: list[float]) -> None:
    planted = markdown.replace(
        "## Layout", "The cache saved 987.654 ms per request here.\n\n## Layout", 1
    )
    assert planted != markdown
    found = unsupported_numbers(planted, candidates)
    assert any("'987.654'" in line for line in found), found
    assert not any("987.654" in line for line in unsupported_numbers(markdown, candidates))


def test_a_made_up_duration_is_reported(markdown: str) -> None:
    planted = markdown.replace("## Layout", "`make report` took 13m44s.\n\n## Layout", 1)
    assert any("13m44s" in line for line in quoted_durations(planted))


FAKE = "intro\n<!-- generated:one begin -->\n{one}<!-- generated:one end -->\nmid\n" + (
    "<!-- generated:two begin -->\n{two}<!-- generated:two end -->\nend\n"
)


@pytest.fixture()
def fake_sections(monkeypatch: pytest.MonkeyPatch) -> str:
    """Two blocks rendered from fixed text, so that these tests do not depend on the state of
    the notebooks; returns the markdown with both blocks current."""
    sections = {"one": lambda root: "Hit rate 8.92 %.", "two": lambda root: "- a\n- b\n"}
    monkeypatch.setattr(readme, "SECTIONS", sections)
    return FAKE.format(one="Hit rate 8.92 %.\n", two="- a\n- b\n")


def test_a_changed_block_is_stale(fake_sections: str) -> None:
    assert readme.update(fake_sections) == (fake_sections, [])
    edited = fake_sections.replace("Hit rate 8.92 %.", "Hit rate 99.99 %.")
    updated, changed = readme.update(edited)
    assert changed == ["one"] and updated == fake_sections
    assert "99.99" not in readme.strip_generated(fake_sections)


def test_check_command_exits_1_on_a_stale_block(
    fake_sections: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis import cli

    stale = tmp_path / "README.md"
    stale.write_text(fake_sections.replace("- b\n", "- old\n"), encoding="utf-8")
    stale.chmod(0o644)
    assert cli.main(["readme", "--check", "--path", str(stale)]) == 1
    assert "two" in capsys.readouterr().out
    assert cli.main(["readme", "--path", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == fake_sections
    assert stale.stat().st_mode & 0o777 == 0o644  # the rewrite keeps the file's mode
    assert cli.main(["readme", "--check", "--path", str(stale)]) == 0


def test_markers_must_pair() -> None:
    with pytest.raises(readme.SourceError, match="no end marker"):
        readme.blocks("<!-- generated:x begin -->\ntext\n")
    with pytest.raises(readme.SourceError, match="without its begin"):
        readme.blocks("text\n<!-- generated:x end -->\n")


def test_tables_are_read_by_column_and_rates_keep_their_digits() -> None:
    import pandas as pd

    frame = pd.DataFrame(
        {
            "pattern": ["one shared prefix", "thrash: 43 distinct prefixes, round robin"],
            "hit_rate": [0.977, 0.011],
            "notes": ["", ""],
        }
    )
    text = "header line\n" + frame.to_string(index=False, float_format=lambda v: f"{v:.3f}")
    rows = readme.parse_table(text, ["pattern", "hit_rate"])
    assert rows == [
        {"pattern": "one shared prefix", "hit_rate": "0.977", "notes": ""},
        {"pattern": "thrash: 43 distinct prefixes, round robin", "hit_rate": "0.011", "notes": ""},
    ]
    assert readme.parse_table(text, ["no_such_column"]) == []
    assert readme.pct("0.8412") == "84.12 %"
    assert readme.pct("0.011") == "1.1 %"


def test_the_overhead_verdict_follows_the_sign_and_the_drift_between_runs() -> None:
    from analysis.serving.intervals import Interval, overhead_verdict

    steady = [1.0, 1.0, 1.01, 0.99]  # caching off barely drifts across fractions
    assert overhead_verdict(Interval(1.02, 1.017, 1.034), steady).startswith("caching on faster")
    assert overhead_verdict(Interval(0.96, 0.95, 0.98), steady).startswith("caching on slower")
    assert "includes 1" in overhead_verdict(Interval(1.0, 0.986, 1.012), steady)
    # the same work at six fractions: one odd run (0.499) does not widen the drift band
    drifting = [0.678, 0.675, 0.652, 0.636, 0.499, 0.639]
    assert overhead_verdict(Interval(0.895, 0.858, 0.932), drifting).startswith("caching on slower")
    wide = [0.70, 0.80, 0.90, 1.00, 1.10, 1.20, 1.30]  # drifting by a quarter either way
    within = overhead_verdict(Interval(0.895, 0.858, 0.932), wide)
    assert within.startswith("unresolved: caching on ran slower") and "0.85-1.15x" in within
    assert "no overhead shows" not in within

"""Every number a reader sees in a notebook's prose is one its run printed.

`analysis.report.prose` finds the numbers of each markdown cell and looks for each one, at its
printed precision, among the numbers of the notebook's outputs and code. One case per
committed notebook (the CPU study's executed notebooks included), unit tests of the parser
and the matcher, and a made-up number injected into a copy of a real notebook, which the
check must report.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from analysis.report import prose

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
    (ROOT / "figures" / "cpu-study").glob("*.ipynb")
)

# A notebook whose prose passes, for the injection test.
CLEAN_NOTEBOOK = ROOT / "notebooks" / "04-why-few-blocks-inflate-hit-rate.ipynb"


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.relative_to(ROOT).as_posix()) for p in NOTEBOOKS]
)
def test_every_prose_number_was_printed_by_the_run(path):
    findings = prose.check_notebook(path)
    assert not findings, "numbers in the prose that this run did not print:\n" + "\n".join(
        f"  {finding}" for finding in findings
    )


def test_the_allowlist_names_only_notebooks_that_exist():
    names = {p.relative_to(ROOT).as_posix() for p in NOTEBOOKS}
    assert set(prose.ALLOWLIST) <= names
    for entries in prose.ALLOWLIST.values():
        assert all(reason.strip() for reason in entries.values()), "every entry needs a reason"


def texts(markdown: str) -> list[str]:
    return [n.text for n in prose.numbers_in_prose(markdown)]


# --- the parser: what a reader takes for a number ---------------------------------------------


def test_plain_numbers_percentages_ratios_and_thousands():
    numbers = prose.numbers_in_prose("It hit 8.9 % of 11,072 tokens, 4.3x more, with B=16.")
    assert [n.text for n in numbers] == ["8.9 %", "11,072", "4.3x", "16"]
    percent, thousands, ratio, block = numbers
    assert (percent.value, percent.decimals, percent.percent) == (8.9, 1, True)
    assert (thousands.value, thousands.decimals, thousands.percent) == (11072.0, 0, False)
    assert ratio.value == 4.3 and not ratio.percent
    assert block.value == 16


def test_line_numbers_count_from_one():
    numbers = prose.numbers_in_prose("at first 12.5\n\nthen 33 %")
    assert [(n.text, n.line) for n in numbers] == [("12.5", 1), ("33 %", 3)]


def test_a_range_before_a_percent_sign_is_a_percentage():
    numbers = prose.numbers_in_prose("between 20-30 % and 0.578-0.753 s")
    assert [(n.text, n.percent) for n in numbers] == [
        ("20", True),
        ("30 %", True),
        ("0.578", False),
        ("0.753", False),
    ]


@pytest.mark.parametrize(
    "markdown",
    [
        "```\nrate = 37.3\n```",
        "~~~python\nx = 55\n~~~",
        "the flag `--num-blocks 513` is set",
        "the ratio $\\frac{47}{100}$ and $$ 99 $$",
        "<!-- 37.3 % was the old value -->",
        "see [the log](https://example.org/run/4711) and https://example.org/page/99",
        "> seed 001: correct hit rate 23.44 %",
        'the seed printed "74.14 %" as its GPU rate',
        "the seed printed “60 %+ with 16 blocks of 8”",
        "written in 2025, on 26 Jul 2024, on July 26, on 2026-11-23",
        "vLLM 0.32, Python 3.11, version 0.32.0, Llama-3.2-1B, Llama 3.1/3.2",
        "on an H100 with an 8B model, gpt-4, sha256, fp16 and bf16, nb09, NEW-4",
        "PR #18003 fixed issue #25780",
        "seed 003, seed 004, notebook 05, notebooks 04 and 05, cells 15 and 17/19",
        "cell 7, section 9, figure 2, row 003-27",
        "two servers, 3 repeats, turn 2, 0 misses, 10 blocks",
        "**Run time on a 2-core CPU.** About 35 s, 3-4 min when loaded.",
    ],
)
def test_what_is_not_a_prose_number(markdown):
    assert texts(markdown) == []


def test_a_name_value_pair_is_a_number_not_an_identifier():
    assert texts("at B=16 and n = 700") == ["16", "700"]


def test_small_integers_count_as_percentages_and_ratios():
    assert texts("3 repeats at 3 % and 4x") == ["3 %", "4x"]


def test_run_time_paragraph_ends_at_a_blank_line():
    assert texts("**Run time.** About 20 s.\n\nThe rate is 37.3 %.") == ["37.3 %"]


# --- the matcher: a candidate supports a number that prints as it ------------------------------


def number(markdown: str) -> prose.ProseNumber:
    (found,) = prose.numbers_in_prose(markdown)
    return found


def test_a_candidate_matches_at_the_printed_precision():
    assert number("8.9").matches(8.92)
    assert number("8.9").matches(8.85)
    assert not number("8.9").matches(8.96)  # prints as 9.0
    assert number("8.92").matches(8.9166)
    assert not number("8.92").matches(8.9)
    assert number("11,072").matches(11072)
    assert not number("11,072").matches(11073)


def test_a_percentage_matches_a_fraction_and_a_percentage():
    assert number("4.90 %").matches(0.048964)
    assert number("4.90 %").matches(4.9)
    assert not number("4.90 %").matches(0.0485)
    assert not number("49").matches(0.49)  # not a percentage: no scaling


def test_about_makes_trailing_zeros_insignificant():
    assert number("about 2,000 tokens").matches(1873)
    assert not number("2,000 tokens").matches(1873)
    assert number("about 26 tokens").matches(26.4)
    assert not number("about 26 tokens").matches(25)
    assert number("about 4x").matches(4.3)
    assert not number("about 4x").matches(4.6)


def test_unsupported_lists_what_no_candidate_matches():
    markdown = "Hits: 84.1 % multi-turn, 8.9 % single-turn, 37.3 % made up."
    missing = prose.unsupported(markdown, [0.8412, 0.0892, 500])
    assert [n.text for n in missing] == ["37.3 %"]


# --- candidates: what the run printed and what it was given ------------------------------------


def code_cell(source: str, outputs: list[dict], tags: list[str] | None = None) -> dict:
    return {
        "cell_type": "code",
        "metadata": {"tags": tags or []},
        "source": source,
        "outputs": outputs,
    }


def test_numbers_in_outputs_read_every_text_output():
    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": "9999 in prose is no output"},
            code_cell("", [{"output_type": "stream", "name": "stdout", "text": ["11,072 hits\n"]}]),
            code_cell("", [{"output_type": "stream", "name": "stderr", "text": "0.25 s"}]),
            code_cell(
                "# NBVAL_IGNORE_OUTPUT\n",
                [
                    {
                        "output_type": "execute_result",
                        "data": {"text/plain": "1.5e-05", "text/html": "<td>77</td>"},
                    }
                ],
            ),
            code_cell(
                "", [{"output_type": "display_data", "data": {"text/markdown": "**6.39%** of it"}}]
            ),
            code_cell("", [{"output_type": "stream", "name": "stdout", "text": "on 26 Jul 2024"}]),
        ]
    }
    found = prose.numbers_in_outputs(notebook)
    assert found == [11072.0, 0.25, 1.5e-05, 77.0, 6.39]


def test_numbers_in_sources_skip_comments_but_not_the_parameters():
    notebook = {
        "cells": [
            code_cell("blocks = 513  # 512 is refused\n", [], tags=["parameters"]),
            code_cell("x = limit(300)  # 400 is a comment\ny = f'{x:.2%}'\n", []),
        ]
    }
    assert prose.numbers_in_sources(notebook) == [513.0, 512.0, 300.0, 2.0]


# --- a notebook: the check can fail -------------------------------------------------------------


def test_a_made_up_number_in_a_real_notebook_is_reported(tmp_path):
    notebook = json.loads(CLEAN_NOTEBOOK.read_text(encoding="utf-8"))
    copied = tmp_path / CLEAN_NOTEBOOK.name
    copied.write_text(json.dumps(notebook), encoding="utf-8")
    before = prose.check_notebook(copied)

    changed = copy.deepcopy(notebook)
    index = next(i for i, c in enumerate(changed["cells"]) if c["cell_type"] == "markdown")
    source = "".join(changed["cells"][index]["source"])
    changed["cells"][index]["source"] = source + "\n\nThe sample reached a hit rate of 37.3 %."
    copied.write_text(json.dumps(changed), encoding="utf-8")
    after = prose.check_notebook(copied)

    new = [f for f in after if f not in before]
    assert [(f.cell, f.number.text) for f in new] == [(index, "37.3 %")]
    assert new[0].number.line == source.count("\n") + 3
    assert f"cell {index} line {new[0].number.line}" in str(new[0])
    # the same number, allowlisted with a reason, is not reported
    allowed = prose.check_notebook(copied, allowlist={"37.3 %": "a test"})
    assert [f for f in allowed if f not in before] == []

"""Figure modules draw from small result tables; figures are saved with their captions."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from analysis import plots
from analysis.plots import capacity, traces, turns


def capacity_rows() -> pd.DataFrame:
    """Values differ by trace, block size and capacity, so a mixed-up series is seen."""
    rows = []
    for trace, base in (("single_turn", 0.01), ("multi_turn", 0.3)):
        for block_size in (16, 32):
            for n, preempted in ((513, 40), (2000, 0)):
                first = base + block_size / 1000 + n / 100_000
                rows.append(
                    {
                        "trace": trace,
                        "block_size": block_size,
                        "num_blocks": n,
                        "first_prefill_rate": first,
                        "all_prefill_rate": first + 0.2 if preempted else first,
                        "ideal_rate": base + 0.1 + block_size / 1000,
                        "preemptions": preempted,
                        "recompute_share": 0.3 if preempted else 0.0,
                        "first_prefill_hits": 10,
                        "all_prefill_hits": 200 if preempted else 10,
                        "all_prefill_queries": 1000,
                        "concurrency": 8,
                    }
                )
    return pd.DataFrame(rows)


def assert_readable(folder, name: str, fig) -> None:
    """The saved PNG decodes to a picture that is not blank; the SVG parses and holds the
    figure's titles as text (svg.fonttype none)."""
    png = imread(folder / f"{name}.png")
    assert png.ndim == 3 and min(png.shape[:2]) > 100
    assert (png != png[0, 0]).any(), f"{name}.png is one colour"
    root = ET.parse(folder / f"{name}.svg").getroot()
    assert root.tag.endswith("svg")
    svg_text = " ".join(t for t in root.itertext())
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles and all(" ".join(t.split()) in " ".join(svg_text.split()) for t in titles)


def test_figures_save_png_svg_and_caption(tmp_path):
    plots.use_style()
    rows = capacity_rows()
    figures = {
        "hit-rates": capacity.hit_rates_figure(rows),
        "preemptions": capacity.preemption_figure(rows),
        "decomposition": capacity.hit_decomposition_figure(rows, 16),
        "concurrency": turns.concurrency_figure(rows[rows["trace"] == "multi_turn"]),
        "per-request": turns.per_request_figure({"multi_turn": np.array([0.0, 0.5, 0.9])}),
        "prompts": traces.prompt_length_figure({"multi_turn": pd.Series([10, 100, 1000])}),
    }
    for name, fig in figures.items():
        plots.save_figure(fig, name, f"Caption of {name} | with a bar.", folder=tmp_path)
        assert_readable(tmp_path, name, fig)
    readme = (tmp_path / "README.md").read_text()
    assert readme.count("| [") == len(figures)
    assert "Caption of hit-rates / with a bar." in readme


def test_hit_rate_lines_carry_each_series_values():
    rows = capacity_rows()
    fig = capacity.hit_rates_figure(rows)
    checked = 0
    for ax in fig.axes:
        trace = {"single-turn": "single_turn", "multi-turn": "multi_turn"}[ax.get_title()]
        for line in ax.lines:
            label = line.get_label()
            column = {"all": "all_prefill_rate", "fir": "first_prefill_rate", "ide": "ideal_rate"}
            block = int(label.rsplit(" ", 1)[1])
            expected = rows[(rows["trace"] == trace) & (rows["block_size"] == block)]
            expected = expected.sort_values("num_blocks")
            np.testing.assert_allclose(line.get_xdata(), expected["num_blocks"])
            np.testing.assert_allclose(line.get_ydata(), expected[column[label[:3]]])
            checked += 1
    assert checked == 2 * 2 * 3  # traces x block sizes x rates


def test_per_request_figure_is_the_empirical_cdf():
    rates = np.array([0.9, 0.0, 0.5, 0.5])
    fig = turns.per_request_figure({"multi_turn": rates})
    (line,) = fig.axes[0].lines
    x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
    # each drawn step lies between the shares of requests below and at or below its rate,
    # counted directly, and the steps end at every request
    below = np.array([(rates < v).mean() for v in x])
    at_or_below = np.array([(rates <= v).mean() for v in x])
    assert (below < y).all() and (y <= at_or_below).all()
    assert y[-1] == 1.0 and sorted(set(x)) == sorted(set(rates))


def test_a_figure_with_nan_data_warns_naming_the_series(tmp_path):
    fig = turns.per_request_figure({"multi_turn": np.array([0.1, 0.2])})
    fig.axes[0].plot([1, 2], [0.5, np.nan], label="broken series")
    with pytest.warns(RuntimeWarning, match="figure nan-test: 'broken series' has 1 NaN"):
        plots.save_figure(fig, "nan-test", "x", folder=tmp_path)


def test_caption_is_replaced_not_duplicated(tmp_path):
    fig = turns.per_request_figure({"single_turn": np.array([0.0])})
    plots.save_figure(fig, "one", "first caption", folder=tmp_path)
    plots.save_figure(fig, "one", "second caption", folder=tmp_path)
    readme = (tmp_path / "README.md").read_text()
    assert "second caption" in readme and "first caption" not in readme


def test_figure_names_are_checked(tmp_path):
    fig = turns.per_request_figure({"single_turn": np.array([0.0])})
    with pytest.raises(ValueError, match="figure name"):
        plots.save_figure(fig, "Bad Name", "x", folder=tmp_path)

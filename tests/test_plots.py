"""Figure modules draw from small result tables; figures are saved with their captions."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from analysis import plots
from analysis.plots import capacity, traces, turns


def capacity_rows() -> pd.DataFrame:
    rows = []
    for trace in ("single_turn", "multi_turn"):
        for block_size in (16, 32):
            for n, preempted in ((513, 40), (2000, 0)):
                rows.append(
                    {
                        "trace": trace,
                        "block_size": block_size,
                        "num_blocks": n,
                        "first_prefill_rate": 0.01,
                        "all_prefill_rate": 0.2 if preempted else 0.01,
                        "ideal_rate": 0.02,
                        "preemptions": preempted,
                        "recompute_share": 0.3 if preempted else 0.0,
                        "first_prefill_hits": 10,
                        "all_prefill_hits": 200 if preempted else 10,
                        "all_prefill_queries": 1000,
                        "concurrency": 8,
                    }
                )
    return pd.DataFrame(rows)


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
        assert (tmp_path / f"{name}.png").stat().st_size > 0
        assert (tmp_path / f"{name}.svg").stat().st_size > 0
    readme = (tmp_path / "README.md").read_text()
    assert readme.count("| [") == len(figures)
    assert "Caption of hit-rates / with a bar." in readme


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

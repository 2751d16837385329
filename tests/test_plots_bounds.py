"""The figures of notebook 07 draw and save from a tiny synthetic trace, and their helpers keep
only comparable engine points and read the right capacity off the LRU curve."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from analysis import plots
from analysis.metrics import bounds
from analysis.plots import bounds as bounds_plots

BLOCK = 4


def tiny_trace(first_id: int) -> pd.DataFrame:
    """Three conversations of two turns; turn 1's prompt extends turn 0's prompt and reply."""
    rows = []
    for c in range(3):
        prompt = list(range(first_id + 100 * c, first_id + 100 * c + 9))
        reply = [first_id + 100 * c + 50 + k for k in range(5)]
        follow = prompt + reply + [7, 7, 7, 7, 7, 7]
        for turn, (p, r) in enumerate(((prompt, reply), (follow, [1, 2, 3]))):
            rows.append(
                {
                    "request_id": f"c{c}/{turn}",
                    "conversation_id": f"c{c}",
                    "turn_index": turn,
                    "prompt_ids": np.array(p, np.int32),
                    "response_ids": np.array(r, np.int32),
                }
            )
    rows.append(dict(rows[0], request_id="dup/0", conversation_id="dup"))  # a repeated prompt
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def indexes():
    return {
        "single_turn": bounds.index_trace(tiny_trace(1000).query("turn_index == 0")),
        "multi_turn": bounds.index_trace(tiny_trace(5000), include_outputs=True),
    }


def saved(tmp_path, name: str) -> bool:
    """Both files decode: the PNG to a picture that is not one colour, the SVG as XML."""
    import xml.etree.ElementTree as ET

    from matplotlib.image import imread

    png = imread(tmp_path / f"{name}.png")
    return (png != png[0, 0]).any() and ET.parse(tmp_path / f"{name}.svg").getroot().tag.endswith(
        "svg"
    )


def brute_force_hit_tokens(trace: pd.DataFrame, block: int, include_outputs: bool) -> np.ndarray:
    """Per request, in trace order: the longest common prefix with any earlier stored sequence
    (prompt, plus the reply but its last token with outputs), capped at prompt - 1, in whole
    blocks: the module doc's definition, computed pair by pair."""
    stored: list[list[int]] = []
    hits = []
    for prompt, reply in zip(trace["prompt_ids"], trace["response_ids"], strict=True):
        prompt, reply = list(prompt), list(reply)
        best = 0
        for earlier in stored:
            common = 0
            while common < min(len(prompt), len(earlier)) and prompt[common] == earlier[common]:
                common += 1
            best = max(best, common)
        hits.append(min(best, len(prompt) - 1) // block * block)
        stored.append(prompt + (reply[: max(len(reply), 1) - 1] if include_outputs else []))
    return np.array(hits)


def brute_force_rate(trace: pd.DataFrame, block: int, include_outputs: bool) -> float:
    total = sum(len(p) for p in trace["prompt_ids"])
    return brute_force_hit_tokens(trace, block, include_outputs).sum() / total


TRACES = {
    "single_turn": (tiny_trace(1000).query("turn_index == 0"), False),
    "multi_turn": (tiny_trace(5000), True),
}


def test_capacity_figure_with_engine_points(tmp_path, indexes):
    curves = pd.concat(
        [
            bounds.capacity_curves(index, BLOCK, [1, 2, 4, 8], ["lru", "opt"]).assign(trace=name)
            for name, index in indexes.items()
        ]
    )
    ideal = {name: bounds.ideal_hit_rate(index, BLOCK) for name, index in indexes.items()}
    engine = pd.DataFrame(
        {
            "trace": ["multi_turn", "multi_turn", "single_turn"],
            "engine": ["replay"] * 3,
            "num_blocks": [3, 9, 3],
            "first_prefill_rate": [0.01, ideal["multi_turn"], 0.0],
            "all_prefill_rate": [0.2, ideal["multi_turn"], 0.9],  # 0.9: off the scale
        }
    )
    plots.use_style()
    fig = bounds_plots.capacity_curves_figure(curves, ideal, BLOCK, engine)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "90%" in texts  # the single-turn all-prefill point is pinned and labelled
    assert fig.axes[0].get_ylim()[1] < 0.9
    plots.save_figure(fig, "bounds-capacity-curves", "Capacity curves.", folder=tmp_path)
    plt.close(fig)
    assert saved(tmp_path, "bounds-capacity-curves")
    assert "Capacity curves." in (tmp_path / "README.md").read_text()
    # three off-scale values at neighbouring capacities: their labels do not share a line
    crowded = engine.iloc[[2, 2, 2]].assign(num_blocks=[3, 4, 5], all_prefill_rate=[0.9, 0.8, 0.7])
    fig = bounds_plots.capacity_curves_figure(curves, ideal, BLOCK, crowded)
    offsets = [t.xyann for ax in fig.axes for t in ax.texts]
    assert len(offsets) == 3 and len({y for _, y in offsets}) == 3
    plt.close(fig)


def test_reuse_and_granularity_figures(tmp_path, indexes):
    distances = pd.concat(
        [bounds.reuse_distances(i, BLOCK).assign(trace=n) for n, i in indexes.items()]
    )
    reuse = pd.concat(
        [bounds.token_vs_block_reuse(i, (1, 2, 4)).assign(trace=n) for n, i in indexes.items()]
    )
    granularity = bounds_plots.token_vs_block_figure(reuse)
    drawn = [line for line in granularity.axes[0].lines if len(line.get_xdata())]
    for name, (trace, outputs) in TRACES.items():  # each trace's line, found by its colour
        colour = to_rgba(bounds_plots.trace_color(name))
        (line,) = [line for line in drawn if to_rgba(line.get_color()) == colour]
        np.testing.assert_allclose(line.get_xdata(), [1, 2, 4])
        expected = [brute_force_rate(trace, size, outputs) for size in (1, 2, 4)]
        np.testing.assert_allclose(line.get_ydata(), expected)
    for name, fig in (
        ("bounds-reuse-distance", bounds_plots.reuse_distance_figure(distances, BLOCK)),
        ("bounds-token-vs-block-reuse", granularity),
    ):
        plots.save_figure(fig, name, f"{name}.", folder=tmp_path)
        plt.close(fig)
        assert saved(tmp_path, name)


def test_comparable_engine_points_keeps_same_sample_block_and_outputs():
    points = pd.DataFrame(
        {
            "trace": ["multi_turn", "data/traces/multi_turn.parquet", "multi_turn", "single_turn"],
            "engine": ["replay"] * 4,
            "block_size": [16, 16, 32, 16],
            "num_blocks": [513, 1000, 257, 513],
            "limit": [1000, 1000, 1000, 40],
            "outputs": ["recorded"] * 4,
            "max_output_tokens": [None, None, None, 16],
            "first_prefill_rate": [0.1, 0.5, 0.2, 0.0],
            "all_prefill_rate": [0.3, 0.5, 0.2, 0.0],
        }
    )
    chosen, note = bounds_plots.comparable_engine_points(
        points, block_size=16, limit=1000, include_outputs=True
    )
    assert chosen["num_blocks"].tolist() == [513, 1000]
    assert set(chosen["trace"]) == {"multi_turn"}
    assert note.startswith("2 sweep points overlaid (2 others")
    empty, note = bounds_plots.comparable_engine_points(
        None, block_size=16, limit=1000, include_outputs=True
    )
    assert empty.empty and "make sweep" in note
    prompts_only, _ = bounds_plots.comparable_engine_points(
        points, block_size=16, limit=1000, include_outputs=False
    )
    assert prompts_only.empty  # the sweep cached replies; prompt-only bounds do not compare


def test_summary_capacity_is_where_lru_reaches_the_share(indexes):
    index = indexes["multi_turn"]
    row = bounds_plots.bounds_summary(index, BLOCK, share=0.9)
    ideal = bounds.ideal_bound(index, BLOCK)
    trace, outputs = TRACES["multi_turn"]
    assert row["ideal_%"] == pytest.approx(100 * brute_force_rate(trace, BLOCK, outputs))
    assert ideal.hit_tokens == brute_force_hit_tokens(trace, BLOCK, outputs).sum()
    assert row["later_turns_%"] > 0
    needed = row["lru_90%_blocks"]
    hits = bounds.lru_hit_blocks(index, BLOCK, [needed - 1, needed]) * BLOCK
    assert hits[1] >= 0.9 * ideal.hit_tokens > hits[0]


def test_default_capacities_low_end(indexes):
    index = indexes["multi_turn"]
    distinct = index.block_keys(BLOCK).num_keys
    sizes = bounds.default_capacities(index, BLOCK, 5, low=2)
    assert sizes[0] == 2 and sizes[-1] == distinct
    assert bounds.default_capacities(index, BLOCK, 5, low=10**6) == [distinct]


def test_engine_against_lru_puts_each_point_beside_the_bound_at_its_capacity(indexes):
    index = indexes["multi_turn"]
    engine = pd.DataFrame(
        {
            "trace": ["multi_turn", "multi_turn"],
            "engine": ["replay", "replay"],
            "num_blocks": [1, 1000],
            "first_prefill_rate": [0.0, 0.5],
        }
    )
    table = bounds_plots.engine_against_lru(engine, indexes, BLOCK)
    expected = bounds.lru_hit_blocks(index, BLOCK, [1, 1000]) * BLOCK / index.total_prompt_tokens
    assert table["lru_rate"].tolist() == pytest.approx(expected.tolist())
    assert table["lru_rate"].iloc[1] == pytest.approx(bounds.ideal_hit_rate(index, BLOCK))
    assert table["first_prefill_rate"].tolist() == [0.0, 0.5]

"""Sweep grids: expansion into points, block-count spacing, and errors that say what to fix."""

from __future__ import annotations

import pytest

from analysis import sweeps
from analysis.platform.errors import GridError


def write_grid(tmp_path, text: str):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return path


def test_log_spaced_blocks_keep_both_ends_and_grow():
    counts = sweeps.log_spaced_blocks(513, 99_336, 8)
    assert counts[0] == 513 and counts[-1] == 99_336
    assert counts == sorted(set(counts)) and len(counts) == 8


def test_log_spaced_blocks_with_no_room_gives_the_minimum():
    assert sweeps.log_spaced_blocks(513, 400, 8) == [513]


def test_grid_crosses_every_list_field(tmp_path):
    path = write_grid(
        tmp_path,
        """
[base]
limit = 10
[[series]]
name = "s"
traces = ["single_turn", "multi_turn"]
engines = ["replay"]
block_sizes = [16, 32]
num_blocks = "log:3"
concurrency = [1, 8]
""",
    )
    points = sweeps.grid_points(path, block_budget=lambda config: 4000)
    assert len(points) == 2 * 2 * 2 * 3
    ids = {p.point_id for p in points}
    assert len(ids) == len(points)
    first = points[0]
    assert first.config.limit == 10 and first.config.num_blocks == first.config.min_num_blocks
    assert "s-single_turn-replay-b16-n513-c1" in ids
    assert {p.config.concurrency for p in points} == {1, 8}


def test_grid_max_uses_the_budget(tmp_path):
    path = write_grid(
        tmp_path,
        """
[[series]]
name = "roomy"
traces = ["multi_turn"]
engines = ["replay"]
block_sizes = [8]
num_blocks = "max"
""",
    )
    (point,) = sweeps.grid_points(path, block_budget=lambda config: 12345)
    assert point.config.num_blocks == 12345


@pytest.mark.parametrize(
    "body, message",
    [
        ("[[series]]\nname='x'\ntraces=['a']\nengines=['replay']\nblock_sizes=[16]\n", "lacks"),
        (
            "[[series]]\nname='x'\ntraces=['a']\nengines=['replay']\nblock_sizes=[16]\n"
            "num_blocks='lots'\n",
            "num_blocks must be",
        ),
        (
            "[[series]]\nname='x'\ntraces=['a']\nengines=['replay']\nblock_sizes=[16]\n"
            "num_blocks=[600]\nwarp_speed=[1, 2]\n",
            "warp_speed",
        ),
        ("not = [valid", "not valid TOML"),
        ("[base]\nlimit = 3\n", r"no \[\[series\]\]"),
    ],
)
def test_bad_grids_say_what_is_wrong(tmp_path, body, message):
    with pytest.raises(GridError, match=message):
        sweeps.grid_points(write_grid(tmp_path, body), block_budget=lambda config: 4000)


def test_unknown_grid_name_lists_the_known_ones():
    with pytest.raises(GridError, match="default"):
        sweeps.grid_path("no-such-grid")


def test_committed_grids_expand():
    points = sweeps.grid_points("default", block_budget=lambda config: 100_000)
    series = {p.series for p in points}
    assert {"capacity", "engine-check", "concurrency", "outputs", "block-size"} <= series
    assert all(p.config.num_blocks >= p.config.min_num_blocks for p in points)
    gpu = sweeps.grid_points("gpu", block_budget=lambda config: 100_000)
    assert any(p.config.device == "cuda" for p in gpu)

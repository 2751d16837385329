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


def test_a_single_trace_engine_block_size_or_block_count_may_be_written_bare(tmp_path):
    body = "[[series]]\nname='s'\ntraces='multi_turn'\nengines='replay'\nblock_sizes=16\n"
    (point,) = sweeps.grid_points(write_grid(tmp_path, body + "num_blocks=600\n"))
    assert (point.config.trace, point.config.block_size, point.config.num_blocks) == (
        "multi_turn",
        16,
        600,
    )


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
        (
            "[[series]]\nname='x'\ntraces=5\nengines=['replay']\nblock_sizes=[16]\n"
            "num_blocks=[600]\n",
            "traces must be trace names or paths",
        ),
        ("not = [valid", "not valid TOML"),
        ("[base]\nlimit = 3\n", r"no \[\[series\]\]"),
        ("[series.s]\ntraces=['a']\n", r"`series` must be an array of tables"),
        ("series = 'x'\n", r"`series` must be an array of tables"),
        ("base = 5\n[[series]]\nname='x'\n", r"`base` must be a \[base\] table"),
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


MOONCAKE = "data/external/mooncake/conversation_trace.jsonl.gz"


def test_a_block_hash_trace_in_a_grid_replays_as_its_token_trace(tmp_path, monkeypatch):
    """The committed Mooncake trace, named in a series with its block size: every point runs
    the token trace `blockhash_to_trace` makes of it, written once under data/cache/."""
    from analysis.data.blockhash import load_blockhash_trace
    from analysis.data.traces import load_trace
    from analysis.platform.paths import repo_root

    source = repo_root() / MOONCAKE
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    (tmp_path / "data" / "external" / "mooncake").mkdir(parents=True)
    (tmp_path / MOONCAKE).write_bytes(source.read_bytes())
    body = (
        f"[[series]]\nname='m'\ntraces=['{MOONCAKE}']\nblockhash_block_size=512\n"
        "engines=['replay']\nblock_sizes=[512]\nnum_blocks=[100]\nlimit=40\n"
        "max_model_len=32768\n"
    )
    (point,) = sweeps.grid_points(write_grid(tmp_path, body))
    converted = point.config.trace
    assert converted.startswith(str(tmp_path / "data" / "cache" / "blockhash"))
    assert converted.endswith("-first40.parquet")
    assert point.point_id.startswith("m-conversation_trace-b512-")
    frame, report = load_blockhash_trace(tmp_path / MOONCAKE, 512)
    frame = frame.head(40)  # one conversation per request: no session ids
    tokens = load_trace(converted)
    assert report.malformed == 0 and len(tokens) == len(frame)
    assert (tokens["prompt_tokens"] == frame["input_length"]).all()
    # equal hash ids at equal positions are equal token blocks: every request opens with id 0
    first = {tuple(ids[:512]) for ids in tokens["prompt_ids"].head(50)}
    assert len(first) == 1 and (frame["hash_ids"].head(50).map(lambda h: h[0]) == 0).all()
    assert sweeps.grid_points(write_grid(tmp_path, body))[0].config.trace == converted


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("", "give blockhash_block_size, its own block size"),
        ("blockhash_block_size=0\n", "its own"),
    ],
)
def test_a_block_hash_trace_without_its_block_size_is_one_line(tmp_path, extra, message):
    from analysis.platform.paths import repo_root

    body = (
        f"[[series]]\nname='m'\ntraces=['{repo_root() / MOONCAKE}']\n{extra}"
        "engines=['replay']\nblock_sizes=[512]\nnum_blocks=[100]\n"
    )
    with pytest.raises(GridError, match=message):
        sweeps.grid_points(write_grid(tmp_path, body))


def test_the_mooncake_grids_expand():
    points = sweeps.grid_points("fleet-mooncake")
    assert {p.config.replicas for p in points} == {1, 2, 4, 8}
    assert all(p.config.num_blocks * p.config.replicas == 4096 for p in points)
    assert all(p.config.num_blocks >= p.config.min_num_blocks for p in points)
    assert points[0].config.trace.endswith(f"-first{points[0].config.limit}.parquet")
    full = sweeps.load_grid("fleet-mooncake-full")  # expanding it converts the whole trace
    default = sweeps.load_grid("fleet-mooncake")
    assert "limit" not in full["base"]  # the full grid is the default one over the whole trace
    assert [s["name"] for s in full["series"]] == [s["name"] for s in default["series"]]

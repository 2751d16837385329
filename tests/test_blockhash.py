"""Block-hash traces: import, hand-computed bounds, and the token trace synthesised from them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.data.blockhash import (
    TOKEN_LIMIT,
    BlockHashError,
    blockhash_to_trace,
    load_blockhash_trace,
)
from analysis.data.traces import TRACE_COLUMNS
from analysis.metrics import bounds

DATA = Path(__file__).parent / "data"
MOONCAKE = DATA / "blockhash_mooncake.jsonl"  # 512-token blocks, timestamps in ms
QWEN = DATA / "blockhash_qwen.jsonl"  # 16-token blocks, chats, timestamps in s
SCHEMA = TRACE_COLUMNS  # the trace schema every engine reads


def test_mooncake_import_counts_and_reports_bad_lines():
    frame, report = load_blockhash_trace(MOONCAKE, 512)
    assert report.lines == 8 and report.records == 6 and report.malformed == 2
    assert report.reasons == {"missing hash_ids": 1, "invalid JSON": 1}
    assert report.examples == ["line 3: missing hash_ids", "line 4: invalid JSON"]
    assert report.timestamp_unit == "ms" and not report.reordered
    assert frame["timestamp"].tolist() == [0.0, 0.0, 1.5, 3.0, 3.0, 4.0]
    assert frame["line"].tolist() == [1, 2, 5, 7, 8, 9]
    assert frame["turn_index"].tolist() == [0] * 6
    assert frame["conversation_id"].nunique() == 6
    assert frame.attrs["block_size"] == 512
    assert "2 malformed skipped" in report.summary()


def test_mooncake_bounds_by_hand():
    frame, _ = load_blockhash_trace(MOONCAKE, 512)
    index = bounds.index_trace(frame)
    # Requests hit 0, 2 (ids 0,1), 1 (1024 tokens: only 1 block may hit), 0 (ids 5,1,3,4 start
    # another chain), 3 (ids 0,1,3 stored by the second request), 0 (300 tokens: no full block).
    assert bounds.ideal_hit_blocks(index, 512).tolist() == [0, 2, 1, 0, 3, 0]
    assert bounds.ideal_hit_rate(index, 512) == pytest.approx(3072 / 7872)
    keys = index.block_keys(512)
    assert keys.num_keys == 7
    curves = bounds.capacity_curves(index, 512, [2, 3, 6, 7])
    hits = curves.set_index(["policy", "capacity"])["hit_blocks"].to_dict()
    # LRU: the 4-block request in between pushes (0,1,3) out below 7 blocks, and (0) and (0,1)
    # below 6; MIN keeps (0) and (0,1) at 2 blocks and also (0,1,3) at 3.
    assert [hits[("lru", c)] for c in (2, 3, 6, 7)] == [3, 3, 5, 6]
    assert [hits[("opt", c)] for c in (2, 3, 6, 7)] == [5, 6, 6, 6]


def test_qwen_import_follows_chats():
    frame, report = load_blockhash_trace(QWEN, 16)
    assert report.records == 5 and report.malformed == 2
    assert report.reasons == {
        "hash_ids is not a list of integers": 1,
        "output_length is not a non-negative integer": 1,
    }
    assert report.timestamp_unit == "s" and report.reordered
    assert report.orphan_turns == 1
    assert frame["chat_id"].tolist() == [100, 101, 102, 103, 104]
    assert frame["conversation_id"].tolist() == ["100", "101", "100", "100", "104"]
    assert frame["turn_index"].tolist() == [0, 0, 1, 2, 0]
    assert frame["type"].tolist() == ["text", "text", "text", "file", "text"]
    ideal = bounds.ideal_bound(bounds.index_trace(frame), 16)
    assert ideal.hit_tokens == 112 and ideal.prompt_tokens == 263
    assert ideal.multi_turn_hit_share == pytest.approx(96 / 112)


def test_unusable_files_raise_one_line_errors(tmp_path):
    with pytest.raises(BlockHashError, match="no block-hash trace"):
        load_blockhash_trace(tmp_path / "missing.jsonl", 16)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 1}\n[1, 2]\n')
    with pytest.raises(BlockHashError, match="no valid request.*line 1: missing hash_ids"):
        load_blockhash_trace(bad, 16)


def test_synthesised_trace_has_the_schema_and_equal_blocks_for_equal_ids():
    frame, _ = load_blockhash_trace(QWEN, 16)
    trace = blockhash_to_trace(frame, 16)
    assert tuple(trace.columns) == SCHEMA
    assert trace["request_id"].tolist() == ["100/0", "101/0", "100/1", "100/2", "104/0"]
    assert trace["timestamp"].tolist() == [0.0, 0.5, 1.75, 3.5, 4.0]
    for row in trace.itertuples():
        assert len(row.prompt_ids) == row.prompt_tokens
        assert len(row.response_ids) == row.response_tokens
        assert min(row.prompt_ids.min(), row.response_ids.min(initial=0)) >= 0
        assert max(row.prompt_ids.max(), row.response_ids.max(initial=0)) < TOKEN_LIMIT
    prompts = trace["prompt_ids"].tolist()
    block = {}
    for prompt, hashes in zip(prompts, frame["hash_ids"], strict=True):
        for j, hash_id in enumerate(hashes[: len(prompt) // 16]):
            tokens = tuple(prompt[16 * j : 16 * (j + 1)])
            assert block.setdefault(int(hash_id), tokens) == tokens
    assert len(set(block.values())) == len(block)  # different ids, different blocks
    # the second turn shares the first two blocks with the first turn, then differs
    assert (prompts[2][:32] == prompts[0][:32]).all()
    assert (prompts[2][32:40] != prompts[0][32:40]).any()


def random_blockhash_frame(rng: np.random.Generator, count: int, block: int) -> pd.DataFrame:
    chains: list[list[int]] = [[]]
    rows = []
    for i in range(count):
        base = chains[int(rng.integers(len(chains)))]
        ids = base[: int(rng.integers(0, len(base) + 1))]
        ids = ids + (10 * i + np.arange(int(rng.integers(0, 4)))).tolist()
        chains.append(ids)
        full = len(ids) * block
        length = int(rng.integers(max(full - block, 0) + 1, full + block + 1))
        rows.append(
            {
                "hash_ids": np.array(ids[: -(-length // block)], np.int64),
                "input_length": length,
                "output_length": int(rng.integers(0, 3 * block)),
                "timestamp": float(i),
                "conversation_id": str(i),
                "turn_index": 0,
            }
        )
    frame = pd.DataFrame(rows)
    frame.attrs["block_size"] = block
    return frame


def test_bounds_of_the_frame_equal_bounds_of_its_synthesised_trace():
    rng = np.random.default_rng(4)
    for trial in range(12):
        block = int(rng.choice([2, 4]))
        frame = random_blockhash_frame(rng, 60, block)
        trace = blockhash_to_trace(frame, block)
        outputs = trial % 2 == 1
        by_hash = bounds.index_trace(frame, include_outputs=outputs)
        by_tokens = bounds.index_trace(trace, include_outputs=outputs)
        for size in (block, 2 * block, 3 * block):
            assert (
                bounds.ideal_hit_blocks(by_hash, size).tolist()
                == bounds.ideal_hit_blocks(by_tokens, size).tolist()
            )
            capacities = [0, 1, 3, 8, 30, 1000]
            a = bounds.capacity_curves(by_hash, size, capacities)
            b = bounds.capacity_curves(by_tokens, size, capacities)
            assert a["hit_blocks"].tolist() == b["hit_blocks"].tolist()
        keys_hash, keys_tokens = by_hash.block_keys(block), by_tokens.block_keys(block)
        for num_blocks in (int(keys_hash.allocated.max()) + 1, 50):
            a = bounds.simulate_vllm(keys_hash, num_blocks).hit_blocks
            b = bounds.simulate_vllm(keys_tokens, num_blocks).hit_blocks
            assert a.tolist() == b.tolist()


def test_block_size_checks():
    frame, _ = load_blockhash_trace(MOONCAKE, 512)
    with pytest.raises(bounds.BoundsError, match="multiple"):
        bounds.ideal_hit_rate(frame, 256)
    assert bounds.ideal_hit_rate(frame, 1024) == pytest.approx(2048 / 7872)
    crowded = pd.DataFrame(
        {
            "hash_ids": [np.arange(TOKEN_LIMIT + 5)],
            "input_length": [TOKEN_LIMIT + 5],
            "output_length": [0],
            "timestamp": [0.0],
            "conversation_id": ["0"],
            "turn_index": [0],
        }
    )
    with pytest.raises(BlockHashError, match="too small"):
        blockhash_to_trace(crowded, 1)


def test_command_on_a_blockhash_trace(capsys):
    from analysis.commands import bounds as command

    parser = argparse.ArgumentParser()
    command.configure(parser)
    args = parser.parse_args(["--trace", str(MOONCAKE), "--block-size", "512", "--json"])
    assert command.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kind"] == "blocks" and result["requests"] == 6 and result["tokens"] == 7872
    assert result["ideal_hit_rate"] == pytest.approx(3072 / 7872)
    assert result["import"]["malformed"] == 2
    assert [r["block_size"] for r in result["token_vs_block"]] == [512, 1024, 2048, 4096]
    lru = {r["capacity"]: r["hit_tokens"] for r in result["curves"] if r["policy"] == "lru"}
    assert lru[7] == 3072

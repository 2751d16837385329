"""`gpu-check` without a GPU: one line saying so, the replay half really runs, exit 0; on any
DIFFERENT point the exit status is 1."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis import cli
from analysis.serving import gpu_check


def test_verdicts():
    counts = dict.fromkeys(gpu_check.COUNT_KEYS, 3)
    assert gpu_check.verdict(counts, None) == "replay only"
    assert gpu_check.verdict(counts, dict(counts)) == "SAME"
    assert gpu_check.verdict(counts, {**counts, "preemptions": 4}) == "DIFFERENT"


def test_the_six_points_of_the_h100_comparison():
    points = gpu_check.engine_points()
    assert len({p.name for p in points}) == 6
    for point in points:
        assert point.config.block_size == 16
        assert point.config.model == "llama-3.2-1b"
        assert (point.config.max_num_seqs, point.config.max_num_batched_tokens) == (256, 8192)


def test_timing_settings_come_from_the_gpu_grid():
    settings = gpu_check.timing_settings()
    assert settings["model"] == "llama-3.1-8b"
    assert settings["prefixes"] == [0, 512, 1024, 2048]
    assert settings["concurrency"] == [1, 8, 32]


@pytest.mark.engine
def test_without_cuda_the_replay_half_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "cuda_visible", lambda: False)
    status = cli.main(
        [
            "gpu-check",
            "--results-dir",
            str(tmp_path),
            "--points",
            "identical-200",
            "long-prompts-128",
            "single64-300",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    assert out[0].startswith("no CUDA GPU visible")
    table = pd.read_csv(tmp_path / "engine_check.csv")
    assert table["point"].tolist() == ["identical-200", "long-prompts-128", "single64-300"]
    assert set(table["verdict"]) == {"replay only"}
    identical = table.iloc[0]
    # 6 identical 199-token prompts: the last five each hit 12 full blocks of 16 tokens
    assert (identical["replay_first_hits"], identical["replay_first_queries"]) == (960, 1194)
    assert table.iloc[1]["replay_preemptions"] > 0  # 8 x 800 tokens into 128 blocks
    assert table.iloc[2]["replay_first_queries"] > 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["cuda"] is False and manifest["timing"] == []
    assert "vllm" in manifest["machine"]


def test_a_different_point_fails_the_check(tmp_path, monkeypatch):
    def fake_points(points, cuda, say):
        return pd.DataFrame([{"point": p.name, "verdict": "DIFFERENT"} for p in points])

    monkeypatch.setattr(gpu_check, "run_engine_points", fake_points)
    status = gpu_check.check(tmp_path, cuda=True, only=["identical-200"], say=lambda line: None)
    assert status == 1
    assert json.loads((tmp_path / "manifest.json").read_text())["different"] == 1


def test_an_unknown_point_is_named(tmp_path):
    assert cli.main(["gpu-check", "--results-dir", str(tmp_path), "--points", "nope"]) == 2


def test_timing_runs_the_8b_shape_with_random_weights(tmp_path, monkeypatch):
    """The wiring of the CUDA-only half (the bench itself needs a GPU: see tests/test_gpu.py and
    the serving tests): the 8B shape's folder, load_format "dummy", the grid's settings."""
    from analysis import serving

    settings = gpu_check.timing_settings()
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))  # the shape is written there
    seen: dict = {}

    def record(kind):
        def build(**kwargs):
            seen[kind] = kwargs
            return kwargs

        return build

    monkeypatch.setattr(serving, "ServingBenchConfig", record("bench"))
    monkeypatch.setattr(serving, "PrefixSweepConfig", record("sweep"))
    monkeypatch.setattr(serving, "run_serving_bench", lambda config, **kw: pd.DataFrame())
    monkeypatch.setattr(serving, "run_prefix_sweep", lambda config, **kw: pd.DataFrame())
    monkeypatch.setattr(serving, "sweep_table", lambda frame: frame)
    tables = gpu_check.run_timing(tmp_path, settings, say=lambda line: None)
    assert set(tables) == {"ttft", "sweep"}
    for kind in ("bench", "sweep"):
        assert seen[kind]["model"].endswith("shapes/llama-3.1-8b")
        assert seen[kind]["load_format"] == "dummy"
        assert seen[kind]["kv_cache_memory_bytes"] is None
    assert seen["bench"]["prefixes"] == (0, 512, 1024, 2048)
    assert seen["bench"]["concurrency"] == (1, 8, 32)
    assert seen["sweep"]["num_prompts"] == 256 and seen["sweep"]["input_len"] == 1000


@pytest.mark.parametrize(
    ("cuda", "profile", "device"), [(False, "cpu", "cpu"), (True, "gpu", "cuda")]
)
def test_served_runs_the_study_set_of_the_machine(tmp_path, monkeypatch, cuda, profile, device):
    """`gpu-check --served` takes the `gpu` study set and calibrates on CUDA where a GPU is
    visible, else the `cpu` set on the CPU, with the grid given on the command line (the
    comparison itself is notebook 08's, run end to end there)."""
    from analysis.commands import gpu_check as command

    seen = {}
    monkeypatch.setattr(gpu_check, "cuda_visible", lambda: cuda)
    monkeypatch.setattr(command, "served_check", lambda *args: seen.update(args=args) or 0)
    argv = ["gpu-check", "--served", "--results-dir", str(tmp_path), "--prefixes", "0", "2048"]
    assert cli.main([*argv, "--clients", "1", "8", "--repeats", "2"]) == 0
    root, chosen, chosen_device, overrides = seen["args"]
    assert (root, chosen, chosen_device) == (tmp_path / "served", profile, device)
    assert overrides == dict(prefixes=[0, 2048], concurrency=[1, 8], repeats=2, budget_s=None)


def test_served_keeps_what_a_replay_elsewhere_needs_beside_its_tables(tmp_path, monkeypatch):
    """`gpu-check --served` leaves one folder that replays anywhere: its tables, the profile
    with the server's terms, and the server's runs (the layout `recorded_cells` reads)."""
    from analysis.commands.gpu_check import keep_beside
    from analysis.platform.paths import results_dir

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path / "repo"))
    run = results_dir() / "serving" / "synthetic-cache-p0-c1-abc"
    run.mkdir(parents=True)
    (run / "requests.parquet").write_text("r")
    calibration = tmp_path / "cal"
    calibration.mkdir()
    (calibration / "server-terms.json").write_text("{}")
    root = tmp_path / "out" / "served"
    keep_beside(root, calibration, ["synthetic-cache-p0-c1-abc"])
    assert (root.parent / "calibration" / "server-terms.json").is_file()
    assert (root.parent / "serving" / "synthetic-cache-p0-c1-abc" / "requests.parquet").is_file()

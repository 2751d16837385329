"""The fleet: router specs and decisions (fast), and N replay engines behind a router (vLLM's
own schedulers, marked `engine`): a fleet of one is `replay`, a pinned replica is `replay` of
its sub-trace, the precise router's index is what vLLM's events say."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pytest
from fleet_tables import ONE_ENGINE_AND_TWO_REPLICAS, fleet_rows

from analysis.engines import ConfigError, RunConfig, validate
from analysis.engines.config import ROUTERS, router_spec
from analysis.engines.fleet import ROUTER_CLASSES, Arrival, make_router
from analysis.engines.result import REQUEST_TIME_COLUMNS
from analysis.engines.synthetic import synthetic_trace

SMALL = {"block_size": 16, "num_blocks": 300, "max_model_len": 2048}
ROUTER_SPECS = [
    "round-robin",
    "least-loaded",
    "affinity",
    "affinity-cap1.25",
    "approx-prefix",
    "precise-prefix",
    "prefix-load-beta0.5",
]


# --------------------------------------------------------------------------- configuration
def test_every_configured_router_has_a_class():
    assert set(ROUTER_CLASSES) == set(ROUTERS)


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("round-robin", ("round-robin", None)),
        ("affinity", ("affinity", None)),
        ("affinity-cap1.25", ("affinity", 1.25)),
        ("prefix-load-beta0", ("prefix-load", 0.0)),
        ("prefix-load-beta2.5", ("prefix-load", 2.5)),
    ],
)
def test_router_specs_parse(spec, parsed):
    assert router_spec(spec) == parsed


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"router": "random"}, "router='random': no such router; use one of round-robin"),
        ({"router": "affinity-cap0.9"}, "the cap must be a number above 1"),
        ({"router": "prefix-load-beta-1"}, "the beta must be a number 0 or more"),
        ({"router": "least-loaded-cap2"}, "no such router"),
        ({"replicas": 0}, "replicas must be a positive integer"),
        ({"num_blocks": 100}, "below vLLM's minimum"),
    ],
)
def test_bad_fleet_settings_are_one_line_errors(changes, message):
    config = RunConfig(engine="fleet", replicas=2, **SMALL).with_(**changes)
    with pytest.raises(ConfigError, match=message):
        validate(config, check_environment=False)


def test_replicas_need_the_fleet_engine():
    with pytest.raises(ConfigError, match="replicas=4 needs engine='fleet'"):
        validate(RunConfig(replicas=4, **SMALL), check_environment=False)


def test_fleet_fields_leave_other_engines_ids_alone():
    config = RunConfig(**SMALL)
    assert config.with_(router="affinity").config_id("t") == config.config_id("t")
    fleet = config.with_(engine="fleet", replicas=2)
    assert "-fleet-" in fleet.config_id("t") and "-x2-round-robin-" in fleet.config_id("t")
    assert fleet.with_(router="affinity").config_id("t") != fleet.config_id("t")


# --------------------------------------------------------------------------- routers
@dataclass
class View:
    """A replica as a router sees it, with set numbers."""

    index: int
    in_flight: int = 0
    usage: float = 0.0
    held: list = field(default_factory=list)

    def load(self) -> int:
        return self.in_flight

    def kv_usage(self) -> float:
        return self.usage

    def cached_prefix_blocks(self, block_hashes) -> int:
        count = 0
        for key in block_hashes:
            if key not in self.held:
                break
            count += 1
        return count


def arrival(conversation: str, blocks=(b"a", b"b", b"c")) -> Arrival:
    return Arrival(conversation, list(blocks))


def test_round_robin_cycles():
    router = make_router("round-robin", 3, 100)
    views = [View(k) for k in range(3)]
    assert [router.choose(arrival("c"), views) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_least_loaded_breaks_ties_by_usage_then_index():
    router = make_router("least-loaded", 3, 100)
    assert router.choose(arrival("c"), [View(0, 2), View(1, 1, 0.5), View(2, 1, 0.2)]) == 2
    assert router.choose(arrival("c"), [View(0, 1), View(1, 1), View(2, 1)]) == 0


def test_affinity_pins_a_conversation_and_spreads_many():
    router = make_router("affinity", 4, 100)
    views = [View(k) for k in range(4)]
    choices = {c: router.choose(arrival(f"conv-{c}"), views) for c in range(200)}
    assert all(router.choose(arrival(f"conv-{c}"), views) == k for c, k in choices.items())
    counts = pd.Series(choices).value_counts()
    assert len(counts) == 4 and counts.min() > 20  # 64 virtual nodes per replica


def test_bounded_affinity_passes_a_full_replica_on():
    unbounded = make_router("affinity", 2, 100)
    home = unbounded.choose(arrival("c"), [View(0), View(1)])
    bounded = make_router("affinity-cap1.25", 2, 100)
    views = [View(0), View(1)]
    views[home].in_flight = 10  # cap = ceil(1.25 * 11 / 2) = 7
    assert bounded.choose(arrival("c"), views) == 1 - home
    views[home].in_flight = 3  # cap = ceil(1.25 * 4 / 2) = 3: still full
    assert bounded.choose(arrival("c"), views) == 1 - home
    views[home].in_flight = 1  # cap = ceil(1.25 * 2 / 2) = 2: room
    assert bounded.choose(arrival("c"), views) == home


def test_approximate_prefix_remembers_what_it_sent_within_its_capacity():
    router = make_router("approx-prefix", 2, 2)
    views = [View(0), View(1, in_flight=1)]
    assert router.choose(arrival("x", [b"a", b"b"]), views) == 0  # no prefix: least loaded
    views[0].in_flight = 5
    assert router.choose(arrival("y", [b"a", b"b", b"c"]), views) == 0  # 2 leading blocks
    # an LRU of 2 hashes per replica: "a" has been pushed out on replica 0
    assert router.choose(arrival("z", [b"a"]), views) == 1


def test_precise_prefix_follows_the_replicas_index_then_load():
    router = make_router("precise-prefix", 3, 100)
    views = [View(0, 0, held=[b"a"]), View(1, 9, held=[b"a", b"b"]), View(2, 0)]
    assert router.choose(arrival("c"), views) == 1
    assert router.choose(arrival("c", [b"z"]), views) == 0


def test_prefix_load_trades_prefix_for_load_as_beta_grows():
    views = [View(0, 8, held=[b"a", b"b", b"c"]), View(1, 2)]
    assert make_router("prefix-load-beta0", 2, 100).choose(arrival("c"), views) == 0
    assert make_router("prefix-load-beta0.5", 2, 100).choose(arrival("c"), views) == 0
    assert make_router("prefix-load-beta2", 2, 100).choose(arrival("c"), views) == 1


# --------------------------------------------------------------------------- engines
def trace_of(conversations: int, seed: int) -> pd.DataFrame:
    return synthetic_trace(
        conversations,
        turns=(1, 6),
        user_tokens=(20, 300),
        reply_tokens=(5, 200),
        seed=seed,
        shared_prefix=40,
    )


def run_config(**changes) -> RunConfig:
    return RunConfig(trace="synthetic", **{**SMALL, "engine": "fleet", **changes})


def run(trace: pd.DataFrame, config: RunConfig):
    from analysis.runs import run as run_trace

    return run_trace(trace, config, progress=False)


def comparable(result) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Tables without times, replicas and block ids; events in a canonical order per step."""
    drop = ["replica"]
    events = result.block_events.drop(columns=["time_s", "block_id", *drop], errors="ignore")
    events = events.sort_values(["step", "event", "block_hash", "request_index"])
    return (
        result.admissions.drop(columns=["time_s", *drop], errors="ignore"),
        result.requests.drop(columns=[*REQUEST_TIME_COLUMNS, *drop], errors="ignore"),
        events.reset_index(drop=True),
    )


@pytest.mark.engine
@pytest.mark.parametrize(
    "changes",
    [
        {"num_blocks": 400},
        {"num_blocks": 200, "concurrency": 16},  # preemptions
        {"mode": "batch", "num_blocks": 200},
    ],
)
def test_a_fleet_of_one_is_replay_for_every_router(changes):
    trace = trace_of(40, seed=3)
    replay = run(trace, run_config(engine="replay", **changes))
    assert replay.manifest["engine"]["fast_path_parked_request_steps"] > 0
    for router in ROUTER_SPECS:
        fleet = run(trace, run_config(router=router, **changes))
        assert (fleet.requests["replica"] == 0).all()
        assert fleet.manifest["engine"]["steps"] == replay.manifest["engine"]["steps"]
        for a, b in zip(comparable(replay), comparable(fleet), strict=True):
            pd.testing.assert_frame_equal(a, b)


@pytest.mark.engine
@pytest.mark.parametrize(
    "changes",
    [{"mode": "batch"}, {"mode": "closed-loop", "concurrency": 64}],  # every conversation at once
)
def test_a_pinned_replica_is_replay_of_its_sub_trace(changes):
    """Affinity pins each conversation to one replica; when arrivals do not depend on other
    replicas (batch, or a client per conversation), each replica is `replay` of its requests."""
    trace = trace_of(30, seed=5)
    fleet = run(trace, run_config(replicas=3, router="affinity", **changes))
    assert fleet.summary["preemptions"] > 0
    columns = ["request_id", "kind", "tokens_queried", "tokens_hit", "step"]
    for replica in range(3):
        mine = fleet.requests.loc[fleet.requests["replica"] == replica, "request_id"]
        assert len(mine) > 5
        sub_trace = trace[trace["request_id"].isin(mine)].reset_index(drop=True)
        alone = run(sub_trace, run_config(engine="replay", **changes))
        here = fleet.admissions[fleet.admissions["replica"] == replica]
        pd.testing.assert_frame_equal(
            alone.admissions[columns].reset_index(drop=True), here[columns].reset_index(drop=True)
        )


# --------------------------------------------------------------------------- on a clock
def write_profile(path) -> str:
    import json

    coefficients = {"fixed": 0.004, "token": 2e-5, "new_request": 1e-3, "decode_context": 5e-4}
    path.write_text(json.dumps({"coefficients": coefficients, "admit_s": 2e-4, "loop_s": 1e-4}))
    return str(path)


def timed_tables(result, with_steps: bool = True) -> list[pd.DataFrame]:
    """Requests with their times and admissions with theirs (and the step table), without the
    replica column and the recorder's step numbers, which count every replica's steps."""
    drop = ["replica", "submit_step", "first_admission_step", "first_token_step", "finish_step"]
    requests = result.requests.drop(columns=drop, errors="ignore")
    admissions = result.admissions.drop(columns=["replica", "step"], errors="ignore")
    tables = [requests.reset_index(drop=True), admissions.reset_index(drop=True)]
    if with_steps:
        tables.append(result.steps.drop(columns=["replica"], errors="ignore"))
    return tables


@pytest.mark.engine
@pytest.mark.parametrize(
    "changes",
    [
        {"num_blocks": 200, "concurrency": 16, "think_time_s": 0.05},  # preemptions
        {"mode": "poisson", "arrival_rate": 8.0, "num_blocks": 400},
    ],
    ids=["closed-loop-think", "poisson"],
)
def test_a_fleet_of_one_on_a_clock_is_replay_on_the_clock_to_the_bit(tmp_path, changes):
    trace = trace_of(30, seed=3)
    clock = write_profile(tmp_path / "p.json")
    replay = run(trace, run_config(engine="replay", clock=clock, **changes))
    assert replay.manifest["engine"]["fast_path_skipped_steps"] > 0
    for router in ("round-robin", "precise-prefix"):
        fleet = run(trace, run_config(router=router, clock=clock, **changes))
        assert fleet.manifest["engine"]["steps"] == replay.manifest["engine"]["steps"]
        for a, b in zip(timed_tables(replay), timed_tables(fleet), strict=True):
            pd.testing.assert_frame_equal(a, b, check_exact=True)
        pd.testing.assert_frame_equal(
            fleet.requests[["submit_step", "first_token_step", "finish_step"]],
            replay.requests[["submit_step", "first_token_step", "finish_step"]],
        )


@pytest.mark.engine
@pytest.mark.parametrize(
    "changes",
    [{"mode": "batch"}, {"mode": "closed-loop", "concurrency": 64, "think_time_s": 0.2}],
)
def test_each_replica_keeps_its_own_time(tmp_path, changes):
    """Affinity pins each conversation to one replica; when arrivals do not depend on other
    replicas, each replica on its own clock is replay on the clock of its requests, to the bit
    (in lockstep a replica would wait for the slowest)."""
    trace = trace_of(30, seed=5)
    clock = write_profile(tmp_path / "p.json")
    fleet = run(trace, run_config(replicas=3, router="affinity", clock=clock, **changes))
    assert fleet.summary["preemptions"] > 0
    ends = fleet.requests.groupby("replica")["finish_s"].max()
    assert ends.nunique() == 3  # the replicas end at their own times
    for replica in range(3):
        here = fleet.requests["replica"] == replica
        mine = fleet.requests.loc[here, "request_id"]
        sub_trace = trace[trace["request_id"].isin(mine)].reset_index(drop=True)
        alone = run(sub_trace, run_config(engine="replay", clock=clock, **changes))
        steps = fleet.steps[fleet.steps["replica"] == replica].drop(columns="replica")
        pd.testing.assert_frame_equal(
            alone.steps.reset_index(drop=True), steps.reset_index(drop=True), check_exact=True
        )
        columns = ["request_id", "arrival_s", "first_token_s", "finish_s", "ttft_s"]
        pd.testing.assert_frame_equal(
            alone.requests[columns].reset_index(drop=True),
            fleet.requests.loc[here, columns].reset_index(drop=True),
            check_exact=True,
        )


@pytest.mark.engine
def test_a_fleet_on_a_clock_runs_its_events_in_time_order(tmp_path):
    """Poisson arrivals routed by load: each replica's steps follow one another on its own
    clock, the fleet's steps (and so its admissions) come in the order they start, and no
    request is admitted before it arrived."""
    trace = trace_of(40, seed=7)
    clock = write_profile(tmp_path / "p.json")
    config = run_config(replicas=3, router="least-loaded", clock=clock, num_blocks=400)
    fleet = run(trace, config.with_(mode="poisson", arrival_rate=30.0))
    assert sorted(fleet.requests["replica"].unique()) == [0, 1, 2]
    admissions = fleet.admissions.sort_values("step", kind="stable")
    assert admissions["time_s"].is_monotonic_increasing
    arrived = fleet.requests.set_index("request_index")["arrival_s"]
    arrival_of_each = arrived[admissions["request_index"]].to_numpy()
    assert (admissions["time_s"].to_numpy() >= arrival_of_each).all()
    for _, steps in fleet.steps.groupby("replica"):
        ends = (steps["start_s"] + steps["wall_s"] + 1e-4).to_numpy()[:-1]
        assert (steps["start_s"].to_numpy()[1:] >= ends - 1e-12).all()


@pytest.mark.engine
def test_the_precise_index_holds_only_what_the_replica_caches(monkeypatch):
    """At every decision, each replica's index (from vLLM's KV events) is a subset of the hashes
    its block pool holds, and not an empty one once requests ran."""
    from vllm.v1.core.kv_cache_utils import get_block_hash, maybe_convert_block_hash

    import analysis.engines.fleet.routers as routers

    checked = []

    class CheckedPrecise(routers.PrecisePrefix):
        def choose(self, arrival, replicas):
            for replica in replicas:
                pool = replica.scheduler.kv_cache_manager.block_pool
                held = {
                    maybe_convert_block_hash(get_block_hash(key))
                    for key in pool.cached_block_hash_to_block._cache
                }
                assert replica.kv_index.hashes <= held
                checked.append(len(replica.kv_index.hashes))
            return super().choose(arrival, replicas)

    monkeypatch.setitem(routers.ROUTER_CLASSES, "precise-prefix", CheckedPrecise)
    fleet = run(trace_of(30, seed=7), run_config(replicas=2, router="precise-prefix"))
    assert max(checked) > 0 and fleet.summary["first_prefill"]["hits"] > 0


@pytest.mark.engine
def test_affinity_keeps_conversations_that_round_robin_scatters():
    """With room for everything, a conversation's later turns hit only on the replica that
    served its earlier turns: affinity keeps all the trace's reuse, round-robin loses some."""
    from analysis.metrics.fleet import hit_rate_split

    trace = trace_of(40, seed=11)
    split = {}
    for router in ("round-robin", "affinity"):
        result = run(trace, run_config(replicas=4, router=router, num_blocks=2000))
        split[router] = hit_rate_split(result, trace)
    assert split["affinity"].routed_ideal == pytest.approx(split["affinity"].ideal, abs=0.02)
    assert split["round-robin"].routed_ideal < split["affinity"].routed_ideal - 0.1
    assert split["round-robin"].delivered < split["affinity"].delivered - 0.1
    for part in split.values():
        assert part.delivered <= part.routed_ideal + 1e-9 <= part.ideal + 2e-9


@pytest.mark.engine
def test_engine_order_bounds_see_the_interleaving_of_many_clients():
    """With one client the engine admits in trace order, so the bounds in its order are the
    trace-order ones; with many clients the ideal stays (an infinite cache forgets nothing)
    and one LRU cache of the same blocks keeps less of the interleaved conversations."""
    from analysis.metrics.fleet import engine_order_bounds, hit_rate_split

    trace = trace_of(40, seed=13)
    config = run_config(router="least-loaded", num_blocks=150, mode="closed-loop")
    alone = run(trace, config.with_(concurrency=1))
    split, ordered = hit_rate_split(alone, trace), engine_order_bounds(alone, trace)
    assert ordered.ideal_engine_order == pytest.approx(split.ideal)
    assert ordered.pooled_lru_engine_order == pytest.approx(split.pooled_lru)
    crowded = run(trace, config.with_(concurrency=32))
    many = engine_order_bounds(crowded, trace)
    assert many.ideal_engine_order == pytest.approx(split.ideal, abs=0.01)
    assert many.pooled_lru_engine_order < split.pooled_lru - 0.05
    assert hit_rate_split(crowded, trace).delivered <= many.ideal_engine_order + 1e-9


# --------------------------------------------------------------------------- the loss split


def test_the_loss_split_adds_up_and_names_the_best_and_worst_router():
    from analysis.sweeps.fleet import loss_split, routing_losses

    table = fleet_rows(ONE_ENGINE_AND_TWO_REPLICAS)
    split = loss_split(table, "routers").set_index("replicas")
    assert split.loc[1, "best_router"] == "any (one replica)"
    assert split.loc[1, "splitting_pts"] == pytest.approx(0.0)
    two = split.loc[2]
    assert (two["best_router"], two["worst_router"]) == ("affinity", "round-robin")
    assert two["load_pts"] == pytest.approx(30.0)  # 80 % ideal - 50 % one engine at 16 clients
    assert two["splitting_pts"] == pytest.approx(-5.0)  # the fleet beat one engine
    assert two["routing_max_pts"] == pytest.approx(25.0)
    parts = two["load_pts"] + two["splitting_pts"] + two["routing_max_pts"]
    assert parts == pytest.approx(80.0 - 30.0)  # ideal minus the worst router's rate
    behind = routing_losses(table, "routers").set_index("replicas")
    assert behind.loc[2, "round-robin"] == pytest.approx(25.0)
    assert behind.loc[2, "affinity"] == pytest.approx(0.0)


def test_the_loss_split_names_the_missing_one_engine_run():
    from analysis.platform.errors import GridError
    from analysis.sweeps.fleet import loss_split

    table = fleet_rows([("routers", 2, 16, "affinity", 0.55)])
    with pytest.raises(GridError, match="no run of one engine with 1200 blocks at 16 clients"):
        loss_split(table, "routers")


def test_a_fleet_of_one_has_one_id_whatever_its_router():
    one = RunConfig(engine="fleet", replicas=1, **SMALL)
    ids = {one.with_(router=router).config_id("t") for router in ROUTER_SPECS}
    assert len(ids) == 1 and "-x1-" in ids.pop()
    two = {one.with_(replicas=2, router=router).config_id("t") for router in ROUTER_SPECS}
    assert len(two) == len(ROUTER_SPECS)


@pytest.mark.engine
def test_a_grids_fleet_of_one_runs_once_for_all_its_routers_and_keeps_their_names(
    tmp_path, monkeypatch
):
    """Every router gives a fleet of one the same run (above), so a grid runs it once; its
    table still has a row per router, each under the router its point names."""
    from analysis import sweeps
    from analysis.data.traces import write_trace
    from analysis.sweeps import executors
    from analysis.sweeps.fleet import fleet_table

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))  # results under tmp_path
    trace = tmp_path / "tiny.parquet"
    write_trace(trace, trace_of(16, seed=13))
    grid = tmp_path / "fleet.toml"
    series = """
[[series]]
name = "routers"
traces = ["{trace}"]
engines = ["fleet"]
block_sizes = [16]
num_blocks = [{blocks}]
replicas = {replicas}
router = ["round-robin", "affinity", "precise-prefix"]
"""
    grid.write_text(
        '[base]\nmode = "closed-loop"\nconcurrency = 8\nmax_model_len = 2048\n'
        + series.format(trace=trace, blocks=600, replicas=1)
        + series.format(trace=trace, blocks=300, replicas=2)
    )
    points = sweeps.grid_points(grid)
    ran = executors.run_points(points, "local", progress=False).ran
    assert sorted(p.config.replicas for p in ran) == [1, 2, 2, 2]
    table = fleet_table(grid, run_missing=False).set_index("point_id")
    assert len(table) == 6
    for point in points:
        assert table.loc[point.point_id, "router"] == point.config.router
    alone = table[table["replicas"] == 1].drop(columns=["router", "series"])
    assert (alone.nunique(dropna=False) == 1).all()


@pytest.mark.engine
def test_fleet_points_run_on_ray_as_locally_and_resume(tmp_path):
    """A fleet point is a sweep point: `--executor ray` gives the local tables, and a finished
    point is not run again."""
    import ray

    from analysis import sweeps
    from analysis.data.traces import write_trace
    from analysis.engines import RunResult
    from analysis.sweeps import executors

    trace = tmp_path / "tiny.parquet"
    write_trace(trace, trace_of(24, seed=13))
    grid = tmp_path / "fleet.toml"
    grid.write_text(
        f"""
[base]
mode = "closed-loop"
concurrency = 8
max_model_len = 2048

[[series]]
name = "fleet"
traces = ["{trace}"]
engines = ["fleet"]
block_sizes = [16]
num_blocks = [300]
replicas = 2
router = ["affinity", "precise-prefix"]
"""
    )
    points = sweeps.grid_points(grid)
    local = executors.run_points(points, "local", results=tmp_path / "local", progress=False)
    assert len(local.ran) == 2
    again = executors.run_points(points, "local", results=tmp_path / "local", progress=False)
    assert not again.ran
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        executors.run_points(points, "ray", results=tmp_path / "ray", progress=False)
    finally:
        ray.shutdown()
    for point in points:
        a, b = (RunResult.read(sweeps.result_folder(point, tmp_path / k)) for k in ("local", "ray"))
        assert "replica" in a.admissions
        pd.testing.assert_frame_equal(
            a.admissions.drop(columns="time_s"), b.admissions.drop(columns="time_s")
        )


def headline_table() -> pd.DataFrame:
    """A fleet table on which every reading of notebook 13 holds (1,200 blocks, ideal 0.8)."""
    routers = ["round-robin", "affinity", "affinity-cap1.25", "approx-prefix", "precise-prefix"]
    two = {
        "round-robin": 0.40,
        "affinity": 0.55,
        "affinity-cap1.25": 0.54,
        "approx-prefix": 0.30,
        "precise-prefix": 0.56,
    }
    points = [("one-engine", 1, c, "least-loaded", d) for c, d in ((8, 0.78), (16, 0.6), (32, 0.5))]
    points += [("routers", 1, 8, r, 0.78) for r in routers]
    points += [("routers", 2, 16, r, two[r]) for r in routers]
    points += [
        ("clients32", 2, 32, "precise-prefix", 0.45),
        ("clients32", 2, 32, "round-robin", 0.35),
    ]
    points += [
        ("clients32", 4, 32, "precise-prefix", 0.40),
        ("clients32", 4, 32, "round-robin", 0.3),
    ]
    points += [
        ("beta", 2, 16, f"prefix-load-beta{b}", d)
        for b, d in (("0", 0.5), ("0.5", 0.6), ("1", 0.55))
    ]
    table = fleet_rows(points)
    table["routed_ideal"] = 0.795
    table.loc[(table["router"] == "round-robin") & (table["replicas"] == 2), "routed_ideal"] = 0.7
    table["load_imbalance_mean"] = 1.0
    approx = table["router"] == "approx-prefix"
    table.loc[approx, "load_imbalance_mean"] = table.loc[approx, "replicas"].astype(float)
    table.loc[(table["router"] == "affinity") & (table["replicas"] == 2), "load_imbalance_mean"] = (
        1.5
    )
    capped = (table["router"] == "affinity-cap1.25") & (table["replicas"] == 2)
    table.loc[capped, "load_imbalance_mean"] = 1.1
    return table


def test_notebook_13s_headline_checks_hold_and_each_fails_on_a_wrong_table():
    from analysis.sweeps.fleet import fleet_checks

    table = headline_table()
    fleet_checks(table).assert_all()

    def where(series, replicas, router):
        return (
            (table["series"] == series)
            & (table["replicas"] == replicas)
            & (table["router"] == router)
        )

    broken = {
        "one engine delivers no more than the ideal": (
            where("one-engine", 1, "least-loaded"),
            "delivered",
            0.85,
        ),
        "2 replicas, 16 clients: the load costs more than splitting": (
            (table["series"] == "one-engine") & (table["concurrency"] == 16),
            "delivered",
            0.75,
        ),
        "32 clients: splitting costs more at 4": (
            where("clients32", 4, "precise-prefix"),
            "delivered",
            0.48,
        ),
        "32 clients: a router reading KV events is best": (
            where("clients32", 2, "round-robin"),
            "delivered",
            0.47,
        ),
        "approx-prefix sends every request to one replica": (
            where("routers", 2, "approx-prefix"),
            "load_imbalance_mean",
            1.5,
        ),
        "the load cap lowers affinity's load imbalance": (
            where("routers", 2, "affinity-cap1.25"),
            "load_imbalance_mean",
            1.6,
        ),
        "the best beta lies strictly between": (
            where("beta", 2, "prefix-load-beta1"),
            "delivered",
            0.7,
        ),
    }
    for claim, (rows, column, value) in broken.items():
        wrong = table.copy()
        wrong.loc[rows, column] = value
        failed = [c.claim for c in fleet_checks(wrong).items if not c.holds]
        assert any(f.startswith(claim) for f in failed), (claim, failed)


def test_two_grids_are_ensured_in_one_pool_of_workers(monkeypatch):
    """Notebook 13 runs its two grids' missing points together: their workers start once."""
    from analysis.sweeps import results

    calls: list[tuple[list[str], int]] = []
    monkeypatch.setattr(results, "grid_points", lambda grid: [f"{grid}-a", f"{grid}-b"])
    monkeypatch.setattr(
        results,
        "run_points",
        lambda points, executor, *, workers, progress: calls.append((points, workers)),
    )
    points = results.ensure_grid("fleet", "fleet-mooncake", progress=False)
    assert points == ["fleet-a", "fleet-b", "fleet-mooncake-a", "fleet-mooncake-b"]
    assert len(calls) == 1 and calls[0][0] == points and calls[0][1] >= 1

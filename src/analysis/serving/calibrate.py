"""Calibration: what one request alone costs on this server (a fixed part, prefill per token,
one decode step), measured once per server configuration and cached, and the number of
requests per run that fits a time budget by it.

A module of its own: it sizes a benchmark before it runs and is used only by the studies
that plan to a budget (named `calibrate`, not `calibration`, so that the package attribute
`serving.calibration` stays the function).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from analysis.platform.kept_files import read_kept
from analysis.platform.manifest import read_json, write_json
from analysis.serving import loadgen
from analysis.serving.bench_config import ServingBenchConfig, requests_in_cell
from analysis.serving.bench_run import prefill_rate, run_coroutine
from analysis.serving.benchmark import ServerPair
from analysis.serving.model_names import model_identity, resolve_model
from analysis.serving.server import VllmServer
from analysis.serving.storage import _digest


@dataclass(frozen=True)
class Calibration:
    """What one request alone costs on this server: a fixed part, prefill per token, and
    one decode step. Measured on the caching-off server (nothing is reused)."""

    prefill_tok_s: float  # prompt tokens prefilled per second
    fixed_s: float  # TTFT of a 32-token prompt (HTTP, scheduling, one short prefill)
    decode_step_s: float  # seconds per output token after the first
    probe_tokens: int

    def request_s(self, uncached_tokens: int, output_tokens: int, concurrency: int = 1) -> float:
        """Estimated seconds of one request's share of a run at `concurrency`: its prefill
        (serial: prefill saturates the CPU) plus its decode, shared by the batch."""
        decode = self.fixed_s + max(output_tokens - 1, 0) * self.decode_step_s
        return uncached_tokens / self.prefill_tok_s + decode / max(concurrency, 1)

    def timeout_s(self, prompt_tokens: int, output_tokens: int, concurrency: int) -> float:
        """A request limit scaled to the measured speed: 10x the time a request could take
        when it queues behind a full wave of uncached prefills, and at least 30 s."""
        wave = concurrency * prompt_tokens / self.prefill_tok_s
        own = self.fixed_s + output_tokens * self.decode_step_s * max(concurrency, 1)
        return max(30.0, 10.0 * (wave + own))


def _probe(server: VllmServer, tokens: int, max_tokens: int, tag: str) -> loadgen.RequestResult:
    spec = loadgen.RequestSpec(
        request_id=f"calibrate/{tag}",
        prompt_ids=tuple([loadgen.BOS_ID, *loadgen.ordinary_ids(tokens - 1, "calibrate", tag)]),
        max_tokens=max_tokens,
    )
    results, _ = run_coroutine(
        loadgen.run_burst(
            server.base_url, server.model_name, [spec], 1, timeout_s=600.0, progress=False
        )
    )
    if results[0].status != "ok":
        raise RuntimeError(f"calibration request failed: {results[0].error}")
    return results[0]


def measure_calibration(server: VllmServer, probe_tokens: int = 1024) -> Calibration:
    """Two short and two `probe_tokens`-long requests, one at a time (the faster of each
    pair counts): prefill tokens/s from the TTFT difference, the decode step from TPOT."""
    short = [_probe(server, 32, 8, f"short{i}") for i in range(2)]
    long = [_probe(server, probe_tokens, 1, f"long{i}") for i in range(2)]
    server.reset_prefix_cache()
    fixed = min(r.ttft_s for r in short)
    step = min((r.e2e_s - r.ttft_s) / max(r.output_tokens - 1, 1) for r in short)
    prefill = prefill_rate(fixed, min(r.ttft_s for r in long), probe_tokens)
    return Calibration(prefill, fixed, step, probe_tokens)


def calibration(
    pair: ServerPair, config: ServingBenchConfig, *, force: bool = False
) -> Calibration:
    """The calibration of `config`'s caching-off server, cached under the serving root (so
    that a notebook re-run with cached results starts no server)."""
    model = resolve_model(config.model)
    key = {"server": config.server_config(model, "no_cache").flags(), **model_identity(model)}
    path = pair.root / f"calibration-{_digest(key)}.json"
    kept = None if force else read_kept(path, _read_calibration)  # a cut file: measured again
    if kept is not None:
        return kept
    # both servers start together (the benchmark that follows needs both)
    server = pair.get(config, model, list(config.modes))["no_cache"]
    measured = measure_calibration(server)
    write_json(path, {**asdict(measured), "key": key})
    return measured


def _read_calibration(path: Path) -> Calibration:
    return Calibration(**{k: v for k, v in read_json(path).items() if k != "key"})


def plan_requests(
    cal: Calibration,
    cells: Sequence[tuple[int, int, int]],
    budget_s: float,
    *,
    repeats: int = 3,
    minimum: int = 8,
    maximum: int = 32,
    per_client: int = 0,
) -> int:
    """Measured requests per repeat so that all `cells` fit `budget_s` by the calibration's
    estimate, within [minimum, maximum]; a cell sends at least `per_client` requests per
    client whatever the choice. A cell is (uncached prompt tokens per request, output tokens,
    concurrency); list each mode's cell (caching on has fewer uncached)."""
    fitting = [
        n
        for n in range(minimum, maximum + 1)
        if planned_seconds(cal, cells, n, repeats=repeats, per_client=per_client) <= budget_s
    ]
    return max(fitting, default=minimum)


def planned_seconds(
    cal: Calibration,
    cells: Sequence[tuple[int, int, int]],
    requests: int,
    *,
    repeats: int,
    per_client: int = 0,
) -> float:
    """The calibration's estimate of `cells` at `requests` per repeat (at least `per_client`
    per client in each)."""
    return repeats * sum(
        requests_in_cell(requests, per_client, c) * cal.request_s(u, o, c) for u, o, c in cells
    )

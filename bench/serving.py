"""Time what prefix caching buys against a real vLLM server (TTFT, throughput) and offline.

Runs, fresh each time (results under data/results/bench/serving, apart from the notebooks'
cache): the synthetic shared-prefix workload on a `vllm serve` with caching on, then off
(prefixes 0/512/1024/2048 tokens, concurrency 1 and 8), and seed 004's offline sweep
(requests/s against the shared fraction of 1000-token prompts), and the cost of finding a
prompt's cached prefix token by token (a radix tree) against vLLM's hashed full blocks, on the
same real multi-turn prompts. Prints the tables, the TTFT and TPOT ratios off/on at the
longest prefix, the matching-cost ratio, and the server start-up times.

    .venv/bin/python bench/serving.py [--model PATH] [--requests N] [--no-sweep] [--no-match]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the in-process engine is chatty


def _print(frame) -> None:
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 40):
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def main(argv: list[str] | None = None) -> dict[str, float]:
    from analysis import serving
    from analysis.platform.paths import results_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: prefill-llama (~155 M, CPU)")
    parser.add_argument("--prefixes", type=int, nargs="+", default=[0, 512, 1024, 2048])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--requests", type=int, default=8, help="measured requests per run")
    parser.add_argument("--sweep-prompts", type=int, default=8)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--sweep-repeats", type=int, default=2, help="best of N batches")
    parser.add_argument("--no-sweep", action="store_true", help="skip the offline sweep")
    parser.add_argument("--no-match", action="store_true", help="skip the matching-cost timing")
    parser.add_argument("--match-prompts", type=int, default=400)
    args = parser.parse_args([] if argv is None else argv)  # bench/run.py calls main()
    root = results_dir() / "bench" / "serving"

    started = time.perf_counter()
    config = serving.ServingBenchConfig(
        model=args.model,
        prefixes=tuple(args.prefixes),
        concurrency=tuple(args.concurrency),
        requests=args.requests,
    )
    table = serving.run_serving_bench(config, force=True, progress=False, root=root)
    serving_s = time.perf_counter() - started
    print("\nServing benchmark (TTFT/e2e in seconds; warm-up request excluded):")
    _print(table[[*serving.SUMMARY_COLUMNS, "p50_ttft_s", "hit_rate", "predicted_saving"]])
    comparison = serving.compare_modes(table)
    print("\nCaching on vs off (ttft_ratio = TTFT off / TTFT on):")
    _print(comparison)
    ratios: dict[str, float] = {}
    longest = str(max(config.prefixes))
    for row in comparison[comparison["prefix_regime"] == longest].itertuples():
        ratios[f"ttft_ratio_p{longest}_c{row.concurrency}"] = float(row.ttft_ratio)
        ratios[f"tpot_ratio_p{longest}_c{row.concurrency}"] = float(
            row.tpot_no_cache_s / row.tpot_cache_s
        )
        print(
            f"TTFT ratio off/on at a {longest}-token shared prefix, concurrency "
            f"{row.concurrency}: {row.ttft_ratio:.2f}x "
            f"({row.ttft_no_cache_s:.3f} s -> {row.ttft_cache_s:.3f} s; measured saving "
            f"{row.measured_saving:.0%}, predicted P/(P+S) {row.predicted_saving:.0%}); "
            f"TPOT ratio off/on {row.tpot_no_cache_s / row.tpot_cache_s:.2f}x"
        )
    for mode, startup in table.groupby("mode")["server_startup_s"].first().items():
        print(f"server start-up ({mode}): {startup:.1f} s")
    print(f"serving benchmark wall time: {serving_s:.0f} s")

    if not args.no_sweep:
        started = time.perf_counter()
        sweep_config = serving.PrefixSweepConfig(
            model=args.model,
            fractions=tuple(args.fractions),
            num_prompts=args.sweep_prompts,
            repeats=args.sweep_repeats,
        )
        sweep = serving.run_prefix_sweep(sweep_config, force=True, progress=False, root=root)
        wide = serving.sweep_table(sweep)
        print(
            "\nSeed 004 sweep, offline engine: requests/s against the shared fraction "
            f"({sweep_config.num_prompts} prompts of {sweep_config.input_len} tokens, "
            f"{sweep_config.output_len} output tokens each; best of {sweep_config.repeats}):"
        )
        _print(wide)
        for row in wide.itertuples():
            ratios[f"sweep_speedup_f{row.fraction:g}"] = float(row.speedup)
        print(f"sweep wall time: {time.perf_counter() - started:.0f} s")
    if not args.no_match:
        ratios.update(_matching_cost(args.match_prompts))
    return ratios


def _matching_cost(count: int) -> dict[str, float]:
    """Token-level (radix tree) against block-hash prefix lookup on real trace prompts."""
    import pandas as pd

    from analysis.data.traces import load_trace
    from analysis.metrics import prefix_match
    from analysis.platform.paths import traces_dir

    trace = load_trace(traces_dir() / "multi_turn.parquet")
    prompts = [list(map(int, ids)) for ids in trace["prompt_ids"].head(count)]
    rows = prefix_match.compare_lookup_costs(prompts, 32)  # notebook 11's repeats, alternating
    print(f"\nFinding the cached prefix of {len(prompts)} multi-turn prompts (lookup + store):")
    _print(pd.DataFrame(rows))
    print(prefix_match.lookup_cost_reading(rows))
    radix = next(row for row in rows if row["kind"] == "radix")
    return {
        "radix_over_blockhash_time_min": radix["trie_over_hash_min"],
        "radix_over_blockhash_time_max": radix["trie_over_hash_max"],
    }


if __name__ == "__main__":
    main(sys.argv[1:])

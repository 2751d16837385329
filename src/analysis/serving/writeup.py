"""Seed 003's decision write-up and the per-claim table of seeds 003/004, generated from the
measured serving results (notebook 12), so that every number in the prose is one the runs
produced, quoted with its bootstrap 95 % interval.

A difference "holds" only when the two intervals do not overlap; otherwise the text says the
measurement cannot tell them apart. Nothing here imports vllm or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis import serving
from analysis.serving import stats as serving_stats
from analysis.serving.study import THRASH, StudyParams


@dataclass
class Interval:
    value: float
    low: float
    high: float

    def text(self, unit: str = "s", digits: int = 3) -> str:
        if not math.isfinite(self.value):
            return "n/a"
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"{self.value:.{digits}f} {unit}".strip()
        low, high = f"{self.low:.{digits}f}", f"{self.high:.{digits}f}"
        return f"{self.value:.{digits}f} {unit} [{low}-{high}]"

    def below(self, other: Interval) -> bool:
        """Lower beyond noise: this interval lies entirely under the other."""
        return self.high < other.low


def on_off(cells: dict, prefix: Any, concurrency: Any) -> tuple[Any, Any]:
    """A cell's caching-on and caching-off values (None where not measured)."""
    return cells.get(("cache", prefix, concurrency)), cells.get(("no_cache", prefix, concurrency))


def _cell(table: pd.DataFrame, mode: str, **where: Any) -> pd.Series | None:
    rows = table[table["mode"] == mode]
    for column, value in where.items():
        rows = rows[rows[column] == value]
    return rows.iloc[0] if len(rows) else None


def _interval(row: pd.Series | None, stat: str) -> Interval:
    if row is None:
        return Interval(math.nan, math.nan, math.nan)
    if stat == "req_s":
        return Interval(row["req_s"], row["req_s_lo"], row["req_s_hi"])
    return Interval(row[f"{stat}_s"], row[f"{stat}_lo_s"], row[f"{stat}_hi_s"])


@dataclass
class Facts:
    """The measured values the write-up quotes."""

    study: StudyParams
    ttft: dict[tuple[str, int, int], Interval] = field(default_factory=dict)  # mode, P, c
    tpot: dict[tuple[str, int, int], Interval] = field(default_factory=dict)
    req_s: dict[tuple[str, int, int], Interval] = field(default_factory=dict)
    hit_rate: dict[tuple[int, int], float] = field(default_factory=dict)
    patterns: dict[str, float] = field(default_factory=dict)  # pattern -> hit rate
    pattern_ttft: dict[str, Interval] = field(default_factory=dict)  # pattern -> mean TTFT
    sharegpt: dict[str, dict[str, Any]] = field(default_factory=dict)  # mode -> values
    mixture: dict[str, float] = field(default_factory=dict)
    dilution: list[dict[str, float]] = field(default_factory=list)
    sweep: pd.DataFrame = field(default_factory=pd.DataFrame)
    overhead_at_zero: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    long_prefill: pd.DataFrame = field(default_factory=pd.DataFrame)


def collect(
    study: StudyParams,
    synthetic: pd.DataFrame,
    patterns: pd.DataFrame,
    sharegpt: pd.DataFrame,
    dilution: dict[str, Any],
    engine: pd.DataFrame,
) -> Facts:
    """Pull the quoted values out of the sections' tables and raw rows."""
    facts = Facts(study)
    for row in synthetic.itertuples():
        key = (row.mode, int(row.prefix_regime), int(row.concurrency))
        series = synthetic.loc[row.Index]
        facts.ttft[key] = _interval(series, "mean_ttft")
        facts.tpot[key] = _interval(series, "mean_tpot")
        facts.req_s[key] = _interval(series, "req_s")
        if row.mode == "cache":
            facts.hit_rate[key[1:]] = float(row.hit_rate)
    facts.patterns = dict(zip(patterns["pattern"], patterns["hit_rate"], strict=True))
    for index, pattern in patterns["pattern"].items():
        facts.pattern_ttft[pattern] = _interval(patterns.loc[index], "mean_ttft")
    for mode in ("cache", "no_cache"):
        row = _cell(sharegpt, mode)
        if row is not None:
            facts.sharegpt[mode] = {
                "ttft": _interval(row, "mean_ttft"),
                "p95_ttft": _interval(row, "p95_ttft"),
                "tpot": _interval(row, "mean_tpot"),
                "req_s": _interval(row, "req_s"),
                "hit_rate": float(row["hit_rate"]) if mode == "cache" else math.nan,
                "run_id": row["run_id"],
            }
    if len(facts.sharegpt) == 2:
        facts.mixture = serving_stats.token_mixture_test(
            serving.load_requests([facts.sharegpt["cache"]["run_id"]]),
            serving.load_requests([facts.sharegpt["no_cache"]["run_id"]]),
        )
    base = dilution["base"]
    ids = {m: base.loc[base["mode"] == m, "run_id"].iloc[0] for m in ("cache", "no_cache")}
    for share, table in dilution["mixed"].items():
        facts.dilution.append(
            serving_stats.dilution_test(
                serving.load_requests(table["run_id"].tolist()),
                serving.load_requests([ids["cache"]]),
                serving.load_requests([ids["no_cache"]]),
                eligible_share=share,
                block_size=study.block_size,
            )
        )
    facts.sweep = serving.sweep_table(engine)
    zero = engine[(engine["experiment"] == "sweep") & (engine["fraction"] == 0.0)]
    facts.overhead_at_zero = serving.ratio_interval(
        zero.loc[zero["mode"] == "cache", "req_s"], zero.loc[zero["mode"] == "no_cache", "req_s"]
    )
    facts.long_prefill = serving.long_prefill_table(engine)
    return facts


def _saving(on: Interval, off: Interval) -> str:
    if not (math.isfinite(on.value) and math.isfinite(off.value)) or off.value <= 0:
        return "n/a"
    return f"{1 - on.value / off.value:.0%}"


def _verdict_lower(on: Interval, off: Interval) -> str:
    if on.below(off):
        return "lower beyond noise"
    if off.below(on):
        return "higher beyond noise"
    return "not distinguishable"


def sweep_disturbed(facts: Facts) -> bool:
    """At a 0 % hit rate the two modes differ only by hashing, a few percent at most; an
    on/off ratio outside [0.5, 2] means load from other jobs fell on one mode's minutes (the
    offline engines run one after the other), so the sweep's timings say nothing."""
    ratio = facts.overhead_at_zero[0]
    return not (math.isfinite(ratio) and 0.5 <= ratio <= 2.0)


# Below this hit rate a prefix set reuses nothing but the odd suffix block: it thrashes.
THRASH_HIT_RATE = 0.05


def thrash_line(facts: Facts, prefix: int) -> str | None:
    """The measured thrash case against one shared prefix and caching off (one client, the
    same prefix), or None when it was not run."""
    name = next((p for p in facts.patterns if p.startswith(THRASH)), None)
    if name is None:
        return None
    shared = facts.pattern_ttft.get("one shared prefix")
    off = facts.ttft.get(("no_cache", prefix, 1))
    return (
        f"{name}: hit rate {facts.patterns[name]:.1%}, mean TTFT "
        f"{facts.pattern_ttft[name].text()}, against {shared.text() if shared else 'n/a'} for "
        f"one shared prefix and {off.text() if off else 'n/a'} with caching off: a working set "
        "larger than the KV pool pays the caching-off prefill on every request."
    )


def decision_markdown(facts: Facts) -> str:
    """Seed 003's section 9, from the measurements."""
    s = facts.study
    longest = max(s.prefixes)
    low_c, high_c = min(s.concurrency), max(s.concurrency)
    lines = ["### When to enable prefix caching", ""]
    for prefix in sorted(p for p in s.prefixes if p > 0):
        for c in (low_c, high_c):
            on, off = on_off(facts.ttft, prefix, c)
            if on is None or off is None:
                continue
            lines.append(
                f"- {prefix}-token shared prefix, {c} client(s): mean TTFT {on.text()} on vs "
                f"{off.text()} off (saving {_saving(on, off)}; {_verdict_lower(on, off)})."
            )
    on_r, off_r = on_off(facts.req_s, longest, high_c)
    if on_r and off_r:
        lines.append(
            f"- Throughput at {high_c} clients, {longest}-token prefix: {on_r.text('req/s', 2)} "
            f"on vs {off_r.text('req/s', 2)} off."
        )
    on_t, off_t = on_off(facts.tpot, longest, low_c)
    on_th, off_th = on_off(facts.tpot, longest, high_c)
    if on_t and off_t and on_th and off_th:
        lines.append(
            f"- TPOT at {longest} tokens: {on_t.text()} on vs {off_t.text()} off with "
            f"{low_c} client(s) ({_verdict_lower(on_t, off_t)}); {on_th.text()} vs "
            f"{off_th.text()} with {high_c} ({_verdict_lower(on_th, off_th)}): under "
            "concurrency the queued prefills of caching off delay everyone's decode steps."
        )
    if len(facts.sharegpt) == 2:
        on_s, off_s = facts.sharegpt["cache"], facts.sharegpt["no_cache"]
        lines.append(
            f"- Real multi-turn conversations ({s.sharegpt_concurrency} clients, hit rate "
            f"{on_s['hit_rate']:.1%} by the server's counters): mean TTFT {on_s['ttft'].text()} "
            f"on vs {off_s['ttft'].text()} off ({_verdict_lower(on_s['ttft'], off_s['ttft'])}); "
            f"{on_s['req_s'].text('req/s', 2)} vs {off_s['req_s'].text('req/s', 2)}."
        )
    lines.append(
        f"- Rule from these runs: enable it where requests share at least "
        f"{_smallest_clear_prefix(facts)} tokens of prefix; the gain grows with the prefix "
        "and with concurrency (the 256-token row shows how small a short prefix's gain is)."
    )
    lines += ["", "### How to detect that it works", ""]
    lines.append(
        "- The server's counters: `vllm:prefix_cache_hits / vllm:prefix_cache_queries` "
        "(token hit rate) on `/metrics`, and per request `usage.prompt_tokens_details."
        "cached_tokens` (with `--enable-prompt-tokens-details`)."
    )
    if facts.mixture:
        m = facts.mixture
        inside = m["measured_lo_s"] <= m["predicted_ttft_s"] <= m["measured_hi_s"]
        verdict = (
            "inside the interval"
            if inside
            else "outside the interval: with several clients a caching-off TTFT also holds the "
            "wait behind the other clients' prefills, which the line fitted on those requests "
            "counts as the request's own tokens, and which caching shortens too"
        )
        lines.append(
            f"- TTFT then follows the tokens left to prefill: on the conversations the model "
            f"a + b x (1 - h_i) x prompt_i (fitted on the caching-off requests) predicts "
            f"{m['predicted_ttft_s']:.3f} s, measured {m['measured_ttft_s']:.3f} s "
            f"[{m['measured_lo_s']:.3f}-{m['measured_hi_s']:.3f}] ({verdict})."
        )
    for d in facts.dilution:
        lines.append(
            f"- Mixed traffic, f = {d['eligible_share']:.2f} eligible: measured hit share h = "
            f"{d['hit_share']:.2f}; E[TTFT] = h x TTFT_hit + (1-h) x TTFT_miss predicts "
            f"{d['predicted_ttft_s']:.3f} s, measured {d['measured_ttft_s']:.3f} s "
            f"[{d['measured_lo_s']:.3f}-{d['measured_hi_s']:.3f}] (saving "
            f"{d['measured_saving']:.0%} against the predicted {d['predicted_saving']:.0%})."
        )
    lines.append(
        "- Not memory: `vllm:kv_cache_usage_perc` counts cached-but-idle blocks as free, so it "
        "falls back to zero after a run with caching on too and cannot show the cache "
        "(notebook 10)."
    )
    lines += ["", "### Caveats", ""]
    for pattern, rate in facts.patterns.items():
        if not pattern.startswith(THRASH):  # the thrash case has its own line below
            lines.append(f"- {pattern}: hit rate {rate:.1%} (one client, {longest}-token prefix).")
    ratio, low, high = facts.overhead_at_zero
    verdict = "no cost beyond noise" if low <= 1 <= high else "a measurable difference"
    if sweep_disturbed(facts):
        verdict = "implausible: load from other jobs fell on one mode; re-run notebook 11 quiet"
    if math.isfinite(ratio):
        lines.append(
            f"- Nothing to reuse: offline requests/s on/off at 0 % shared = {ratio:.3f} "
            f"[{low:.3f}-{high:.3f}] ({verdict})."
        )
    thrash = thrash_line(facts, longest) or (
        "A prefix working set larger than the KV pool thrashes: every request misses and pays "
        "the caching-off TTFT (measured with the `thrash` parameter, as in the `cpu-study` set)."
    )
    lines.append(f"- {thrash} Small models on a fast GPU hide the saving behind fixed costs.")
    lines += ["", "### One sentence for a PM or SRE", ""]
    on, off = on_off(facts.ttft, longest, high_c)
    saving = _saving(on, off) if on and off else "n/a"
    lines.append(
        f"Prefix caching lets the server compute a long shared prompt once and reuse it, which "
        f"cut first-token latency by {saving} here ({longest}-token prefix, {high_c} clients) "
        "at no extra memory; it pays off only where many requests share a long, stable prefix, "
        "and the server's prefix-cache hit counters show whether they do."
    )
    return "\n".join(lines)


def _smallest_clear_prefix(facts: Facts) -> str:
    """The smallest prefix whose TTFT with caching on is below caching off beyond noise at
    every concurrency measured."""
    s = facts.study
    for prefix in sorted(p for p in s.prefixes if p > 0):
        pairs = [on_off(facts.ttft, prefix, c) for c in s.concurrency]
        if all(on and off and on.below(off) for on, off in pairs):
            return str(prefix)
    return f"more than {max(s.prefixes)}"


def claims_table(facts: Facts) -> pd.DataFrame:
    """Seed 003/004 claims that these runs measure: the value and the verdict."""
    s = facts.study
    longest = max(s.prefixes)
    low_c, high_c = min(s.concurrency), max(s.concurrency)
    rows = []

    def add(claim: str, value: str, verdict: str) -> None:
        rows.append({"claim": claim, "measured": value, "verdict": verdict})

    on, off = on_off(facts.ttft, longest, low_c)
    if on and off:
        add(
            "003: TTFT drops on cache hits, more with a longer prefix",
            f"P={longest}, c={low_c}: {on.text()} vs {off.text()}",
            "reproduced" if on.below(off) else "not shown",
        )
    on_t, off_t = on_off(facts.tpot, longest, low_c)
    on_th, off_th = on_off(facts.tpot, longest, high_c)
    if on_t and off_t and on_th and off_th:
        alone = "holds" if not (on_t.below(off_t) or off_t.below(on_t)) else "differs"
        loaded = "caching cuts TPOT" if on_th.below(off_th) else "no difference"
        add(
            "004: caching does not speed up decoding (TPOT)",
            f"c={low_c}: {on_t.text()} vs {off_t.text()}; c={high_c}: {on_th.text()} vs "
            f"{off_th.text()}",
            f"alone: {alone}; under load: {loaded} (queued prefills)",
        )
    short = min(p for p in s.prefixes if p > 0)
    on_s, off_s = on_off(facts.ttft, short, low_c)
    if on_s and off_s:
        add(
            "003: prefixes <= 256 tokens: savings lost in noise",
            f"P={short}, c={low_c}: {on_s.text()} vs {off_s.text()} "
            f"(saving {_saving(on_s, off_s)})",
            "reproduced" if not on_s.below(off_s) else "saving measurable but small in seconds",
        )
    for d in facts.dilution:
        inside = d["measured_lo_s"] <= d["predicted_ttft_s"] <= d["measured_hi_s"]
        add(
            "003: E[TTFT] = h TTFT_hit + (1-h) TTFT_miss; f·h dilution",
            f"f={d['eligible_share']:.2f}, h={d['hit_share']:.2f}: predicted "
            f"{d['predicted_ttft_s']:.3f} s, measured {d['measured_ttft_s']:.3f} s "
            f"[{d['measured_lo_s']:.3f}-{d['measured_hi_s']:.3f}]",
            "reproduced" if inside else "prediction outside the interval",
        )
    if len(facts.sharegpt) == 2:
        a, b = facts.sharegpt["cache"], facts.sharegpt["no_cache"]
        add(
            "003: real chat traffic (session trunk reuse) lowers TTFT",
            f"hit rate {a['hit_rate']:.1%}: {a['ttft'].text()} vs {b['ttft'].text()}",
            "reproduced" if a["ttft"].below(b["ttft"]) else "not distinguishable",
        )
    for pattern, rate in facts.patterns.items():
        if pattern.startswith(THRASH):
            add(
                f"003 anti-pattern: {pattern}",
                f"hit rate {rate:.1%}; TTFT {facts.pattern_ttft[pattern].text()}",
                "thrashes: nothing reused" if rate < THRASH_HIT_RATE else "partly reused",
            )
        elif pattern != "one shared prefix":
            add(f"003 anti-pattern: {pattern}", f"hit rate {rate:.1%}", "each new prefix misses")
    if not facts.sweep.empty:
        top = facts.sweep.iloc[-1]
        add(
            "004: QPS rises with the hit rate only with caching on",
            f"100 % shared (realized hit {top['cache_hit_rate']:.1%}): "
            f"{top['cache']:.2f} vs {top['no_cache']:.2f} req/s ({top['speedup']:.2f}x)",
            "timings disturbed by load: re-run"
            if sweep_disturbed(facts)
            else "reproduced"
            if top["cache_lo"] > top["no_cache_hi"]
            else "not distinguishable",
        )
    ratio, low, high = facts.overhead_at_zero
    add(
        "004: caching overhead at 0 % hit is small",
        f"on/off = {ratio:.3f} [{low:.3f}-{high:.3f}]",
        "timings disturbed by load: re-run"
        if sweep_disturbed(facts)
        else "no cost beyond noise"
        if low <= 1 <= high
        else "measurable",
    )
    add(
        "004: 'hash but don't cache' arm",
        "vLLM 0.32 builds no block hasher when caching is off (v1/engine/core.py)",
        "no vLLM equivalent",
    )
    add(
        "004: async scheduling raises QPS",
        "vLLM's CPU platform forces async_scheduling off (platforms/cpu.py)",
        "not measurable on a CPU",
    )
    if not facts.long_prefill.empty and "cache-round2" in facts.long_prefill.index:
        cached = facts.long_prefill.loc["cache-round2"]
        products = cached * cached.index
        add(
            "004: long prefill cached: throughput ~ 1/output_len",
            "req/s x output_len in round 2: "
            + ", ".join(f"{k}: {v:.2f}" for k, v in products.items()),
            "timings disturbed by load: re-run"
            if sweep_disturbed(facts)
            else "reproduced"
            if products.max() / products.min() < 2
            else "only roughly",
        )
    return pd.DataFrame(rows)

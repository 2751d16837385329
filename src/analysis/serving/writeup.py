"""Seed 003's decision write-up and the per-claim table of seeds 003/004, generated from the
measured serving results (notebook 12), so that every number in the prose is one the runs
produced, quoted with its interval (median of repeats, two-level bootstrap; what that interval
covers with few repeats is `stats.interval_note`). A cell measured while the machine's speed
changed is never quoted as a finding without its flag (`flag`).

Whether two values differ is decided by `intervals.compare` alone (intervals that do not
overlap), for the sentences and the claim rows alike. Nothing here imports vllm or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis import serving
from analysis.serving import intervals
from analysis.serving import stats as serving_stats
from analysis.serving.intervals import (
    VERDICT_TEXT,
    Interval,
    compare,
    verdict_text,
)
from analysis.serving.prefix_sweep import long_prefill_verdict
from analysis.serving.study import THRASH, StudyParams

__all__ = [
    "Facts",
    "Interval",
    "claims_table",
    "collect",
    "decision_markdown",
    "dilution_verdict",
    "mixture_reading",
    "mixture_title",
    "sharegpt_flag",
    "table_flag",
]

# Seed 003's rule of thumb, quoted (section 9): enable caching from about 1K shared tokens
# and 8 concurrent requests.
SEED_RULE_PREFIX = 1024
SEED_RULE_CONCURRENCY = 8
SHORT_PREFIX = 256  # seed 003's "short prefix": this many tokens or fewer


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
        return Interval(math.nan)
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
    # what ran per cell: (peak requests in flight, requests per repeat, one burst or not)
    ran: dict[tuple[str, int, int], tuple[int, int, bool]] = field(default_factory=dict)
    odd_repeats: dict[tuple[str, Any, int], list[int]] = field(default_factory=dict)
    speed_notes: dict[tuple[str, Any, int], str] = field(default_factory=dict)
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
        facts.ran[key] = _what_ran(series)
        if series.get("outlier_repeats"):
            facts.odd_repeats[key] = list(series["outlier_repeats"])
        if series.get("speed_note"):
            facts.speed_notes[key] = str(series["speed_note"])
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
                "first_turn": _interval(row, "mean_ttft_first_turn"),
                "later_turns": _interval(row, "mean_ttft_later_turns"),
                "hit_rate": float(row["hit_rate"]) if mode == "cache" else math.nan,
                "free_running_ideal": float(row["predicted_hit_rate"]),
                "run_id": row["run_id"],
                "odd_repeats": list(row.get("outlier_repeats") or []),
                "speed_note": str(row.get("speed_note") or ""),
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


def _what_ran(row: pd.Series) -> tuple[int, int, bool]:
    return (
        int(row.get("inflight_peak", 0) or 0),
        int(row.get("requests_per_repeat", 0) or 0),
        bool(row.get("burst", False)),
    )


def clients_text(facts: Facts, mode: str, prefix: int, concurrency: int) -> str:
    """`8 clients`, or what a burst really was: `8 clients configured, one burst of 4
    requests (at most 4 in flight)`."""
    peak, per_repeat, burst = facts.ran.get((mode, prefix, concurrency), (0, 0, False))
    label = f"{concurrency} client{'s' if concurrency != 1 else ''}"
    if not burst:
        return label
    return f"{label} configured, one burst of {per_repeat} requests (at most {peak} in flight)"


def _caveats(facts: Facts, prefix: Any, concurrency: int) -> str:
    """What makes a cell's numbers less sure: a repeat unlike the others, a machine whose
    speed changed during the cell."""
    notes = []
    for mode in ("cache", "no_cache"):
        key = (mode, prefix, concurrency)
        label = "on" if mode == "cache" else "off"
        if key in facts.odd_repeats:
            odd = serving_stats.odd_repeats_text(facts.odd_repeats[key], facts.study.repeats)
            notes.append(f"caching {label}: {odd}")
        if key in facts.speed_notes:
            notes.append(f"caching {label}: {facts.speed_notes[key]}")
    return f"; {'; '.join(notes)}" if notes else ""


def flagged_modes(facts: Facts, prefix: Any, concurrency: int) -> list[str]:
    """The modes ("on", "off") of a cell whose prefill-speed probe moved while it ran."""
    return [
        "on" if mode == "cache" else "off"
        for mode in ("cache", "no_cache")
        if (mode, prefix, concurrency) in facts.speed_notes
    ]


def flag(facts: Facts, prefix: Any, concurrency: int) -> str:
    """` (flagged: ...)` for a cell whose speed probe moved while it ran, else ""."""
    return modes_flag(flagged_modes(facts, prefix, concurrency))


def modes_flag(modes: list[str]) -> str:
    """` (flagged: ...)` naming the modes ("on", "off") whose speed probe moved, else ""."""
    if not modes:
        return ""
    return (
        f" (flagged: the prefill-speed probe moved while caching {' and '.join(modes)} ran; "
        "re-run it before quoting it)"
    )


def table_flag(table: pd.DataFrame) -> str:
    """The flag of a section's table (one row per mode) whose `speed_note` marks a mode."""
    notes = table["speed_note"].fillna("") if "speed_note" in table else [""] * len(table)
    return _notes_flag(dict(zip(table["mode"], notes, strict=True)))


def sharegpt_flag(facts: Facts) -> str:
    """The flag of the ShareGPT cells (either mode), else ""."""
    return _notes_flag({mode: cell.get("speed_note") for mode, cell in facts.sharegpt.items()})


def _notes_flag(notes: dict[str, Any]) -> str:
    """The flag of the modes ("cache", "no_cache") whose speed note is not empty."""
    return modes_flag(
        ["on" if mode == "cache" else "off" for mode in ("cache", "no_cache") if notes.get(mode)]
    )


def _saving(on: Interval, off: Interval) -> str:
    if not (math.isfinite(on.value) and math.isfinite(off.value)) or off.value <= 0:
        return "n/a"
    return f"{1 - on.value / off.value:.0%}"


def sweep_disturbed(facts: Facts) -> bool:
    """At a 0 % hit rate the two modes differ only by hashing, a few percent at most; an
    on/off ratio outside [0.5, 2] means load from other jobs fell on one mode's batches (they
    alternate with the other mode's, but a burst can still land on one), so the sweep's
    timings say nothing."""
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
    thrash = facts.pattern_ttft[name]
    shared = facts.pattern_ttft.get("one shared prefix", Interval(math.nan))
    off = facts.ttft.get(("no_cache", prefix, 1), Interval(math.nan))
    against_off = {
        "lower": "a little faster than caching off, which was measured at another time (runs "
        "at different times differ by about as much)",
        "higher": "slower than caching off",
        "not distinguishable": "as slow as caching off",
    }[compare(thrash, off)]
    return (
        f"{name}: hit rate {facts.patterns[name]:.1%}, mean TTFT {thrash.text()}, against "
        f"{shared.text()} for one shared prefix and {off.text()} with caching off: "
        f"{against_off}; a working set larger than the KV pool loses nearly every prefix "
        "before its reuse."
    )


def _sharegpt_line(facts: Facts) -> str:
    s = facts.study
    on, off = facts.sharegpt["cache"], facts.sharegpt["no_cache"]
    line = (
        f"- Real multi-turn conversations ({s.sharegpt_concurrency} clients; the server writes "
        "its own short replies, so a turn reuses the previous prompt but not the recorded "
        f"reply: the free-running case, whose ideal hit rate is {on['free_running_ideal']:.1%}; "
        f"measured {on['hit_rate']:.1%} by the server's counters): mean TTFT "
        f"{on['ttft'].text()} on vs {off['ttft'].text()} off "
        f"({verdict_text(on['ttft'], off['ttft'])}); first turns {on['first_turn'].text()} vs "
        f"{off['first_turn'].text()}, later turns {on['later_turns'].text()} vs "
        f"{off['later_turns'].text()}; {on['req_s'].text('req/s', 2)} vs "
        f"{off['req_s'].text('req/s', 2)}{sharegpt_flag(facts)}."
    )
    for mode in ("cache", "no_cache"):
        odd = serving_stats.odd_repeats_text(
            facts.sharegpt[mode]["odd_repeats"], facts.study.repeats
        )
        if odd:
            line += (
                f" Caching {'on' if mode == 'cache' else 'off'}: {odd} (notebook 10's table); "
                "the median of repeats is not moved by an odd one, the interval shows it."
            )
    return line


def _rule_line(facts: Facts) -> str:
    s = facts.study
    grid = sorted(set(s.prefixes) | {0})
    clear = _smallest_clear_prefix(facts)
    if clear is None:
        return (
            f"- Rule from these runs: no prefix measured ({', '.join(map(str, grid))} tokens) "
            "saved TTFT beyond noise at every concurrency."
        )
    below = max(p for p in grid if p < clear)
    seed = (
        "stricter than these runs need"
        if clear < SEED_RULE_PREFIX or min(s.concurrency) < SEED_RULE_CONCURRENCY
        else "consistent with them"
    )
    return (
        f"- Rule from these runs: of the prefixes measured ({', '.join(map(str, grid))} "
        f"tokens), the shortest that saved TTFT beyond noise at every concurrency "
        f"({', '.join(map(str, s.concurrency))} clients) was {clear} tokens; nothing between "
        f"{below} and {clear} was measured, so the threshold is somewhere at or below {clear}. "
        f"Seed 003's rule of thumb (about {SEED_RULE_PREFIX} shared tokens and "
        f"{SEED_RULE_CONCURRENCY} concurrent requests) is {seed}.{_rule_flags(facts, clear)}"
    )


def _rule_flags(facts: Facts, clear: int) -> str:
    """The rule rests on the cells of the prefixes up to `clear` at every concurrency: name
    the ones measured while the machine's speed changed."""
    flagged = [
        f"{prefix} tokens, {c} client{'s' if c != 1 else ''}"
        for prefix in sorted(p for p in facts.study.prefixes if 0 < p <= clear)
        for c in facts.study.concurrency
        if flagged_modes(facts, prefix, c)
    ]
    if not flagged:
        return ""
    return (
        f" It rests on cells flagged for a machine-speed change ({'; '.join(flagged)}): re-run "
        "them on a quiet machine before relying on it."
    )


# The caching-off line must explain at least this share of its TTFTs' variance before TTFT
# can be said to follow the tokens left to prefill.
LINE_R_SQUARED = 0.5


def _prediction_inside(m: dict[str, float]) -> bool:
    return bool(m["measured_lo_s"] <= m["predicted_ttft_s"] <= m["measured_hi_s"])


def _tokens_set_ttft(m: dict[str, float]) -> bool:
    return _prediction_inside(m) and m.get("line_r_squared", 0.0) >= LINE_R_SQUARED


def dilution_verdict(d: dict[str, float]) -> str:
    """The mixture model against a mixed run. A prediction inside the measured interval tests
    nothing when the interval is wider than the whole range the model spans (all hits to all
    misses): any h would have passed."""
    width = d["measured_hi_s"] - d["measured_lo_s"]
    span = abs(d["ttft_miss_s"] - d["ttft_hit_s"])
    if not _prediction_inside(d):
        return "prediction outside the interval"
    if width >= span:
        return (
            f"not tested: the interval ({width:.3f} s wide) is wider than the all-hit to "
            f"all-miss range ({span:.3f} s); re-run with more requests or a quieter machine"
        )
    return "reproduced"


def mixture_title(m: dict[str, float]) -> str:
    """The figure title of notebook 10's per-request model, as the fit came out."""
    if _tokens_set_ttft(m):
        return "TTFT follows the tokens left to prefill"
    return "TTFT is not set by the tokens left to prefill alone"


def _mixture_why(m: dict[str, float]) -> str:
    inside = "inside" if _prediction_inside(m) else "outside"
    why = f"{inside} the measured interval; the line explains {m['line_r_squared']:.0%} of "
    why += "the caching-off TTFTs' variance"
    if _tokens_set_ttft(m):
        return why
    return (
        f"{why}, and its fixed cost, {m['fixed_cost_s']:.3f} s, holds the wait behind the "
        "other clients' prefills, which caching shortens too"
    )


def _mixture_line(m: dict[str, float], flag: str = "") -> str:
    measured = Interval(m["measured_ttft_s"], m["measured_lo_s"], m["measured_hi_s"])
    return (
        f"- {mixture_title(m)}: on the conversations, a + b x (1 - h_i) x prompt_i (fitted on "
        f"the caching-off requests) predicts {m['predicted_ttft_s']:.3f} s, measured "
        f"{measured.text()} ({_mixture_why(m)}){flag}."
    )


def mixture_reading(m: dict[str, float], flag: str = "") -> str:
    """Notebook 10's reading of the per-request model, from the fit; `flag`: the
    conversation cells' (`table_flag`) when their speed probe moved."""
    measured = Interval(m["measured_ttft_s"], m["measured_lo_s"], m["measured_hi_s"])
    return (
        f"**{mixture_title(m)}.** Fitted on the caching-off requests, TTFT = a + b x prompt "
        f"tokens gives a = {m['fixed_cost_s']:.3f} s and b = "
        f"{m['prefill_s_per_1k_tokens']:.3f} s per 1,000 tokens. With each request's own hit "
        f"share (token hit rate {m['token_hit_rate']:.1%}), the line predicts a mean TTFT of "
        f"{m['predicted_ttft_s']:.3f} s with caching on; measured {measured.text()} (median of "
        f"the repeats' means): {_mixture_why(m)}{flag}."
    )


def overhead_verdict(facts: Facts) -> str:
    """Seed 004's overhead at a 0 % hit rate, read with its sign: requests/s on/off above 1
    is caching on faster, which is no overhead at all."""
    if sweep_disturbed(facts):
        return "implausible: load from other jobs fell on one mode; re-run notebook 11 quiet"
    same_work = facts.sweep.get("no_cache", pd.Series(dtype=float))
    return intervals.overhead_verdict(Interval(*facts.overhead_at_zero), same_work)


def cell_lines(facts: Facts) -> list[str]:
    """One line per shared prefix and the fewest and most clients: mean TTFT on vs off, the
    saving, the verdict, and the cell's caveats (an odd repeat; a machine-speed change)."""
    s = facts.study
    lines = []
    for prefix in sorted(p for p in s.prefixes if p > 0):
        for c in sorted({min(s.concurrency), max(s.concurrency)}):
            on, off = on_off(facts.ttft, prefix, c)
            if on is None or off is None:
                continue
            lines.append(
                f"- {prefix}-token shared prefix, {clients_text(facts, 'cache', prefix, c)}: "
                f"mean TTFT {on.text()} on vs {off.text()} off (saving {_saving(on, off)}; "
                f"{verdict_text(on, off)}){_caveats(facts, prefix, c)}."
            )
    return lines


def decision_markdown(facts: Facts) -> str:
    """Seed 003's section 9, from the measurements."""
    s = facts.study
    longest = max(s.prefixes)
    low_c, high_c = min(s.concurrency), max(s.concurrency)
    lines = ["### When to enable prefix caching", "", *cell_lines(facts)]
    on_r, off_r = on_off(facts.req_s, longest, high_c)
    if on_r and off_r:
        lines.append(
            f"- Throughput at {clients_text(facts, 'cache', longest, high_c)}, {longest}-token "
            f"prefix: {on_r.text('req/s', 2)} on vs {off_r.text('req/s', 2)} off"
            f"{flag(facts, longest, high_c)}."
        )
    on_t, off_t = on_off(facts.tpot, longest, low_c)
    on_th, off_th = on_off(facts.tpot, longest, high_c)
    if on_t and off_t and on_th and off_th:
        lines.append(
            f"- TPOT at {longest} tokens: {on_t.text()} on vs {off_t.text()} off with "
            f"{low_c} client(s) ({verdict_text(on_t, off_t)}); {on_th.text()} vs "
            f"{off_th.text()} with {high_c} ({verdict_text(on_th, off_th)}): under "
            "concurrency the queued prefills of caching off delay everyone's decode steps"
            f"{flag(facts, longest, low_c) or flag(facts, longest, high_c)}."
        )
    if len(facts.sharegpt) == 2:
        lines.append(_sharegpt_line(facts))
    lines.append(_rule_line(facts))
    lines += ["", "### How to detect that it works", ""]
    lines.append(
        "- The server's counters: `vllm:prefix_cache_hits / vllm:prefix_cache_queries` "
        "(token hit rate) on `/metrics`, and per request `usage.prompt_tokens_details."
        "cached_tokens` (with `--enable-prompt-tokens-details`)."
    )
    if facts.mixture:
        lines.append(_mixture_line(facts.mixture, sharegpt_flag(facts)))
    for d in facts.dilution:
        lines.append(
            f"- Mixed traffic, f = {d['eligible_share']:.2f} eligible: measured hit share h = "
            f"{d['hit_share']:.2f}; E[TTFT] = h x TTFT_hit + (1-h) x TTFT_miss predicts "
            f"{d['predicted_ttft_s']:.3f} s, measured {d['measured_ttft_s']:.3f} s "
            f"[{d['measured_lo_s']:.3f}-{d['measured_hi_s']:.3f}] (saving "
            f"{d['measured_saving']:.0%} against the predicted {d['predicted_saving']:.0%}): "
            f"{dilution_verdict(d)}."
        )
    lines.append(
        "- Not memory: `vllm:kv_cache_usage_perc` counts cached-but-idle blocks as free, so it "
        "falls back toward zero as a run ends with caching on too and cannot show the cache "
        "(notebook 10)."
    )
    lines += ["", "### Caveats", ""]
    for pattern, rate in facts.patterns.items():
        if not pattern.startswith(THRASH):  # the thrash case has its own line below
            lines.append(f"- {pattern}: hit rate {rate:.1%} (one client, {longest}-token prefix).")
    ratio, low, high = facts.overhead_at_zero
    if math.isfinite(ratio):
        lines.append(
            f"- Nothing to reuse: offline requests/s on/off at 0 % shared = {ratio:.3f} "
            f"[{low:.3f}-{high:.3f}] ({overhead_verdict(facts)})."
        )
    thrash = thrash_line(facts, longest) or (
        "A prefix working set larger than the KV pool thrashes (not run here; the `thrash` "
        "parameter, as in the `cpu-study` set, measures it)."
    )
    lines.append(f"- {thrash} Small models on a fast GPU hide the saving behind fixed costs.")
    lines += ["", "### One sentence for a PM or SRE", ""]
    lines.append(pm_sentence(facts))
    return "\n".join(lines)


def pm_sentence(facts: Facts) -> str:
    """The sentence for a PM or SRE. It quotes the longest prefix at the most clients, or at
    the fewest where that cell was flagged for a machine-speed change; where both are flagged
    it quotes the first with its flag, never as a plain finding."""
    s = facts.study
    longest = max(s.prefixes)
    cells = [
        c for c in (max(s.concurrency), min(s.concurrency)) if on_off(facts.ttft, longest, c)[0]
    ]
    clean = [c for c in cells if not flagged_modes(facts, longest, c)]
    chosen = clean[0] if clean else (cells[0] if cells else max(s.concurrency))
    on, off = on_off(facts.ttft, longest, chosen)
    saving = _saving(on, off) if on and off else "n/a"
    return (
        f"Prefix caching lets the server compute a long shared prompt once and reuse it, which "
        f"cut first-token latency by {saving} here ({longest}-token prefix, "
        f"{clients_text(facts, 'cache', longest, chosen)}){flag(facts, longest, chosen)} "
        "at no extra memory; it pays off only where many requests share a long, stable prefix, "
        "and the server's prefix-cache hit counters show whether they do."
    )


def _smallest_clear_prefix(facts: Facts) -> int | None:
    """The smallest measured prefix whose TTFT with caching on is below caching off beyond
    noise at every concurrency measured (None: no such prefix)."""
    s = facts.study
    for prefix in sorted(p for p in s.prefixes if p > 0):
        pairs = [on_off(facts.ttft, prefix, c) for c in s.concurrency]
        if all(on and off and on.below(off) for on, off in pairs):
            return prefix
    return None


def short_prefix_verdict(on: Interval, off: Interval) -> str:
    """Seed 003's anti-pattern is conditional: a short prefix saves little *when the suffix is
    large or the generation long*. These runs use a short suffix and short generations, so the
    condition never ran; what they show is the saving without it."""
    measured = (
        "no saving beyond noise"
        if compare(on, off) == "not distinguishable"
        else f"TTFT {verdict_text(on, off)} with caching on, "
        f"{(off.value - on.value) * 1e3:.0f} ms per request"
    )
    return (
        "not tested: the seed's condition (a large suffix or a long generation) was not run; "
        f"with a short suffix and short generations, {measured}"
    )


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
            ("reproduced" if on.below(off) else "not shown") + flag(facts, longest, low_c),
        )
    on_t, off_t = on_off(facts.tpot, longest, low_c)
    on_th, off_th = on_off(facts.tpot, longest, high_c)
    if on_t and off_t and on_th and off_th:
        alone = "holds" if compare(on_t, off_t) == "not distinguishable" else "differs"
        loaded = {
            "lower": "caching cuts TPOT",
            "higher": "caching raises TPOT",
            "not distinguishable": "no difference",
        }[compare(on_th, off_th)]
        add(
            "004: caching does not speed up decoding (TPOT)",
            f"c={low_c}: {on_t.text()} vs {off_t.text()}; c={high_c}: {on_th.text()} vs "
            f"{off_th.text()}",
            f"alone: {alone}; under load: {loaded} (queued prefills)"
            f"{flag(facts, longest, low_c) or flag(facts, longest, high_c)}",
        )
    short_claim = (
        f"003: short prefix (<= {SHORT_PREFIX} tokens) with a large suffix or long generation: "
        "savings lost in noise"
    )
    short = min((p for p in s.prefixes if 0 < p <= SHORT_PREFIX), default=None)
    on_s, off_s = on_off(facts.ttft, short, low_c) if short else (None, None)
    if on_s and off_s:
        add(
            short_claim,
            f"P={short}, c={low_c}, suffix {s.suffix_tokens} tokens, {s.output_tokens} "
            f"output tokens: {on_s.text()} vs {off_s.text()} (saving {_saving(on_s, off_s)})",
            short_prefix_verdict(on_s, off_s) + flag(facts, short, low_c),
        )
    elif short is None:
        add(
            short_claim,
            f"no prefix of {SHORT_PREFIX} tokens or fewer measured (prefixes "
            f"{', '.join(map(str, s.prefixes))}; the `cpu-study` set measures {SHORT_PREFIX}, "
            "and replay predicts it above the claims)",
            "not tested: neither the seed's condition (a large suffix or a long generation) "
            "nor a short prefix was run",
        )
    for d in facts.dilution:
        add(
            "003: E[TTFT] = h TTFT_hit + (1-h) TTFT_miss; f·h dilution",
            f"f={d['eligible_share']:.2f}, h={d['hit_share']:.2f}: predicted "
            f"{d['predicted_ttft_s']:.3f} s, measured {d['measured_ttft_s']:.3f} s "
            f"[{d['measured_lo_s']:.3f}-{d['measured_hi_s']:.3f}]",
            dilution_verdict(d),
        )
    if len(facts.sharegpt) == 2:
        a, b = facts.sharegpt["cache"], facts.sharegpt["no_cache"]
        verdict = compare(a["ttft"], b["ttft"])
        add(
            "003: real chat traffic (session trunk reuse) lowers TTFT",
            f"hit rate {a['hit_rate']:.1%} (free-running): {a['ttft'].text()} vs "
            f"{b['ttft'].text()}",
            ("reproduced" if verdict == "lower" else VERDICT_TEXT[verdict]) + sharegpt_flag(facts),
        )
    for pattern, rate in facts.patterns.items():
        if pattern.startswith(THRASH):
            add(
                f"003 anti-pattern: {pattern}",
                f"hit rate {rate:.1%}; TTFT {facts.pattern_ttft[pattern].text()}",
                "thrashes: almost nothing reused" if rate < THRASH_HIT_RATE else "partly reused",
            )
        elif pattern != "one shared prefix":
            misses = "each new prefix misses" if rate < THRASH_HIT_RATE else "partly reused"
            add(f"003 anti-pattern: {pattern}", f"hit rate {rate:.1%}", misses)
    if not facts.sweep.empty:
        top = facts.sweep.iloc[-1]
        on_q = Interval(top["cache"], top["cache_lo"], top["cache_hi"])
        off_q = Interval(top["no_cache"], top["no_cache_lo"], top["no_cache_hi"])
        add(
            "004: QPS rises with the hit rate only with caching on",
            f"100 % shared (realized hit {top['cache_hit_rate']:.1%}): "
            f"{top['cache']:.2f} vs {top['no_cache']:.2f} req/s ({top['speedup']:.2f}x)",
            "timings disturbed by load: re-run"
            if sweep_disturbed(facts)
            else "reproduced"
            if compare(on_q, off_q) == "higher"
            else VERDICT_TEXT[compare(on_q, off_q)],
        )
    ratio, low, high = facts.overhead_at_zero
    add(
        "004: caching overhead at 0 % hit is small",
        f"on/off = {ratio:.3f} [{low:.3f}-{high:.3f}]",
        overhead_verdict(facts),
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
            else long_prefill_verdict(facts.long_prefill),
        )
    return pd.DataFrame(rows)

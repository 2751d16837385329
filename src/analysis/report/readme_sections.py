"""The texts of README.md's generated blocks, each rendered from committed notebook outputs.

One function per block, `(repository root) -> markdown`. Numbers are copied as the notebooks
printed them (a rate printed as a fraction is shown in per cent with the same digits); the few
derived here (a difference in ms, a requests-per-repeat count, an overlap of two printed
intervals) say so by their wording. Every line names the notebook and cell it read.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from analysis.report.notebook_outputs import (
    READABLE,
    Outputs,
    Row,
    Source,
    SourceError,
    Stat,
    column,
    has,
    statistic,
    statistic_label,
)
from analysis.serving.intervals import overhead_verdict
from analysis.serving.stats import REPEATS_FOR_95, range_coverage

STUDY = "figures/cpu-study"
# The p95 TTFT target of the "throughput at a latency target" line (seconds): a reading choice.
P95_TARGET_S = 0.3


# -- formatting -----------------------------------------------------------------------------


def pct(printed: str) -> str:
    """A rate printed as a fraction, in per cent with the same significant digits."""
    value = float(printed)
    decimals = max(len(printed.split(".")[1]) - 2, 0) if "." in printed else 0
    return f"{value * 100:.{decimals}f} %"


def cite(*sources: Source) -> str:
    """`path` cells i, j; ...: the cells read, grouped by notebook (notebooks in first-seen
    order, cells in ascending order)."""
    cells: dict[str, list[int]] = {}
    for source in sources:
        found = cells.setdefault(source.path, [])
        if source.cell not in found:
            found.append(source.cell)
    return "; ".join(
        f"`{path}` cell{'s' if len(ids) > 1 else ''} {', '.join(map(str, sorted(ids)))}"
        for path, ids in cells.items()
    )


def _one(rows: list[Row], where: Source, **match: str) -> Row:
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    if len(found) != 1:
        raise SourceError(f"{where}: expected one row with {match}, found {len(found)}")
    return found[0]


def _ints(rows: list[Row], key: str) -> list[int]:
    return sorted({int(r[key]) for r in rows})


def _numbers(values: Sequence[int | str]) -> str:
    items = [str(v) for v in values]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _clients(count: int) -> str:
    return f"{count} client{'s' if count != 1 else ''}"


# How the serving notebooks flag a cell whose prefill-speed probe moved while it ran
# (`analysis.serving.bench_run.speed_note`; older runs worded it "machine speed changed").
SPEED_FLAG = re.compile(
    r"(?:machine speed changed|speed probe moved) during the cell: prefill ([\d,]+ -> [\d,]+ tok/s)"
)


def honest_label(label: str, repeats: int) -> str:
    """A printed statistic's label with what its interval is: a notebook executed before the
    tables named their intervals by coverage called a bootstrap over 3 repeats a "95 %
    interval"; that label is quoted with the coverage it has (`serving.stats.interval_note`)."""
    if "95 % interval" not in label or repeats >= REPEATS_FOR_95:
        return label
    return (
        f"{label}, as printed; with {repeats} repeats that bootstrap interval spans about their "
        f"range, which holds the median with probability {range_coverage(repeats):.0%} only"
    )


def speed_flags(*rows: Row) -> list[str]:
    """The speed changes the notes of these printed rows flag (`prefill 794 -> 518 tok/s`),
    each once, in order."""
    found: list[str] = []
    for row in rows:
        for match in SPEED_FLAG.finditer(row.get("notes", "")):
            if match.group(1) not in found:
                found.append(match.group(1))
    return found


def flagged(*rows: Row) -> str:
    """`; flagged: the speed probe moved during the cell (prefill 794 -> 518 tok/s), not a
    finding until re-run`, or "" when no row is flagged."""
    flags = speed_flags(*rows)
    if not flags:
        return ""
    return (
        f"; flagged: the speed probe moved during the cell (prefill {', '.join(flags)}), not "
        "a finding until re-run"
    )


# -- hit rates (notebooks 05 and 06) ------------------------------------------------------------


def hit_rates(root: Path) -> str:
    nb05 = Outputs(root, "notebooks/05-multi-vs-single-turn.ipynb")
    nb06 = Outputs(root, "notebooks/06-block-size.ipynb")
    base = tomllib.loads((root / "configs/default.toml").read_text())["base"]
    sizes, sizes_at = nb06.table("trace", "block_size", "first_prefill_rate", "ideal_rate")
    whole: dict[str, tuple[str, str]] = {}
    for trace in ("single", "multi"):
        found, whole_at = nb05.match(
            rf"^{trace}-turn, whole trace \(([\d,]+) requests\): ideal ([\d.]+)%"
        )
        whole[f"{trace}_turn"] = (found.group(1), found.group(2))
    lines = [
        f"Llama 3.2 template, closed loop with {base['concurrency']} clients, no memory "
        "pressure (the roomiest cache of the default grid). The sample is the default grid's "
        f"first {base['limit']} conversations of each trace (`configs/default.toml`); the "
        "whole traces have only an ideal (an infinite cache, replies cached): no committed "
        "notebook runs the engine on them.",
        "",
        "| trace | block size | sample: measured first-prefill | sample: ideal "
        "| whole trace: ideal |",
        "| --- | --- | --- | --- | --- |",
    ]
    for trace in ("single_turn", "multi_turn"):
        for block in ("16", "32"):
            row = _one(sizes, sizes_at, trace=trace, block_size=block)
            requests, ideal = whole[trace]
            whole_cell = f"{ideal} % ({requests} requests)" if block == "16" else "not printed"
            lines.append(
                f"| {trace.replace('_', '-')} | {block} | {pct(row['first_prefill_rate'])} | "
                f"{pct(row['ideal_rate'])} | {whole_cell} |"
            )
    ratio_sample, ratio_at = nb05.match(r"sample, first-prefill: .*? = ([\d.]+)x")
    ratio_whole, _ = nb05.match(r"whole traces, ideal: .*? = ([\d.]+)x")
    concurrency, concurrency_at = nb05.table(
        "concurrency", "num_blocks", "first_prefill_rate", "preemptions"
    )
    free, free_at = nb05.match(r"^free\s+([\d.]+)\s+([\d.]+)")
    recorded, _ = nb05.match(r"^recorded\s+([\d.]+)\s+([\d.]+)")
    calm = [r for r in concurrency if r["preemptions"] == "0"]
    preempted = [r for r in concurrency if r["preemptions"] != "0"]
    rates = sorted({pct(r["first_prefill_rate"]) for r in calm})
    spread = rates[0] if len(rates) == 1 else f"{rates[0]} to {rates[-1]}"
    lines += [
        "",
        f"- Multi-turn against single-turn: {ratio_sample.group(1)}x on the sample, "
        f"{ratio_whole.group(1)}x between the whole traces' ideals ({cite(ratio_at)}).",
        f"- Conversations in flight at {concurrency[0]['num_blocks']} blocks: {spread} with "
        f"{_numbers(_ints(calm, 'concurrency'))} clients (no preemption), then "
        + ", ".join(
            f"{pct(r['first_prefill_rate'])} at {r['concurrency']} ({r['preemptions']} preemptions)"
            for r in preempted
        )
        + f" ({cite(concurrency_at)}).",
        f"- Free-running replies instead of the recorded ones (sample, block 16): "
        f"{pct(free.group(1))} against {pct(recorded.group(1))} ({cite(free_at)}).",
        "",
        f"Source: {cite(sizes_at, whole_at, ratio_at, concurrency_at, free_at)}.",
    ]
    return "\n".join(lines)


# -- the serving runs (notebooks 08, 10, 11 of `make report` and of `make study`) -------------


@dataclass(frozen=True)
class Synthetic:
    """Notebook 08's table of synthetic cells, in either printed form."""

    rows: list[Row]
    at: Source
    repeats: int
    repeats_at: Source

    @classmethod
    def read(cls, outputs: Outputs) -> Synthetic:
        keys = ("mode", "prefix_regime", "concurrency")
        for stat in (READABLE["mean_ttft"], "mean_ttft_s"):
            try:
                rows, at = outputs.table(*keys, stat)
                break
            except SourceError:
                continue
        else:
            raise outputs.missing("a table of the synthetic cells (mode, prefix, clients, TTFT)")
        repeats, repeats_at = outputs.match(r"(\d+) repeats per cell")
        return cls(rows, at, int(repeats.group(1)), repeats_at)

    def row(self, mode: str, prefix: int, clients: int) -> Row:
        match = {"mode": mode, "prefix_regime": str(prefix), "concurrency": str(clients)}
        return _one(self.rows, self.at, **match)

    def stat(self, mode: str, prefix: int, clients: int, name: str) -> Stat:
        return statistic(self.row(mode, prefix, clients), name)

    @property
    def label(self) -> str:
        return statistic_label(self.rows[0], "mean_ttft")

    @property
    def prefixes(self) -> list[int]:
        return _ints(self.rows, "prefix_regime")

    @property
    def clients(self) -> list[int]:
        return _ints(self.rows, "concurrency")


def _load(outputs: Outputs, syn: Synthetic) -> tuple[list[str], list[Source]]:
    """Per client count: requests per repeat, and whether a repeat was one burst."""
    try:
        ran, at = outputs.table("concurrency", "inflight_peak", "requests_per_repeat", "burst")
    except SourceError:
        ran, at = [], syn.at
    lines = []
    for clients in syn.clients:
        rows = [r for r in ran if r["concurrency"] == str(clients)]
        if rows:
            per_repeat = max(int(r["requests_per_repeat"]) for r in rows)
            peak = str(max(int(r["inflight_peak"]) for r in rows))
            burst = any(r["burst"] == "one burst" for r in rows)
        elif all("n_ok" in r for r in syn.rows):  # the older table: requests per cell
            cells = {int(r["n_ok"]) for r in syn.rows if r["concurrency"] == str(clients)}
            per_repeat = max(cells) // syn.repeats
            peak, burst = str(min(per_repeat, clients)), clients > 1 and per_repeat <= clients
        else:
            raise outputs.missing("requests per repeat (requests_per_repeat, or n_ok per cell)")
        if clients == 1:
            how = "one at a time"
        elif burst:
            how = f"sent as one burst: at most {peak} in flight, not {clients}"
        else:
            how = f"{per_repeat / clients:g} per client in turn, at most {peak} in flight"
        lines.append(f"  - {_clients(clients)}: {per_repeat} measured requests per repeat, {how}.")
    return lines, [at]


def _what_ran(folder: str, root: Path) -> list[str]:
    synthetic_nb = Outputs(root, f"{folder}/08-ttft-and-throughput.ipynb")
    syn = Synthetic.read(synthetic_nb)
    calibration, calibration_at = synthetic_nb.match(r"calibration ([\d,.]+) prefill tokens/s")
    load, load_at = _load(synthetic_nb, syn)
    bullets = [
        f"- `{folder}/08`: shared prefixes of {_numbers(syn.prefixes)} tokens, caching on and "
        f"off, {syn.repeats} repeats per cell; the calibration measured "
        f"{calibration.group(1)} prefill tokens/s "
        f"({cite(calibration_at, syn.repeats_at, *load_at)}):",
        *load,
    ]
    conv_nb = Outputs(root, f"{folder}/10-real-conversations-through-the-server.ipynb")
    conv, conv_at = _conversation_table(conv_nb)
    conv_repeats, repeats_at = conv_nb.match(r"(\d+) repeats")
    if all("n_ok" in r for r in conv):
        measured, measured_at = (
            f"{_numbers(_ints(conv, 'n_ok'))} measured requests per mode",
            conv_at,
        )
    else:
        chose, measured_at = conv_nb.match(r"chose (\d+) measured (\w+) per repeat")
        measured = f"{chose.group(1)} measured {chose.group(2)} per repeat"
    bullets.append(
        f"- `{folder}/10`: real ShareGPT conversations, {_numbers(_ints(conv, 'concurrency'))} "
        f"closed-loop clients, {conv_repeats.group(1)} repeats, {measured} "
        f"({cite(repeats_at, measured_at)})."
    )
    engine_nb = Outputs(root, f"{folder}/11-seed-004-engine-comparisons.ipynb")
    batch, batch_at = engine_nb.match(r"(\d+) prompts of (\d+) tokens per batch")
    batches, _ = engine_nb.match(r"timed batches per point.*?: (\d+)")
    bullets.append(
        f"- `{folder}/11` (offline engine): batches of {batch.group(1)} prompts of "
        f"{batch.group(2)} tokens, {batches.group(1)} timed batches per shared fraction "
        f"({cite(batch_at)})."
    )
    return bullets


def report_scale(root: Path) -> str:
    return "\n".join(_what_ran("notebooks", root))


def study_scale(root: Path) -> str:
    return "\n".join(_what_ran(STUDY, root))


def report_overhead(root: Path) -> str:
    outputs = Outputs(root, "notebooks/11-seed-004-engine-comparisons.ipynb")
    zero, verdict, at = _zero_share(outputs)
    return (
        f"`make report`'s run of notebook 11: requests/s on / off at 0 % shared "
        f"{zero.text('')} ({_batches_interval(outputs)}), {verdict} ({cite(*at)})."
    )


def _batches_interval(outputs: Outputs) -> str:
    """What notebook 11's on/off interval is: a bootstrap over a few timed batches per mode."""
    batches, _ = outputs.match(r"timed batches per point.*?: (\d+)")
    return (
        f"a bootstrap interval over {batches.group(1)} timed batches per mode, about their "
        "range, not a 95 % interval"
    )


def study_table(root: Path) -> str:
    syn = Synthetic.read(Outputs(root, f"{STUDY}/08-ttft-and-throughput.ipynb"))
    prefix = max(syn.prefixes)
    lines = [
        f"| {prefix}-token shared prefix | mean TTFT on | mean TTFT off | p95 TTFT on / off "
        "| TPOT on / off | requests/s on / off |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    notes = []
    for clients in syn.clients:
        on = {n: syn.stat("cache", prefix, clients, n) for n in READABLE}
        off = {n: syn.stat("no_cache", prefix, clients, n) for n in READABLE}
        flags = speed_flags(syn.row("cache", prefix, clients), syn.row("no_cache", prefix, clients))
        label = _clients(clients) + (" (flagged)" if flags else "")
        if flags:
            notes.append(f"{_clients(clients)}: prefill {', '.join(flags)}")
        lines.append(
            f"| {label} | {on['mean_ttft'].text()} | {off['mean_ttft'].text()} | "
            f"{on['p95_ttft'].value} / {off['p95_ttft'].value} s | "
            f"{on['mean_tpot'].value} / {off['mean_tpot'].value} s | "
            f"{on['req_s'].value} / {off['req_s'].value} |"
        )
    label = honest_label(syn.label, syn.repeats)
    lines += ["", f"Each value as the notebook prints it ({label}). Source: {cite(syn.at)}."]
    if notes:
        lines[-1] += (
            " Flagged: the prefill-speed probe moved while the row's cells ran ("
            + "; ".join(notes)
            + "); the notebook says to re-run them before quoting them, so they are no finding."
        )
    return "\n".join(lines)


def _tpot_ratio(syn: Synthetic, prefix: int, row: Row) -> str:
    """`18.1159 at 8`, with the cell's speed flag where either mode's row carries one."""
    clients = int(row["concurrency"])
    flags = speed_flags(syn.row("cache", prefix, clients), syn.row("no_cache", prefix, clients))
    shown = f"{row['ratio_off_on']} at {clients}"
    return f"{shown} (flagged: prefill {', '.join(flags)})" if flags else shown


def study_findings(root: Path) -> str:
    synthetic_nb = Outputs(root, f"{STUDY}/08-ttft-and-throughput.ipynb")
    syn = Synthetic.read(synthetic_nb)
    longest, shortest = max(syn.prefixes), min(p for p in syn.prefixes if p > 0)
    top = max(syn.clients)
    bullets = []
    for clients in sorted({1, top}):
        on = syn.stat("cache", shortest, clients, "mean_ttft")
        off = syn.stat("no_cache", shortest, clients, "mean_ttft")
        rows = (syn.row("cache", shortest, clients), syn.row("no_cache", shortest, clients))
        bullets.append(
            f"- {shortest}-token prefix, {_clients(clients)}: mean TTFT {on.text()} on vs "
            f"{off.text()} off ({(off.number - on.number) * 1000:.0f} ms less{flagged(*rows)})."
        )
    target = []
    for mode, word in (("cache", "on"), ("no_cache", "off")):
        fits = [
            (syn.stat(mode, longest, c, "req_s"), c)
            for c in syn.clients
            if syn.stat(mode, longest, c, "p95_ttft").number <= P95_TARGET_S
        ]
        if fits:
            best, clients = max(fits, key=lambda pair: pair[0].number)
            flag = flagged(syn.row(mode, longest, clients))
            target.append(f"caching {word} {best.value} requests/s ({_clients(clients)}{flag})")
        else:
            target.append(f"caching {word}: no cell")
    bullets.append(
        f"- At a p95 TTFT of at most {P95_TARGET_S} s ({longest}-token prefix), the best cell: "
        + ", ".join(target)
        + "."
    )
    tpot, tpot_at = synthetic_nb.table("prefix_regime", "concurrency", "ratio_off_on")
    ratios = [r for r in tpot if r["prefix_regime"] == str(longest)]
    bullets.append(
        f"- TPOT off / on, {longest}-token prefix: "
        + ", ".join(_tpot_ratio(syn, longest, r) for r in ratios)
        + f" clients ({cite(tpot_at)})."
    )
    on0, off0 = syn.stat("cache", 0, top, "mean_ttft"), syn.stat("no_cache", 0, top, "mean_ttft")
    rows0 = (syn.row("cache", 0, top), syn.row("no_cache", 0, top))
    bullets.append(
        f"- No shared prefix, {_clients(top)} (both do the same work): mean TTFT {on0.text()} "
        f"on vs {off0.text()} off; the intervals "
        f"{'overlap' if on0.overlaps(off0) else 'do not overlap'}{flagged(*rows0)}."
    )
    bullets += _anti_patterns(synthetic_nb, syn, longest)
    bullets += _conversations(root)
    bullets += _seed_004(root)
    return "\n".join([*bullets, "", f"Lines that name no cell: {cite(syn.at)}."])


def _anti_patterns(outputs: Outputs, syn: Synthetic, longest: int) -> list[str]:
    hits, hits_at = outputs.table("pattern", "prefix_cache_queries", "prefix_cache_hits")
    for stat in (READABLE["mean_ttft"], "mean_ttft_s"):
        try:
            ttft, ttft_at = outputs.table("pattern", stat)
            break
        except SourceError:
            continue
    else:
        raise outputs.missing("a table of the anti-patterns' TTFT")
    off = syn.stat("no_cache", longest, 1, "mean_ttft")
    bullets = [
        f"- Anti-patterns (caching on, one client, the {longest}-token prefix; "
        f"{cite(hits_at, ttft_at)}), against caching off with one shared prefix, {off.text()}:"
    ]
    for row in hits:
        printed = _one(ttft, ttft_at, pattern=row["pattern"])
        timing = statistic(printed, "mean_ttft")
        hit_tokens, queried = float(row["prefix_cache_hits"]), float(row["prefix_cache_queries"])
        line = (
            f"  - {row['pattern']}: hit rate {pct(row['hit_rate'])} ({hit_tokens:,.0f} of "
            f"{queried:,.0f} prompt tokens), mean TTFT {timing.text()}"
        )
        if row["pattern"].startswith("thrash"):
            side = "overlap" if timing.overlaps(off) else "do not overlap"
            line += f"; its interval and caching off's {side}"
        bullets.append(line + flagged(printed) + ".")
    return bullets


def _conversation_table(outputs: Outputs) -> tuple[list[Row], Source]:
    for stat in (READABLE["mean_ttft"], "mean_ttft_s"):
        try:
            return outputs.table("mode", "concurrency", stat)
        except SourceError:
            continue
    raise outputs.missing("a table of the ShareGPT cells (mode, clients, TTFT)")


def _conversations(root: Path) -> list[str]:
    outputs = Outputs(root, f"{STUDY}/10-real-conversations-through-the-server.ipynb")
    rows, at = _conversation_table(outputs)
    hit, hit_at = outputs.match(
        r"hit rate with caching on \(server counters\): ([\d.]+); ([^:\n]+): ([\d.]+)"
    )
    on, off = _one(rows, at, mode="cache"), _one(rows, at, mode="no_cache")
    repeats = int(outputs.match(r"(\d+) repeats")[0].group(1))
    ttft_on, ttft_off = statistic(on, "mean_ttft"), statistic(off, "mean_ttft")
    req_on, req_off = statistic(on, "req_s"), statistic(off, "req_s")
    per_repeat = ""
    if has(on, "mean TTFT per repeat (s)"):
        per_repeat = (
            f"; mean TTFT per repeat {column(on, 'mean TTFT per repeat (s)')} s on, "
            f"{column(off, 'mean TTFT per repeat (s)')} s off"
        )
    fit, fit_at = outputs.series("predicted_ttft_s", "measured_ttft_s", "fixed_cost_s")
    mixed, mixed_at = outputs.series("eligible_share", "hit_share", "predicted_ttft_s")
    low, high = float(fit["measured_lo_s"]), float(fit["measured_hi_s"])
    inside = low <= float(fit["predicted_ttft_s"]) <= high
    return [
        f"- Real multi-turn conversations, {_clients(int(on['concurrency']))}: server hit rate "
        f"{pct(hit.group(1))} ({hit.group(2)}: {pct(hit.group(3))}; {cite(hit_at)}); mean TTFT "
        f"{ttft_on.text()} on vs {ttft_off.text()} off "
        f"({honest_label(statistic_label(on, 'mean_ttft'), repeats)}); "
        f"requests/s {req_on.text('')} vs {req_off.text('')}{per_repeat} ({cite(at)}).",
        f"- A line fitted per request on the caching-off requests (fixed cost "
        f"{fit['fixed_cost_s']} s) predicts {fit['predicted_ttft_s']} s with caching on, "
        f"measured {fit['measured_ttft_s']} s [{fit['measured_lo_s']}-{fit['measured_hi_s']}]: "
        f"{'inside' if inside else 'outside'} the interval ({cite(fit_at)}).",
        f"- Mixed traffic, eligible share {mixed['eligible_share']}: E[TTFT] = h x TTFT_hit + "
        f"(1 - h) x TTFT_miss with h = {mixed['hit_share']} predicts {mixed['predicted_ttft_s']}"
        f" s, measured {mixed['measured_ttft_s']} s [{mixed['measured_lo_s']}-"
        f"{mixed['measured_hi_s']}] ({cite(mixed_at)}).",
    ]


def _zero_share(outputs: Outputs) -> tuple[Stat, str, list[Source]]:
    """Requests/s on / off at 0 % shared ("1.025 [1.017-1.034]") as notebook 11 printed it, and
    its verdict by today's rule (`analysis.serving.intervals.overhead_verdict`) from the printed
    ratio and the printed caching-off rates of the sweep (the drift between runs), so that a
    notebook executed under an older rule is not quoted with that rule's verdict."""
    found, at = outputs.match(r"on / off at 0 % shared: ([\d.]+) \[([\d.]+)-([\d.]+)\]: (.+)$")
    zero = Stat(found.group(1), found.group(2), found.group(3))
    sweep, sweep_at = outputs.table("fraction", "cache", "no_cache")
    verdict = overhead_verdict(zero.interval, [float(r["no_cache"]) for r in sweep])
    printed = found.group(4).strip().rstrip(".")
    if printed and printed not in verdict and verdict not in printed:
        verdict += (
            f" by today's rule (the notebook, executed under an earlier one, printed "
            f'"{printed}"; `make study` re-runs it)'
        )
    return zero, verdict, [at, sweep_at]


def _seed_004(root: Path) -> list[str]:
    outputs = Outputs(root, f"{STUDY}/11-seed-004-engine-comparisons.ipynb")
    zero, verdict, zero_at = _zero_share(outputs)
    sweep, sweep_at = outputs.table("fraction", "cache", "no_cache", "speedup", "cache_hit_rate")
    full = max(sweep, key=lambda r: float(r["fraction"]))
    return [
        f"- Seed 004's sweep ({len(sweep)} shared fractions, offline engine): requests/s on / "
        f"off at 0 % shared {zero.text('')} ({_batches_interval(outputs)}), {verdict} "
        f"({cite(*zero_at)}); at {float(full['fraction']) * 100:g} % shared {full['cache']} vs "
        f"{full['no_cache']} requests/s, {full['speedup']}x, realized hit rate "
        f"{pct(full['cache_hit_rate'])} ({cite(sweep_at)}).",
    ]


# -- how long a fresh `make test` took ----------------------------------------------------------

TEST_TIMES = "data/external/ci/2026-11-29-ce8afea/make-test.csv"
# The same kind of run with torch and oneDNN told to dispatch as on an AVX2-only CPU
# (`ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`), so that the models ran in float32.
TEST_TIMES_AVX2 = "data/external/ci/2026-11-29-e699efb-avx2/make-test.csv"


def _recorded_rows(root: Path, relative: str, what: str) -> list[dict[str, str]]:
    """The rows of a recorded time table (data/external/ci/), or a one-line error."""
    import csv

    path = root / relative
    if not path.is_file():
        raise SourceError(f"{relative} is missing: copy {what} of a fresh run")
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


REPORT_TIMES = "data/external/ci/2026-11-29-ba84d08/make-report.csv"
# The same kind of run with torch and oneDNN told to dispatch as on an AVX2-only CPU
# (`ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`), so that the models ran in float32.
REPORT_TIMES_AVX2 = "data/external/ci/2026-11-29-413d510-avx2/make-report.csv"


def report_times(root: Path) -> str:
    """A recorded fresh `make report`: its stages and slowest notebooks, from the table it
    printed at its end (`reports/report-times.csv`, copied here)."""
    return _report_times(root, REPORT_TIMES, "A fresh `make report` (a clone with no `.venv`)")


def report_times_avx2(root: Path) -> str:
    """`report_times` for the run told to dispatch as an AVX2-only CPU."""
    return _report_times(
        root,
        REPORT_TIMES_AVX2,
        "The same, told to dispatch as an AVX2-only CPU (`ATEN_CPU_CAPABILITY=avx2 "
        "ONEDNN_MAX_CPU_ISA=AVX2`: the local models in float32)",
    )


def _report_times(root: Path, relative: str, run: str) -> str:
    from analysis.report.timings import OUTSIDE, format_seconds

    rows = _recorded_rows(root, relative, "reports/report-times.csv")
    total = next((float(r["seconds"]) for r in rows if r["section"] == "total"), None)
    if total is None:
        raise SourceError(f"{relative} has no total: it was not a whole `make report`")
    stages = {r["name"]: float(r["seconds"]) for r in rows if r["section"] == "stage"}
    # the notebooks' wall time: the ones run alone and the runs of them side by side
    notebooks_wall = sum(v for k, v in stages.items() if k.startswith("notebook"))
    notebooks = {
        r["name"]: float(r["seconds"])
        for r in rows
        if r["name"].startswith("notebook ") and r["section"] in ("stage", "side by side")
    }
    slowest = sorted(notebooks.items(), key=lambda item: -item[1])[:4]
    named = ", ".join(
        f"{name.split()[1].split('-')[0]} {format_seconds(seconds)}" for name, seconds in slowest
    )
    # "notebooks 09, 13-17, 2 at a time" -> "09, 13-17"
    runs = [
        k.rsplit(",", 1)[0].removeprefix("notebooks ")
        for k in stages
        if k.startswith("notebooks ") and k.endswith(" at a time")
    ]
    count = {1: "one run", 2: "two runs", 3: "three runs"}.get(len(runs), f"{len(runs)} runs")
    together = f" ({count} of them side by side: {'; '.join(runs)})" if runs else ""
    parts = [
        f"set-up {format_seconds(stages['environment set-up'])}",
        f"traces {format_seconds(stages['traces'])}",
        f"sweep {format_seconds(stages['sweep'])}",
        f"{len(notebooks)} notebooks {format_seconds(notebooks_wall)}{together}",
    ]
    if OUTSIDE in stages:  # recorded since the total is the wall time
        parts.append(f"outside the stages {format_seconds(stages[OUTSIDE])}")
    first = rows[0]
    return (
        f"{run}, recorded {first['recorded'][:10]} on {first['machine']} with {first['cores']} "
        f"cores, took {format_seconds(total)}: {', '.join(parts)}. Its slowest notebooks: "
        f"{named} (`{relative}`, the table `make report` prints at its end).\n"
    )


# -- what `make coverage` measured ------------------------------------------------------------

COVERAGE = "data/external/ci/2026-11-29-5b1eadb/coverage.csv"


def test_coverage(root: Path) -> str:
    """The line coverage of a recorded `make coverage` (its `reports/coverage.csv`, copied)."""
    from analysis.report.coverage import total_row

    rows = _recorded_rows(root, COVERAGE, "reports/coverage.csv of `make coverage`")
    total = total_row(rows, root / COVERAGE)
    commit = Path(COVERAGE).parent.name.rsplit("-", 1)[-1]
    return (
        f"`make coverage` at commit {commit} ran {float(total['percent_covered']):.2f} % of the "
        f"{int(total['statements']):,} statements of `src/analysis` "
        f"({int(total['missing']):,} never ran; every file in `{COVERAGE}`).\n"
    )


def test_times(root: Path) -> str:
    """A recorded fresh `bash .ci/run`: its phases and slowest notebooks, from the CSV that
    `python -m analysis durations` wrote at its end (copied here from `reports/`)."""
    return _test_times(root, TEST_TIMES, "A fresh `bash .ci/run` (a clone with no `.venv`)")


def test_times_avx2(root: Path) -> str:
    """`test_times` for the run told to dispatch as an AVX2-only CPU."""
    return _test_times(
        root,
        TEST_TIMES_AVX2,
        "The same, told to dispatch as an AVX2-only CPU (the local models in float32)",
    )


def _test_times(root: Path, relative: str, run: str) -> str:
    from analysis.report.timings import format_seconds

    rows = _recorded_rows(root, relative, "reports/test-times.csv")
    seconds = {(r["section"], r["name"]): float(r["seconds"]) for r in rows}
    if ("total", "make test") not in seconds:
        raise SourceError(f"{relative} has no total: it was not a run of .ci/run")
    phases = [
        f"{name} {format_seconds(seconds[('phase', name)])}"
        for name in ("set-up and ruff", "pytest", "nbval")
        if ("phase", name) in seconds
    ]
    notebooks = [r for r in rows if r["section"] == "notebook"][:4]
    slowest = ", ".join(
        f"{r['name'].split('-')[0]} {format_seconds(float(r['seconds']))}" for r in notebooks
    )
    first = rows[0]
    return (
        f"{run}, recorded {first['recorded'][:10]} on {first['machine']} with {first['cores']} "
        f"cores, took {format_seconds(seconds[('total', 'make test')])}: {', '.join(phases)}. "
        f"Its slowest notebooks under nbval: {slowest} (`{relative}`, the table `make test` "
        "prints at its end).\n"
    )


# -- what `gpu-check --served` measured on a GPU -------------------------------------------

GPU_SERVED = "data/external/h200/2026-11-29/served"
SERVED_STATISTICS = {
    "p50_ttft": "p50 TTFT",
    "p90_ttft": "p90 TTFT",
    "mean_tpot": "mean TPOT",
    "throughput_req": "throughput",
}


def gpu_served(root: Path) -> str:
    """A recorded `gpu-check --served` on a GPU: replay's counts against the server's, and its
    held-out time errors, from the tables the command wrote (copied under data/external/)."""
    import json

    import pandas as pd

    folder = root / GPU_SERVED
    if not (folder / "errors.csv").is_file():
        raise SourceError(f"{GPU_SERVED}/errors.csv is missing: copy a `gpu-check --served` run")
    manifest = json.loads((folder / "manifest.json").read_text())
    errors = pd.read_csv(folder / "errors.csv")
    checks = pd.read_csv(folder / "checks.csv")
    cells = pd.read_csv(folder / "cells.csv")
    held = errors[errors["family"] == "held out"]
    met = held["met_by"] != "missed"
    counted = checks[checks["claim"].str.startswith("requests whose replayed cached tokens")]
    exact = (
        "equal the server's for every measured request"
        if bool(counted["holds"].all())
        else f"differ from the server's for {counted['measured'].iloc[0]} requests"
    )
    medians = held.assign(size=held["error"].abs()).groupby("statistic")["size"].median()
    worst = held.loc[held["error"].abs().idxmax()]
    breakdown = pd.read_csv(folder / "ttft_breakdown.csv").set_index(
        ["mode", "prefix_regime", "concurrency"]
    )
    frontend = breakdown.loc[
        (worst["mode"], worst["prefix_regime"], worst["concurrency"]), "frontend_s"
    ]
    terms = pd.read_csv(folder / "terms.csv").set_index("term")["value"]
    requests = int(cells["n_ok"].sum())
    settings = manifest["engine_settings"]
    machine = manifest["machine"]
    statistics = ", ".join(
        f"{SERVED_STATISTICS[name]} {medians[name]:.0%}" for name in SERVED_STATISTICS
    )
    return (
        f"On an {machine.get('gpu')} (driver {machine.get('driver')}, vLLM "
        f"{machine.get('vllm')}), `gpu-check --served` ran the `{manifest['profile']}` study "
        f"set on the {settings['model']} shape (random weights), shared prefixes "
        f"{_numbers(sorted(set(cells['prefix_regime'])))} tokens, "
        f"{_numbers(sorted(set(cells['concurrency'])))} clients, "
        f"{int(cells['repeats'].min())} repeats per cell, {requests:,} measured requests. "
        f"Replay's cached tokens {exact}. "
        f"Time, on the clock measured on the engine as the servers ran it: "
        f"{int(met.sum())} of {len(held)} held-out errors within the goal or the server's own "
        f"spread; median absolute error per statistic {statistics}; the largest, "
        f"{SERVED_STATISTICS[worst['statistic']]} with {_clients(int(worst['concurrency']))}, "
        f"prefix {worst['prefix_regime']}, caching {'on' if worst['mode'] == 'cache' else 'off'}: "
        f"{worst['error']:+.0%}, where the time outside the engine core's queue and prefill "
        f"(the server's front end, and the wait for the step under way) was "
        f"{frontend * 1e3:.0f} ms per request against the {terms['frontend_s'] * 1e3:.0f} ms "
        f"replay adds, measured at one client (`{GPU_SERVED}/`; notebook 17 shows each cell).\n"
    )

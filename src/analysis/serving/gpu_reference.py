"""The project's H100 prefill measurements (`data/external/h100/`), for comparing a CPU run with
a GPU's where no GPU is at hand. Quoted, never re-measured by the run that shows them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.platform.paths import data_dir

PREFIX = 2048  # the shared prefix the comparison quotes


def reference_path() -> Path:
    return data_dir() / "external" / "h100" / "prefill-on-vs-off.csv"


def load_reference(path: Path | None = None) -> pd.DataFrame:
    """One row per (model, run, prefix, requests at once), with the speed-up off / on."""
    table = pd.read_csv(path or reference_path())
    return table.assign(speedup=table["off_ms"] / table["on_ms"])


def _rows(table: pd.DataFrame, model: str) -> pd.DataFrame:
    rows = table[(table["model"] == model) & (table["prefix_tokens"] == PREFIX)]
    if rows.empty:
        raise ValueError(f"no {model} row at a {PREFIX}-token prefix in {reference_path()}")
    return rows.sort_values("requests_at_once")


def gpu_quote(table: pd.DataFrame) -> str:
    """A blockquote of what caching buys on an H100, with the speed-ups computed from the
    recorded times (so they carry those times' rounding)."""
    big = _rows(table, "Llama-3.1-8B shape")
    small = _rows(table, "Llama-3.2-1B shape")
    tiny = _rows(table, "prefill-llama (155 M)").iloc[0]
    big_text = ", ".join(
        f"{r.on_ms:g} vs {r.off_ms:g} ms for {_requests(r.requests_at_once)} ({r.speedup:.1f}x)"
        for r in big.itertuples()
    )
    return (
        "> Measured by this project on one NVIDIA H100 80GB (CUDA vLLM 0.32.0, random-weight "
        'models built with `load_format="dummy"`; `data/external/h100/`), not on this machine '
        f"and not by this run, and quoted here for comparison: with a {PREFIX}-token shared "
        "prefix, offline prefill of a Llama-3.1-8B-shaped model took, caching on against off, "
        f"{big_text}; a Llama-3.2-1B shape gave only {small['speedup'].min():.1f}x-"
        f"{small['speedup'].max():.1f}x; and this project's ~155 M `prefill-llama` through the "
        f"server gave {tiny.on_ms / 1000:.3f} vs {tiny.off_ms / 1000:.3f} s "
        f"({tiny.speedup:.1f}x), because on an H100 its whole {PREFIX}-token prefill takes a few "
        "milliseconds, the same order as the fixed costs."
    )


def _requests(count: int) -> str:
    return "one request" if count == 1 else f"{count} at once"

"""Notebook 05's reading of multi- against single-turn reuse, its numbers taken from the rates
it is given."""

from __future__ import annotations


def multi_vs_single_reading(
    sample_single: float, whole_single: float, whole_multi: float, sample: str
) -> str:
    """Why multi-turn traffic reuses more, with the single-turn rate that keeps the ratio finite:
    `sample_single` is the first-prefill rate of the `sample` ("first 500 conversations"), the
    `whole_*` rates whole-trace ideals."""
    return (
        "**Reading.** Multi-turn traffic reuses far more than single-turn traffic for one reason: "
        "every later turn's prompt *is* the previous turn's prompt and reply, plus one message. "
        "The measured rate sits at its ideal when nothing is evicted; it is below the ideal only "
        "by what memory pressure or interleaving costs. Single-turn requests share the chat "
        "template's system block (the opening block of every prompt with the Llama 3.2 "
        "template) and the repeated questions ShareGPT contains: "
        f"{sample_single:.1%} on the sample ({sample}), {whole_single:.1%} "
        f"ideal on the whole single-turn trace against {whole_multi:.1%} for multi-turn, "
        f"{whole_multi / whole_single:.1f}x, not the hundreds a near-zero single-turn "
        "denominator would suggest (under the Llama 3.0 template, which has no system block, "
        "the single-turn rate is far lower; notebook 09 compares the templates). Free-running "
        "replies lose the reply's blocks: the next turn still hits its earlier prompt, but "
        "re-prefills the reply. The seed's multi-turn rate came from its own regime (the "
        "requests that survived its filter and its V0 engine, one conversation at a time, free "
        "replies): notebook 09 runs it and prints the seed's numbers next to ours."
    )

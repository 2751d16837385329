"""Time building both request traces from the whole packaged ShareGPT data set.

The builder tokenises each distinct message once and assembles prompts from those ids. The
naive way tokenises every turn's whole prompt text (history included): its cost grows with the
square of the turns. Both are timed here with the same encoder (same threads, same cache) on a
random sample of conversations, and the naive time is extrapolated to the whole set by prompt
tokens, so the ratio printed is measured in this run.
"""

from __future__ import annotations

import os
import random
import time

NAIVE_SAMPLE = 1000  # conversations tokenised both ways for the ratio


def main() -> dict[str, float]:
    from analysis.data.chat_template import render
    from analysis.data.sharegpt import load_conversations
    from analysis.data.tokenizer import encode_texts, load_tokenizer
    from analysis.data.traces import TraceOptions, build_traces

    print(f"usable CPUs: {len(os.sched_getaffinity(0))}, load average: {_load()}")
    tokenizer = load_tokenizer()
    wall, cpu = time.perf_counter(), time.process_time()
    conversations, report = load_conversations(progress=False)
    loaded = time.perf_counter()
    trace_set = build_traces(conversations, TraceOptions(), tokenizer, progress=False)
    built, cpu_used = time.perf_counter(), time.process_time() - cpu
    multi, single = trace_set.counts["multi_turn"], trace_set.counts["single_turn"]
    s = trace_set.seconds
    print(report.summary())
    print(trace_set.summary())
    print(
        f"load {loaded - wall:.1f} s + build both traces {built - loaded:.1f} s "
        f"(plan {s['plan']:.1f}, tokenize {s['tokenize']:.1f}, assemble {s['assemble']:.1f}) "
        f"= {built - wall:.1f} s wall, {cpu_used:.1f} s CPU; load average now {_load()}"
    )
    print(
        f"tokenised {trace_set.counts['distinct_message_tokens']:,} tokens of "
        f"{trace_set.counts['distinct_messages']:,} distinct messages for "
        f"{multi['prompt_tokens'] + multi['prompt_tokens_excluded']:,} multi-turn prompt tokens "
        f"({multi['requests_candidate']:,} requests; {multi['requests_excluded']:,} excluded) "
        f"and {single['prompt_tokens']:,} single-turn prompt tokens"
    )

    sample = random.Random(0).sample(conversations, min(NAIVE_SAMPLE, len(conversations)))
    prompts = [
        render(_chat(conversation, position + 1))
        for conversation in sample
        for position, message in enumerate(conversation.messages)
        if message.role == "user"
    ]
    started = time.perf_counter()
    naive = encode_texts(tokenizer, prompts, progress=False)
    naive_seconds = time.perf_counter() - started
    started = time.perf_counter()
    options = TraceOptions(max_model_len=1 << 30)
    sample_set = build_traces(sample, options, tokenizer, progress=False)
    message_seconds = time.perf_counter() - started
    naive_tokens = int(naive.values.size)
    assert naive_tokens == sample_set.counts["multi_turn"]["prompt_tokens"]
    whole_tokens = multi["prompt_tokens"] + multi["prompt_tokens_excluded"]
    naive_whole = naive_seconds * whole_tokens / naive_tokens
    print(
        f"sample of {len(sample):,} conversations ({len(prompts):,} requests, "
        f"{naive_tokens:,} prompt tokens): tokenising whole prompts {naive_seconds:.1f} s "
        f"(replies not even tokenised), message-level build of both traces with replies "
        f"{message_seconds:.1f} s: {naive_seconds / message_seconds:.1f}x"
    )
    print(
        f"whole data set: naive tokenisation extrapolated {naive_whole:.0f} s vs message-level "
        f"build {built - loaded:.1f} s: {naive_whole / (built - loaded):.1f}x faster"
    )
    return {"naive / message-level tokenising (sample)": naive_seconds / message_seconds}


def _chat(conversation, upto: int) -> list[dict[str, str]]:
    messages = [{"role": m.role, "content": m.text} for m in conversation.messages[:upto]]
    if conversation.system is not None:
        messages.insert(0, {"role": "system", "content": conversation.system})
    return messages


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()

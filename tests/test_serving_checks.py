"""The serving notebooks' checks tables hold on consistent inputs and fail on a wrong one:
each check is shown failing on a deliberately broken copy. Fast, no server."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.serving import checks as serving_checks
from analysis.serving import writeup
from analysis.serving.intervals import Interval
from analysis.serving.study import StudyParams

SUFFIX, BLOCK = 24, 32


def synthetic_table() -> pd.DataFrame:
    rows = []
    for prefix in (0, 256, 1024):
        for clients in (1, 4):
            for mode in ("cache", "no_cache"):
                n, prompt = 36, prefix + SUFFIX
                on = mode == "cache"
                rows.append(
                    {
                        "mode": mode,
                        "prefix_regime": str(prefix),
                        "concurrency": clients,
                        "n_ok": n,
                        "prompt_tokens": float(n * prompt),
                        "prefix_cache_queries": float(n * prompt) if on else 0.0,
                        "prefix_cache_hits": float(n * (prefix // BLOCK) * BLOCK) if on else 0.0,
                        "prompt_tokens_cached": float(n * prefix) if on else 0.0,
                        "burst": False,
                        "inflight_peak": clients,
                        "n_timeout": 0,
                        "n_error": 0,
                        "n_not_sent": 0,
                    }
                )
    return pd.DataFrame(rows)


def failing(checks) -> list[str]:
    return [c.claim for c in checks.items if not c.holds]


def test_synthetic_checks_hold_and_each_fails_on_a_wrong_cell():
    table = synthetic_table()
    assert failing(serving_checks.synthetic_checks(table, SUFFIX, BLOCK)) == []
    first_off = table.index[table["mode"] == "no_cache"][0]
    broken = {
        "caching off: no prompt token": lambda t: t.__setitem__(
            "prefix_cache_hits", t["prefix_cache_hits"].where(t.index != first_off, 32.0)
        ),
        "caching on: hits": lambda t: t.__setitem__(
            "prefix_cache_hits",
            t["prefix_cache_hits"].where(t["mode"] != "cache", t["prefix_cache_hits"] + 32),
        ),
        "the same requests": lambda t: t.__setitem__(
            "n_ok", t["n_ok"].where(t["mode"] != "no_cache", t["n_ok"] - 1)
        ),
        "every cell a steady state": lambda t: t.__setitem__("burst", [True] + [False] * 11),
        "no request timed out": lambda t: t.__setitem__("n_timeout", [1] + [0] * 11),
    }
    for claim, breaks in broken.items():
        wrong = table.copy()
        breaks(wrong)
        fails = failing(serving_checks.synthetic_checks(wrong, SUFFIX, BLOCK))
        assert any(f.startswith(claim) for f in fails), (claim, fails)


def test_conversation_checks_fail_on_different_requests_a_hit_when_off_or_a_wrong_rate():
    requests = pd.DataFrame(
        {
            "mode": ["cache"] * 3 + ["no_cache"] * 3,
            "request_id": ["a", "b", "c"] * 2,
            "warmup": [False] * 6,
            "cached_tokens": [0, 32, 64, 0, 0, 0],
        }
    )
    table = pd.DataFrame(
        {
            "mode": ["cache", "no_cache"],
            "hit_rate": [0.414, math.nan],
            "predicted_hit_rate": [0.4141, 0.4141],
            "n_timeout": [0, 0],
            "n_error": [0, 0],
            "n_not_sent": [0, 0],
        }
    )
    assert failing(serving_checks.conversation_checks(table, requests)) == []
    other = requests.copy()
    other.loc[5, "request_id"] = "d"
    assert failing(serving_checks.conversation_checks(table, other))[0].startswith("the same")
    hit = requests.copy()
    hit.loc[4, "cached_tokens"] = 32
    assert failing(serving_checks.conversation_checks(table, hit))[0].startswith("caching off")
    rate = table.copy()
    rate.loc[0, "hit_rate"] = 0.5
    assert failing(serving_checks.conversation_checks(rate, requests))[0].startswith("server's")


def sweep_rows() -> pd.DataFrame:
    rows = []
    for fraction in (0.0, 0.1, 0.5, 1.0):
        shared = round(fraction * 1000)
        for mode in ("cache", "no_cache"):
            for repeat in (0, 1):
                cached = 3 * (min(shared, 999) // BLOCK) * BLOCK if mode == "cache" else 0
                rows.append(
                    {
                        "experiment": "sweep",
                        "mode": mode,
                        "fraction": fraction,
                        "repeat": repeat,
                        "shared_tokens": shared,
                        "cached_tokens": cached,
                        "hit_rate": cached / 4000,
                    }
                )
    return pd.DataFrame(rows)


def test_sweep_checks_fail_on_a_hit_when_off_a_wrong_count_a_falling_rate_or_a_short_trie():
    kwargs = {"num_prompts": 4, "input_len": 1000, "block_size": BLOCK}
    lookups = [
        {"kind": "radix", "matched_tokens": 160},
        {"kind": "blockhash", "matched_tokens": 154},
    ]
    raw = sweep_rows()
    assert failing(serving_checks.sweep_checks(raw, lookups=lookups, **kwargs)) == []
    off = raw.copy()
    off.loc[off["mode"] == "no_cache", "cached_tokens"] = 32
    assert failing(serving_checks.sweep_checks(off, **kwargs))[0].startswith("caching off")
    count = raw.copy()
    count.loc[0, "cached_tokens"] = 32  # fraction 0 cannot hit
    assert failing(serving_checks.sweep_checks(count, **kwargs))[0].startswith("caching on")
    falling = raw.copy()
    top = (falling["fraction"] == 1.0) & (falling["mode"] == "cache")
    falling.loc[top, "hit_rate"] = 0.0
    assert "the realized hit rate never falls" in "".join(
        failing(serving_checks.sweep_checks(falling, **kwargs))
    )
    short = [{"kind": "radix", "matched_tokens": 150}, {"kind": "blockhash", "matched_tokens": 154}]
    assert failing(serving_checks.sweep_checks(raw, lookups=short, **kwargs))[0].startswith(
        "token trie"
    )


def facts(speed_notes: dict | None = None) -> writeup.Facts:
    study = StudyParams(prefixes=(0, 256, 1024), concurrency=(1, 4))
    f = writeup.Facts(study)
    for mode in ("cache", "no_cache"):
        for prefix in study.prefixes:
            for c in study.concurrency:
                value = 0.1 if mode == "cache" and prefix else 1.0
                f.ttft[(mode, prefix, c)] = Interval(value, value * 0.9, value * 1.1)
                f.tpot[(mode, prefix, c)] = Interval(0.03, 0.029, 0.031)
                f.req_s[(mode, prefix, c)] = Interval(5.0, 4.5, 5.5)
    f.sharegpt = {"cache": {}, "no_cache": {}}
    f.dilution = [{}]
    f.sweep = pd.DataFrame({"fraction": [0.0]})
    f.speed_notes = speed_notes or {}
    return f


def test_decision_checks_fail_when_a_flagged_cell_loses_its_flag_or_an_input_is_missing():
    note = "machine speed changed during the cell: prefill 1,076 -> 342 tok/s"
    both = {("cache", 1024, 4): note, ("cache", 1024, 1): note}
    for f in (facts(), facts({("cache", 1024, 4): note}), facts(both)):
        markdown = "\n".join(["\n".join(writeup.cell_lines(f)), writeup.pm_sentence(f)])
        assert failing(serving_checks.decision_checks(f, markdown)) == []
    flagged = facts(both)
    cells = "\n".join(writeup.cell_lines(flagged)).replace(note, "")
    fails = failing(
        serving_checks.decision_checks(flagged, cells + "\n" + writeup.pm_sentence(flagged))
    )
    assert any(f.startswith("every flagged cell") for f in fails)
    bare_pm = writeup.pm_sentence(flagged).replace("flagged", "")
    fails = failing(
        serving_checks.decision_checks(
            flagged, "\n".join(writeup.cell_lines(flagged)) + "\n" + bare_pm
        )
    )
    assert any(f.startswith("the PM sentence") for f in fails)
    missing = facts()
    del missing.ttft[("no_cache", 256, 4)]
    fails = failing(serving_checks.decision_checks(missing, writeup.pm_sentence(missing)))
    assert any(f.startswith("every synthetic cell") for f in fails)


def test_the_pm_sentence_prefers_an_unflagged_cell_and_flags_otherwise():
    note = "machine speed changed during the cell: prefill 1,076 -> 342 tok/s"
    assert "4 clients)" in writeup.pm_sentence(facts())
    one = writeup.pm_sentence(facts({("no_cache", 1024, 4): note}))
    assert "1 client)" in one and "flagged" not in one
    both = writeup.pm_sentence(facts({("cache", 1024, 4): note, ("no_cache", 1024, 1): note}))
    assert "flagged" in both


@pytest.mark.parametrize("shared, expected", [(0, 0), (100, 96), (256, 256), (1000, 992)])
def test_shared_block_tokens_are_full_blocks_and_never_the_last_token(shared, expected):
    assert serving_checks.shared_block_tokens(shared, 1000, BLOCK) == expected


def test_seed_003s_short_prefix_claim_keeps_its_condition_and_is_not_tested():
    f = facts()
    f.sharegpt, f.dilution, f.sweep = {}, [], pd.DataFrame()
    claims = writeup.claims_table(f).set_index("claim")
    (row,) = [c for c in claims.index if c.startswith("003: short prefix")]
    assert "large suffix or long generation" in row
    assert claims.loc[row, "verdict"].startswith("not tested: the seed's condition")
    assert "suffix 24 tokens" in claims.loc[row, "measured"]


def test_seed_003s_short_prefix_claim_is_not_tested_when_no_short_prefix_ran():
    f = facts()
    f.study = StudyParams(prefixes=(0, 1024), concurrency=(1, 4))
    f.sharegpt, f.dilution, f.sweep = {}, [], pd.DataFrame()
    claims = writeup.claims_table(f).set_index("claim")
    (row,) = [c for c in claims.index if c.startswith("003: short prefix")]
    assert claims.loc[row, "measured"].startswith("no prefix of 256 tokens or fewer measured")
    assert claims.loc[row, "verdict"].startswith("not tested: neither the seed's condition")


def test_replay_predicts_the_prefixes_between_those_the_server_measured():
    from analysis.serving import study

    cpu = study.params("cpu")
    assert cpu.prefixes == (0, 1024) and study.params("cpu-study").prefixes == (0, 256, 1024)
    assert study.predicted_prefixes(cpu) == [0, 256, 512, 1024]
    assert study.unmeasured_prefixes(cpu) == [256, 512]
    assert study.unmeasured_prefixes(study.params("gpu")) == []


def test_the_rule_line_names_the_flagged_cells_it_rests_on():
    note = "machine speed changed during the cell: prefill 1,076 -> 342 tok/s"
    assert "flagged" not in writeup._rule_line(facts())
    line = writeup._rule_line(facts({("no_cache", 256, 4): note}))
    assert (
        "was 256 tokens" in line
        and "flagged for a machine-speed change (256 tokens, 4 clients)" in line
    )


def conversation_facts(note: str) -> writeup.Facts:
    f = facts()
    f.dilution, f.sweep = [], pd.DataFrame()
    value = Interval(0.3, 0.27, 0.35)
    for mode in ("cache", "no_cache"):
        f.sharegpt[mode] = {
            key: value for key in ("ttft", "p95_ttft", "tpot", "first_turn", "later_turns")
        } | {
            "req_s": Interval(7.4, 7.0, 7.8),
            "hit_rate": 0.41,
            "free_running_ideal": 0.41,
            "odd_repeats": [],
            "speed_note": note if mode == "cache" else "",
        }
    return f


def test_the_conversation_lines_carry_the_sharegpt_cells_flag_and_the_check_fails_without_it():
    note = "speed probe moved during the cell: prefill 9,222 -> 2,424 tok/s"
    flagged = conversation_facts(note)
    line = writeup._sharegpt_line(flagged)
    assert "flagged: the prefill-speed probe moved while caching on ran" in line
    assert "flagged" not in writeup._sharegpt_line(conversation_facts(""))
    markdown = "\n".join([*writeup.cell_lines(flagged), line, writeup.pm_sentence(flagged)])
    holds = failing(serving_checks.decision_checks(flagged, markdown))
    assert not any(f.startswith(("the conversation lines", "every flagged")) for f in holds)
    bare = markdown.replace(writeup.sharegpt_flag(flagged), "")
    fails = failing(serving_checks.decision_checks(flagged, bare))
    assert any(f.startswith("the conversation lines") for f in fails)
    claims = writeup.claims_table(flagged).set_index("claim")
    assert (
        "flagged"
        in claims.loc["003: real chat traffic (session trunk reuse) lowers TTFT", "verdict"]
    )


def test_the_tpot_claim_and_a_sections_table_carry_their_flags():
    note = "speed probe moved during the cell: prefill 1,076 -> 342 tok/s"
    f = facts({("no_cache", 1024, 4): note})
    f.sharegpt, f.dilution, f.sweep = {}, [], pd.DataFrame()
    claims = writeup.claims_table(f).set_index("claim")
    assert "flagged" in claims.loc["004: caching does not speed up decoding (TPOT)", "verdict"]
    clean = facts()
    clean.sharegpt, clean.dilution, clean.sweep = {}, [], pd.DataFrame()
    tpot = writeup.claims_table(clean).set_index("claim")
    assert "flagged" not in tpot.loc["004: caching does not speed up decoding (TPOT)", "verdict"]
    table = pd.DataFrame({"mode": ["cache", "no_cache"], "speed_note": ["", note]})
    assert "caching off ran" in writeup.table_flag(table)
    assert writeup.table_flag(table.assign(speed_note="")) == ""


def test_anti_pattern_checks_hold_on_the_misses_a_warm_cache_gives_and_fail_otherwise():
    from analysis.serving.loadgen import new_prefixes

    assert [new_prefixes(16), new_prefixes(16, 4), new_prefixes(16, 1, 4)] == [0, 3, 3]
    assert new_prefixes(16, 4, 8) == 7  # two versions of 4 variants, less the warmed one
    prompt = 1024 + SUFFIX
    patterns = pd.DataFrame(
        {
            "pattern": ["one shared prefix", "4 distinct prefixes", "thrash: 43 distinct"],
            "prefix_regime": ["1024"] * 3,
            "repeats": [3, 3, 3],
            "n_ok": [48, 48, 258],
            "new_prefixes": [0, 3, None],
            "prefix_cache_hits": [48 * 1024, 39 * 1024, 3 * 1024],
            "prefix_cache_queries": [48 * prompt, 48 * prompt, 258 * prompt],
            "n_timeout": [0, 0, 0],
            "n_error": [0, 0, 0],
            "n_not_sent": [0, 0, 0],
        }
    )
    assert failing(serving_checks.anti_pattern_checks(patterns, SUFFIX, BLOCK)) == []
    wrong = patterns.assign(prefix_cache_hits=[48 * 1024, 40 * 1024, 0])  # one miss too few
    assert failing(serving_checks.anti_pattern_checks(wrong, SUFFIX, BLOCK))[0].startswith(
        "anti-patterns: each new prefix misses once"
    )

"""Metrics: what a run's tables and a trace say about prefix caching.

`hitrates` (every hit rate, in tokens, from a `RunResult`), `bounds` (ideal, LRU and Belady
bounds from a trace alone), `prefix_match` (radix tree vs vLLM's block hashes, timed),
`oracles` (independent re-computations for the notebooks' checks tables).
"""

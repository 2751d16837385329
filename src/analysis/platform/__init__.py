"""Platform: what every stage stands on, and nothing about prefix caching.

`paths` (where things live, from the repository root), `errors` (the user-facing errors, one
line each), `manifest` (atomic writes, locks, JSON/Parquet, versions and git commit),
`progress` (bars only on a terminal), `hardware` (CPU features, cores, the dtype the machine
computes well), `vllm_compat` (workarounds for vLLM bugs), `engine_logs` (vLLM's start-up
chatter to a log file), `writable` (an output folder probed before the work that fills it),
`processes` (children that end with their parent: parent-death signal, process-group guard).
"""

"""Data: from ShareGPT (or a block-hash production trace) to request traces an engine replays.

`sharegpt` (loading, every skip and repair counted), `tokenizer` (the packaged Llama 3.2
tokenizer or any tokenizer.json), `chat_template` (Llama 3.x templates), `traces` (multi- and
single-turn traces in Parquet, with their manifest), `blockhash` (Mooncake-style traces),
`experiments` (small workloads of one experiment each), `describe` (tables about a data set).
"""

"""One module per CLI command, each with `configure(parser)` and `main(args) -> int`.

Command modules import their heavy dependencies inside `main`, so `--help` stays fast.
"""

"""The user-facing errors of the package, in one place, so the core never depends on its CLI.

Each is a failure the user can fix (a missing or malformed input, a configuration that cannot
run): its message is one line that names the input and says what to do. `python -m analysis`
catches `AnalysisError` and prints that line (exit status 2, no traceback); notebooks and
library callers see the same exception. Errors that are also `ValueError`s stay so, for
callers that caught them by that name before they moved here.
"""

from __future__ import annotations


class AnalysisError(Exception):
    """A user-facing failure: one line naming the bad input and the fix."""


class UsageError(AnalysisError):
    """A command-line argument that cannot be used (raised by the command modules)."""


class ShareGPTSourceError(AnalysisError):
    """A ShareGPT source that cannot be read, or that yields no usable conversation."""


class TokenizerUnavailable(AnalysisError):
    """A tokenizer that cannot be found or fetched."""


class TraceError(AnalysisError):
    """A trace that cannot be built, read or trusted (empty, wrong types, unknown token ids)."""


class ConfigError(AnalysisError, ValueError):
    """An engine configuration that cannot run; says what to change."""


class GridError(AnalysisError, ValueError):
    """A sweep grid file that cannot be read or expanded."""


class BlockHashError(AnalysisError, ValueError):
    """A block-hash trace that cannot be used at all (missing file, no valid line)."""


class BoundsError(AnalysisError, ValueError):
    """Input the bounds cannot be computed from (bad block size, malformed token ids)."""


class WorkloadError(AnalysisError, ValueError):
    """A serving workload that cannot be built from the given inputs."""


class ServerStartError(AnalysisError, RuntimeError):
    """A server that exited or never became ready; the message ends with its log's last lines."""


class ServerLostError(AnalysisError, RuntimeError):
    """A server that exited or stopped answering in the middle of a benchmark."""


class ResultError(AnalysisError):
    """A result folder that exists but cannot be read (a corrupt or foreign table)."""


class NotebookError(AnalysisError):
    """A notebook that stopped before its end (a cell's error, a dead kernel): which one,
    where and why; `reason` is the part after the notebook's name."""

    def __init__(self, notebook: str, reason: str) -> None:
        super().__init__(f"{notebook}: {reason}")
        self.reason = reason


class OutputError(AnalysisError, OSError):
    """An output folder that cannot be created or written (full disk, read-only, a file in the
    way); an `OSError` still, for callers that caught the file system's own error."""

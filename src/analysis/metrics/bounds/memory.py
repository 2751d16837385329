"""Memory the bounds will take, checked before one huge number makes them allocate it.

A block-hash line's `input_length` is a number, not data: one line claiming 10^12 tokens makes
the index allocate an entry per block (15 GiB at 512-token blocks), and the kernel's OOM killer
then stops this process, or another one. The bounds estimate their arrays first and refuse, in
one line, what the machine cannot hold.
"""

from __future__ import annotations

import os

from analysis.platform.errors import BoundsError

# Peak bytes per stored block: the index's values and their sorted copies, the block keys, and
# the policies' working arrays (LRU's tree and distances, OPT's next uses and heap) each hold
# about one int64 per block. Measured: ~100 bytes a block for `bounds` with lru and opt (two
# requests of 3 M blocks each: 576 MB above the command's own 230 MB).
BYTES_PER_STORED_BLOCK = 128


def available_bytes() -> int:
    """Memory the machine can give now (psutil's estimate, else the free pages)."""
    try:
        import psutil
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(psutil.virtual_memory().available)


def require_memory(needed: int, what: str, fix: str) -> None:
    """BoundsError (one line, with the estimate) when `needed` bytes exceed what is available."""
    available = available_bytes()
    if needed > available:
        raise BoundsError(
            f"{what} would need about {_gib(needed)} of memory, more than the "
            f"{_gib(available)} available: {fix}"
        )


def _gib(count: int) -> str:
    return f"{count / 2**30:,.1f} GiB"

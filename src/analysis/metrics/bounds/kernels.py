"""The inner loops of the capacity bounds, compiled by numba when it is installed.

They are plain Python over numpy arrays, kept apart so that numba is imported only when a
kernel first runs (importing the bounds stays light) and so that each compiled kernel can be
checked against its plain source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

_COMPILED: dict[str, Callable[..., Any]] = {}


def _compiled(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` compiled by numba (cached on disk), or `func` itself without numba."""
    name = func.__name__
    if name not in _COMPILED:
        try:
            import numba
        except ImportError:
            _COMPILED[name] = func
        else:
            _COMPILED[name] = numba.njit(cache=True, nogil=True)(func)
    return _COMPILED[name]


def _lru_distance_kernel(keys, offsets, eligible, num_keys):  # noqa: ANN001, ANN202
    """Mattson's stack distances with a Fenwick tree over access times.

    A request accesses its blocks tail first. The distance of block j counts the distinct
    blocks accessed since its last access; the blocks this request accessed just before it are
    its own descendants, never accessed in between (their uses always come with block j, just
    before it), so subtracting their number gives the distance before the request started.
    """
    requests = offsets.shape[0] - 1
    total = keys.shape[0]
    tree = np.zeros(total + 1, np.int64)
    last_time = np.zeros(num_keys, np.int64)
    last_request = np.zeros(num_keys, np.int64)
    distance = np.full(total, -2, np.int64)
    gap = np.full(total, -1, np.int64)
    markers = 0
    now = 0
    for r in range(requests):
        start = offsets[r]
        count = offsets[r + 1] - start
        limit = eligible[r]
        for done in range(count):
            j = count - 1 - done
            key = keys[start + j]
            now += 1
            before = last_time[key]
            if before > 0:
                seen = 0
                i = before
                while i > 0:
                    seen += tree[i]
                    i -= i & (-i)
                if j < limit:
                    distance[start + j] = markers - seen - done
                    gap[start + j] = r - last_request[key]
                i = before
                while i <= total:
                    tree[i] -= 1
                    i += i & (-i)
                markers -= 1
            elif j < limit:
                distance[start + j] = -1
            i = now
            while i <= total:
                tree[i] += 1
                i += i & (-i)
            markers += 1
            last_time[key] = now
            last_request[key] = r
    return distance, gap


def _opt_kernel(keys, offsets, eligible, next_use, depth, num_keys, capacity):  # noqa: ANN001, ANN202
    """Belady's MIN with bypass. Priority = next hit-eligible use, then depth: the block used
    furthest ahead (the deepest among equals) is evicted, so a parent never leaves before its
    children. Lazy max-heap: an entry is live while its key is cached with that priority."""
    requests = offsets.shape[0] - 1
    total = keys.shape[0]
    cached = np.zeros(num_keys, np.bool_)
    priority = np.zeros(num_keys, np.int64)
    heap_priority = np.empty(total + 1, np.int64)
    heap_key = np.empty(total + 1, np.int64)
    size = 0
    used = 0
    hits = np.zeros(requests, np.int64)
    for r in range(requests):
        start = offsets[r]
        count = offsets[r + 1] - start
        h = 0
        while h < eligible[r] and cached[keys[start + h]]:
            h += 1
        hits[r] = h
        if capacity == 0:
            continue
        for phase in range(2):  # 0: re-prioritise cached blocks, 1: admit the others
            for j in range(count):
                key = keys[start + j]
                if phase == 0 and not cached[key]:
                    continue
                if phase == 1 and cached[key]:
                    continue
                nxt = next_use[start + j]
                p = nxt * depth + j
                if phase == 1:
                    if nxt >= requests:
                        continue
                    if used >= capacity:
                        while True:  # drop stale entries until the top is live
                            top = heap_key[0]
                            if cached[top] and priority[top] == heap_priority[0]:
                                break
                            size -= 1
                            last_p = heap_priority[size]
                            last_k = heap_key[size]
                            i = 0
                            while True:
                                c = 2 * i + 1
                                if c >= size:
                                    break
                                if c + 1 < size and heap_priority[c + 1] > heap_priority[c]:
                                    c += 1
                                if heap_priority[c] <= last_p:
                                    break
                                heap_priority[i] = heap_priority[c]
                                heap_key[i] = heap_key[c]
                                i = c
                            heap_priority[i] = last_p
                            heap_key[i] = last_k
                        if p >= heap_priority[0]:
                            continue  # bypass: used later than everything cached
                        cached[heap_key[0]] = False
                        used -= 1
                    cached[key] = True
                    used += 1
                priority[key] = p
                i = size  # push (p, key)
                size += 1
                while i > 0:
                    parent = (i - 1) // 2
                    if heap_priority[parent] >= p:
                        break
                    heap_priority[i] = heap_priority[parent]
                    heap_key[i] = heap_key[parent]
                    i = parent
                heap_priority[i] = p
                heap_key[i] = key
        if size > 4 * (used + 1) + 1024:  # rebuild: keep only live entries
            live = 0
            for i in range(size):
                k = heap_key[i]
                if cached[k] and priority[k] == heap_priority[i]:
                    heap_key[live] = k
                    heap_priority[live] = heap_priority[i]
                    live += 1
            size = live
            for start_i in range(size // 2 - 1, -1, -1):
                i = start_i
                p0 = heap_priority[i]
                k0 = heap_key[i]
                while True:
                    c = 2 * i + 1
                    if c >= size:
                        break
                    if c + 1 < size and heap_priority[c + 1] > heap_priority[c]:
                        c += 1
                    if heap_priority[c] <= p0:
                        break
                    heap_priority[i] = heap_priority[c]
                    heap_key[i] = heap_key[c]
                    i = c
                heap_priority[i] = p0
                heap_key[i] = k0
    return hits

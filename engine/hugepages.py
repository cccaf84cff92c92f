"""Anonymous memory for the repacked weights, on 2 MiB transparent huge pages where the host
has them.

Each repacked matrix (engine.formats.repack) is a copy the engine makes at load; taking it from an
anonymous mapping of its own means an unloaded model's memory goes back to the system at once
(a malloc'd buffer could stay in the heap), and advising it onto huge pages costs nothing and
saves TLB misses. The gain is small here: Gemma 3 270M decode, 4 interleaved rounds of
scripts/profile_decode.py, 111-150 tok/s with them and 108-127 without (MODELYARD_HUGEPAGES=off),
within this shared machine's noise; one 178 MB Q8_0 matrix (scripts/bench_hugepages.py) streams
alike from both. So the file-layout matrices stay in the file's mapping (copied onto huge pages
they measured no faster: 1.1B Q4_K_M decode 47-59 vs 42-51 tok/s).
Arena packs a model's small matrices into shared 64 MiB chunks so that they sit on huge pages too.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys
import threading
from pathlib import Path

import numpy as np

HUGE_PAGE = 2 << 20
_MADV_DONTNEED = 4
_MADV_HUGEPAGE = 14
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault the whole range in at once
_THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@functools.cache
def available() -> bool:
    """Whether anonymous memory can get transparent huge pages on this host."""
    if _libc() is None or os.environ.get("MODELYARD_HUGEPAGES", "").lower() in ("0", "off", "no"):
        return False
    try:
        setting = _THP_SETTING.read_text()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


def anonymous(nbytes: int, populate: bool = True, huge: bool = True) -> np.ndarray:
    """uint8 [nbytes] in an anonymous mapping of its own (unmapped when the array goes, so an
    unloaded model's memory returns to the system), 2 MiB-aligned and advised onto huge pages
    where available() (and `huge`: False gives 4 KiB pages, for comparisons). With `populate`
    its pages are faulted in now, in one call."""
    if not (huge and available()):
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        return np.frombuffer(mmap.mmap(-1, max(nbytes, 1), flags=flags), np.uint8, count=nbytes)
    # over-allocate by one huge page and start at its boundary: an unaligned start would leave
    # the first and last 2 MiB of the range on small pages
    whole = np.frombuffer(mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS),
                          np.uint8)
    skip = -whole.ctypes.data % HUGE_PAGE
    buf = whole[skip:skip + nbytes]
    if nbytes:
        libc = _libc()
        assert libc is not None
        start, size = ctypes.c_void_p(buf.ctypes.data), ctypes.c_size_t(nbytes)
        libc.madvise(start, size, _MADV_HUGEPAGE)
        if populate and libc.madvise(start, size, _MADV_POPULATE_WRITE) != 0:
            buf[::mmap.PAGESIZE] = 0  # an older kernel: touch each page instead
    return buf


class Arena:
    """Bump allocation of one model's repacked matrices out of 64 MiB huge-page chunks, so that
    matrices smaller than 2 MiB (most of a small model's) sit on huge pages too. Slices keep
    their chunk alive: the memory returns to the system when the last weight using it goes.
    Pages are faulted in by whoever writes a slice first (2 MiB at a time)."""

    CHUNK = 64 << 20
    ALIGN = 64  # a cache line: the kernels' vector loads

    def __init__(self) -> None:
        self._chunk = np.empty(0, np.uint8)
        self._used = 0
        self._lock = threading.Lock()  # a load repacks layers on several threads

    def take(self, nbytes: int) -> np.ndarray:
        """uint8 [nbytes], 64-byte aligned, on huge pages where available()."""
        if nbytes > self.CHUNK // 4:  # large: a mapping of its own wastes no chunk tail
            return anonymous(nbytes, populate=False)
        with self._lock:
            at = -(-self._used // self.ALIGN) * self.ALIGN
            if at + nbytes > self._chunk.size:
                self._chunk, at = anonymous(self.CHUNK, populate=False), 0
            self._used = at + nbytes
            return self._chunk[at:at + nbytes]


def release_file_pages(raw: np.ndarray) -> None:
    """Drop this process's pages of `raw`, a view into a read-only file mapping, once its
    repacked copy serves the kernels: they stop counting in RSS, and a later read (a tied
    embedding's lookup) faults them in again from the page cache. Never for heap memory
    (DONTNEED would zero it)."""
    libc = _libc()
    if libc is None:
        return
    page = mmap.PAGESIZE
    start = -(-raw.ctypes.data // page) * page              # whole pages inside raw only
    end = (raw.ctypes.data + raw.nbytes) // page * page
    if end > start:
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None

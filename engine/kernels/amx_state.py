"""Whether this process may run AMX instructions: the CPU flags, then the kernel's permission to
use the tile data state (Linux asks each process to request it once, before any thread runs a
tile instruction: arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA); the grant is process-wide)."""
from __future__ import annotations

import ctypes
import functools

from engine.kernels import jit

# The tile instructions every AMX kernel declares (each adds its own dot product and loads).
TILE_DECLARATIONS = """declare void @llvm.x86.ldtilecfg(ptr)
declare void @llvm.x86.tilerelease()
declare void @llvm.x86.tilezero(i8 immarg)
declare void @llvm.x86.tileloadd64(i8 immarg, ptr, i64)
declare void @llvm.x86.tilestored64(i8 immarg, ptr, i64)
"""
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158


@functools.cache
def _tile_state_granted() -> bool:
    # asking twice (two threads at once before the cache holds the answer) is harmless: the
    # grant is idempotent
    if not (jit.host_cpu_is_x86() and jit.host_has("amx-tile")):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0)
    except (OSError, AttributeError):
        return False


def available(feature: str) -> bool:
    """`feature` ("amx-bf16", "amx-int8") on the CPU and the tile state granted to this process."""
    return jit.host_cpu_is_x86() and jit.host_has(feature) and _tile_state_granted()

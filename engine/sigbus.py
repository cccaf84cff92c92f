"""Model files that shrink under their memory map must not kill the process with SIGBUS.

`cp new.gguf served.gguf` (or a failed re-download) truncates the file in place; the next read of
a mapped page past the new end raises SIGBUS in whichever thread touches it, usually inside a
compiled kernel with no Python frame to catch anything. Checking the file's size before each
step (gateway/scheduler.py does) narrows that window, but the file can shrink during a step.

So a small SIGBUS handler, written in LLVM IR and compiled like the kernels, runs in the faulting
thread: when the address lies in a registered mapping it maps a page of zeros over the faulting
page (mmap MAP_FIXED|MAP_ANONYMOUS) and returns, the access is retried and reads zeros, and the
`healed` count goes up. The step computes garbage from those zeros; the scheduler sees the changed
file (or the count) after the step and fails its requests instead of returning the garbage. A
fault anywhere else reinstalls the handler that was there before (Python's faulthandler, or the
default) and returns, so the retried access is reported by it exactly as without us.

Linux on 64-bit x86 and ARM (the siginfo and sigaction layouts below are theirs); elsewhere
`install()` returns False and only the checks before each step protect.
"""
from __future__ import annotations

import ctypes
import logging
import mmap
import platform
import signal
import sys
import threading
from typing import Any

log = logging.getLogger(__name__)

MAX_RANGES = 256
_SA_SIGINFO = 0x4
_SA_ONSTACK = 0x08000000
_SIGACTION_BYTES = 152   # glibc struct sigaction on x86-64/aarch64: handler, mask[128], flags, restorer

_IR = f"""
@ranges = global [{2 * MAX_RANGES} x ptr] zeroinitializer   ; (start, end) pairs; end 0 = free
@healed = global i64 0
@page_mask = global i64 0
@mmap_fn = global ptr null
@sigaction_fn = global ptr null
@old_action = global [{_SIGACTION_BYTES // 8 + 8} x i64] zeroinitializer

declare ptr @llvm.ptrmask.p0.i64(ptr, i64)

define void @modelyard_on_sigbus(i32 %sig, ptr %info, ptr %ctx) {{
entry:
  %addr_at = getelementptr inbounds i8, ptr %info, i64 16      ; siginfo_t.si_addr
  %addr = load volatile ptr, ptr %addr_at
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %miss]
  %more = icmp ult i64 %i, {MAX_RANGES}
  br i1 %more, label %test, label %not_ours
test:
  %si = shl i64 %i, 1
  %ei = or i64 %si, 1
  %start_at = getelementptr inbounds [{2 * MAX_RANGES} x ptr], ptr @ranges, i64 0, i64 %si
  %end_at = getelementptr inbounds [{2 * MAX_RANGES} x ptr], ptr @ranges, i64 0, i64 %ei
  %start = load volatile ptr, ptr %start_at
  %end = load volatile ptr, ptr %end_at
  %above = icmp uge ptr %addr, %start
  %below = icmp ult ptr %addr, %end
  %inside = and i1 %above, %below
  %next = add i64 %i, 1
  br i1 %inside, label %heal, label %miss
miss:
  br label %loop
heal:
  %mask = load i64, ptr @page_mask
  %page = call ptr @llvm.ptrmask.p0.i64(ptr %addr, i64 %mask)
  %size = sub i64 0, %mask
  %mmap = load ptr, ptr @mmap_fn
  ; PROT_READ, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, fd -1
  %r = call ptr %mmap(ptr %page, i64 %size, i32 1, i32 50, i32 -1, i64 0)
  %n = atomicrmw add ptr @healed, i64 1 seq_cst
  ret void
not_ours:
  %sigaction = load ptr, ptr @sigaction_fn
  %ok = call i32 %sigaction(i32 %sig, ptr @old_action, ptr null)
  ret void
}}
"""

_lock = threading.Lock()
_state: dict[str, Any] = {}     # lib, the handler's address, libc (ctypes handles)
_slots: dict[int, tuple[int, int]] = {}  # slot -> (start, end)


def _supported() -> bool:
    return sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")


def _global(name: str, ctype: Any) -> Any:
    """The IR module's global `name` seen as the ctypes type `ctype`."""
    lib = _state["lib"]
    addr = lib._engine.get_global_value_address(name)
    return ctype.from_address(addr)


def install() -> bool:
    """Install the handler (once; again if someone replaced it since). False if unsupported."""
    if not _supported():
        return False
    with _lock:
        if "lib" not in _state:
            from .kernels.jit import compile_ir

            libc = ctypes.CDLL(None, use_errno=True)
            _state["lib"] = compile_ir(_IR)
            _state["libc"] = libc
            _state["handler"] = _state["lib"].address("modelyard_on_sigbus")
            _global("page_mask", ctypes.c_uint64).value = (~(mmap.PAGESIZE - 1)) & (2**64 - 1)
            _global("mmap_fn", ctypes.c_void_p).value = ctypes.cast(libc.mmap, ctypes.c_void_p).value
            _global("sigaction_fn", ctypes.c_void_p).value = ctypes.cast(
                libc.sigaction, ctypes.c_void_p).value
        libc = _state["libc"]
        current = (ctypes.c_uint64 * (_SIGACTION_BYTES // 8 + 8))()
        libc.sigaction(int(signal.SIGBUS), None, current)
        if current[0] == _state["handler"]:
            return True
        action = (ctypes.c_uint64 * (_SIGACTION_BYTES // 8 + 8))()
        action[0] = int(_state["handler"])
        ctypes.c_int.from_address(ctypes.addressof(action) + 136).value = _SA_SIGINFO | _SA_ONSTACK
        old = _global("old_action", ctypes.c_uint64 * (_SIGACTION_BYTES // 8 + 8))
        if libc.sigaction(int(signal.SIGBUS), action, old) != 0:
            log.warning("cannot install the SIGBUS handler (errno %d)", ctypes.get_errno())
            return False
        return True


def guard(start: int, length: int) -> int | None:
    """Heal faults in [start, start + length) from now on; returns a slot for `unguard`."""
    if length <= 0 or not install():
        return None
    with _lock:
        free = next((i for i in range(MAX_RANGES) if i not in _slots), None)
        if free is None:
            log.warning("more than %d mapped files; SIGBUS guard not extended", MAX_RANGES)
            return None
        ranges = _global("ranges", ctypes.c_uint64 * (2 * MAX_RANGES))
        ranges[2 * free + 1] = 0               # closed while being written
        ranges[2 * free] = start
        ranges[2 * free + 1] = start + length
        _slots[free] = (start, start + length)
        return free


def unguard(slot: int | None) -> None:
    """Stop healing a range (call before it is unmapped)."""
    if slot is None:
        return
    with _lock:
        if _slots.pop(slot, None) is not None:
            ranges = _global("ranges", ctypes.c_uint64 * (2 * MAX_RANGES))
            ranges[2 * slot + 1] = 0
            ranges[2 * slot] = 0


def healed() -> int:
    """Faults healed so far (process-wide): a change means some mapped file shrank."""
    if "lib" not in _state:
        return 0
    return int(_global("healed", ctypes.c_int64).value)

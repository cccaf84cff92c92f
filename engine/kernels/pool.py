"""A native worker pool: compiled worker loops that run task graphs SPMD, like ggml's graph compute.

Handing work to Python threads costs 25-45 us; these workers are compiled code (each started
once by a Python thread that calls into it, so ctypes has dropped the GIL for the thread's whole
life), and a dispatch costs ~1-2 us.

A *task* is a compiled function  void task(ptr args, ptr step, i64 tid, i64 n_threads)  that
does thread tid's share of some work (a row range of a matmul, some attention heads, ...).
A *graph* is an array of nodes {ptr task, ptr args, i64 flags}; running it, every thread
(the caller as thread 0, workers 1..n-1) walks the same nodes in order and calls each task with
its own tid, meeting at a barrier after each node flagged BARRIER (and after the last one):

    caller:  publish (nodes, n, step); job += 1; [futex-wake sleepers]; execute(0); return
    worker:  loop { wait until job changes; if stop: return; execute(tid) }
    execute(tid): for node in nodes: node.task(node.args, step, tid, n); if barrier: barrier()

Waiting, in workers between jobs and in barriers: `pause` for a few microseconds, then
sched_yield (so other processes on a busy machine get the core), and a worker idle for a few
more milliseconds (SLEEP_AFTER_YIELDS) sleeps in futex_wait on the job word, so an idle loaded
model burns no CPU; the caller wakes sleepers with futex_wake. Off Linux the sleep is a 200 us
usleep poll instead.

Worker state machine (the job word and the stop flag drive it; only pool_run/pool_stop write them):

    spinning --~25 us idle--> yielding --~3 ms idle--> sleeping (futex_wait on the job word)
        |                        |                           |
        +------------------------+---- job changed ----------+--> executing --graph done--> spinning
    any state but executing --stop flag (close)--> exited

Control block (one per pool; hot words on their own 64-byte lines):
    0: i32 job   8: ptr nodes   16: i64 n_nodes   24: ptr step
   32: i64 active (threads taking part in this graph)   64: i32 stop   128: i32 sleepers
  192: i32 barrier count   256: i32 barrier generation   320: i64 slow barrier waits
"""
from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from engine.kernels import jit

# `pause` takes ~25 ns here. Spins stay short because two threads of ours can share one core
# (the machine is shared): a waiter spinning there keeps the thread it waits for off the core.
BARRIER_PAUSES = 256        # ~6 us of `pause` at a barrier before yielding
JOB_PAUSES = 1024           # ~25 us of `pause` waiting for a job before yielding
SLEEP_AFTER_YIELDS = 8000   # then ~3 ms of sched_yield (~0.4 us each when idle) before sleeping
BARRIER = 1                 # node flag: all threads meet after this node

_JOB, _NODES, _N_NODES, _STEP, _ACTIVE = 0, 8, 16, 24, 32
_STOP, _SLEEPERS, _BAR_COUNT, _BAR_GEN, _SLOW_WAITS = 64, 128, 192, 256, 320
_CONTROL_BYTES = 384
NODE_BYTES = 24             # {ptr task, ptr args, i64 flags}

_FUTEX_SYSCALL = 202        # x86-64 Linux
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129
_WAKE_ALL = "2147483647"    # futex_wake's count: every sleeper


def _futex(result: str, op: int, value: str) -> str:
    """An IR line: result = syscall(futex, the job word, op, value, no timeout)."""
    return (f"  {result} = call i64 (i64, ...) @syscall(i64 {_FUTEX_SYSCALL}, ptr %pool, i32 {op}, "
            f"i32 {value}, ptr null, ptr null, i32 0)")


def build_pool_ir(x86: bool, linux_futex: bool) -> str:
    """The pool's functions: pool_run (caller), pool_worker, pool_stop, and their helpers."""
    pause = "call void @llvm.x86.sse2.pause()" if x86 else "call void asm sideeffect \"\", \"\"()"
    if linux_futex:
        sleep = f"""  %sl = atomicrmw add ptr %sleepers, i32 1 seq_cst
  %again = load atomic i32, ptr %pool seq_cst, align 4
  %still = icmp eq i32 %again, %seen
  br i1 %still, label %futex, label %woke
futex:
{_futex("%r", _FUTEX_WAIT_PRIVATE, "%seen")}
  br label %woke
woke:
  %sl2 = atomicrmw sub ptr %sleepers, i32 1 seq_cst
  br label %slept"""
        wake = f"""  %n_sleep = load atomic i32, ptr %sleepers seq_cst, align 4
  %any = icmp ne i32 %n_sleep, 0
  br i1 %any, label %wake, label %run
wake:
{_futex("%w", _FUTEX_WAKE_PRIVATE, _WAKE_ALL)}
  br label %run"""
        wake_all = _futex("%w", _FUTEX_WAKE_PRIVATE, _WAKE_ALL)
    else:
        wake_all = ""
        sleep = """  %u = call i32 @usleep(i32 200)
  br label %slept"""
        wake = "  br label %run"
    return f"""
declare void @llvm.x86.sse2.pause()
declare i32 @sched_yield()
declare i64 @syscall(i64, ...)
declare i32 @usleep(i32)

; one step of waiting: `pause` while k < limit, else sched_yield
define internal void @backoff(i64 %k, i64 %limit) {{
entry:
  %spin = icmp ult i64 %k, %limit
  br i1 %spin, label %pause, label %yield
pause:
  {pause}
  ret void
yield:
  %y = call i32 @sched_yield()
  ret void
}}

; all n threads meet: the last to arrive resets the count and bumps the generation. A wait
; that outlasts the pause phase is counted in the slow-waits word (a sign of a shared core).
define internal void @barrier(ptr %pool, i64 %n) {{
entry:
  %single = icmp ule i64 %n, 1
  br i1 %single, label %done, label %sync
sync:
  %genp = getelementptr inbounds i8, ptr %pool, i64 {_BAR_GEN}
  %cntp = getelementptr inbounds i8, ptr %pool, i64 {_BAR_COUNT}
  %gen = load atomic i32, ptr %genp acquire, align 4
  %others = trunc i64 %n to i32
  %others1 = sub i32 %others, 1
  %arrived = atomicrmw add ptr %cntp, i32 1 acq_rel
  %last = icmp eq i32 %arrived, %others1
  br i1 %last, label %release, label %wait
release:
  store atomic i32 0, ptr %cntp monotonic, align 4
  %gen1 = add i32 %gen, 1
  store atomic i32 %gen1, ptr %genp release, align 4
  br label %done
wait:
  %k = phi i64 [0, %sync], [%k1, %wait]
  call void @backoff(i64 %k, i64 {BARRIER_PAUSES})
  %k1 = add i64 %k, 1
  %now = load atomic i32, ptr %genp acquire, align 4
  %same = icmp eq i32 %now, %gen
  br i1 %same, label %wait, label %woke
woke:
  %slow = icmp ugt i64 %k1, {BARRIER_PAUSES}
  br i1 %slow, label %count, label %done
count:
  %slowp = getelementptr inbounds i8, ptr %pool, i64 {_SLOW_WAITS}
  %c = atomicrmw add ptr %slowp, i64 1 monotonic
  br label %done
done:
  ret void
}}

; thread tid's walk over the published graph (threads tid >= active sit this one out)
define void @pool_execute(ptr %pool, i64 %tid) {{
entry:
  %nodesp = getelementptr inbounds i8, ptr %pool, i64 {_NODES}
  %nodes = load ptr, ptr %nodesp, align 8
  %np = getelementptr inbounds i8, ptr %pool, i64 {_N_NODES}
  %n = load i64, ptr %np, align 8
  %stepp = getelementptr inbounds i8, ptr %pool, i64 {_STEP}
  %step = load ptr, ptr %stepp, align 8
  %activep = getelementptr inbounds i8, ptr %pool, i64 {_ACTIVE}
  %nth = load i64, ptr %activep, align 8
  %last = sub i64 %n, 1
  %empty = icmp eq i64 %n, 0
  %idle = icmp uge i64 %tid, %nth
  %skip = or i1 %empty, %idle
  br i1 %skip, label %done, label %node
node:
  %i = phi i64 [0, %entry], [%i1, %next]
  %off = mul i64 %i, {NODE_BYTES}
  %nodep = getelementptr inbounds i8, ptr %nodes, i64 %off
  %task = load ptr, ptr %nodep, align 8
  %argsp = getelementptr inbounds i8, ptr %nodep, i64 8
  %args = load ptr, ptr %argsp, align 8
  %flagsp = getelementptr inbounds i8, ptr %nodep, i64 16
  %flags = load i64, ptr %flagsp, align 8
  call void %task(ptr %args, ptr %step, i64 %tid, i64 %nth)
  %fb = and i64 %flags, {BARRIER}
  %flagged = icmp ne i64 %fb, 0
  %is_last = icmp eq i64 %i, %last
  %meet = or i1 %flagged, %is_last
  br i1 %meet, label %meetb, label %next
meetb:
  call void @barrier(ptr %pool, i64 %nth)
  br label %next
next:
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %n
  br i1 %more, label %node, label %done
done:
  ret void
}}

; the caller: publish the graph, bump the job word, wake sleepers, take part as thread 0
define void @pool_run(ptr %pool, ptr %nodes, i64 %n, ptr %step, i64 %active) {{
entry:
  %activep = getelementptr inbounds i8, ptr %pool, i64 {_ACTIVE}
  store i64 %active, ptr %activep, align 8
  %nodesp = getelementptr inbounds i8, ptr %pool, i64 {_NODES}
  store ptr %nodes, ptr %nodesp, align 8
  %np = getelementptr inbounds i8, ptr %pool, i64 {_N_NODES}
  store i64 %n, ptr %np, align 8
  %stepp = getelementptr inbounds i8, ptr %pool, i64 {_STEP}
  store ptr %step, ptr %stepp, align 8
  %sleepers = getelementptr inbounds i8, ptr %pool, i64 {_SLEEPERS}
  %old = atomicrmw add ptr %pool, i32 1 seq_cst
{wake}
run:
  call void @pool_execute(ptr %pool, i64 0)
  ret void
}}

; a worker's whole life: wait for a job, run it, until the stop flag is set. It starts from
; job 0, not from the job word's value when its thread gets going: a graph may already be
; waiting for it by then.
define void @pool_worker(ptr %pool, i64 %tid) {{
entry:
  %stopp = getelementptr inbounds i8, ptr %pool, i64 {_STOP}
  %sleepers = getelementptr inbounds i8, ptr %pool, i64 {_SLEEPERS}
  br label %wait
wait:
  %seen = phi i32 [0, %entry], [%seen, %idle], [%job, %ran], [%seen, %slept]
  %k = phi i64 [0, %entry], [%k1, %idle], [0, %ran], [0, %slept]
  %job = load atomic i32, ptr %pool acquire, align 4
  %changed = icmp ne i32 %job, %seen
  br i1 %changed, label %got, label %check
check:
  %long = icmp ugt i64 %k, {JOB_PAUSES + SLEEP_AFTER_YIELDS}
  br i1 %long, label %sleep, label %idle
idle:
  call void @backoff(i64 %k, i64 {JOB_PAUSES})
  %k1 = add i64 %k, 1
  br label %wait
sleep:
{sleep}
slept:
  br label %wait
got:
  %stop = load atomic i32, ptr %stopp acquire, align 4
  %stopped = icmp ne i32 %stop, 0
  br i1 %stopped, label %exit, label %work
work:
  call void @pool_execute(ptr %pool, i64 %tid)
  br label %ran
ran:
  br label %wait
exit:
  ret void
}}

; ask every worker to exit (then join their threads)
define void @pool_stop(ptr %pool) {{
entry:
  %stopp = getelementptr inbounds i8, ptr %pool, i64 {_STOP}
  store atomic i32 1, ptr %stopp seq_cst, align 4
  %old = atomicrmw add ptr %pool, i32 1 seq_cst
{wake_all}
  ret void
}}
"""


@dataclass(frozen=True)
class _PoolFunctions:
    run: jit.CFunction        # pool_run(pool, nodes, n, step, active)
    worker: jit.CFunction     # pool_worker(pool, tid)
    stop: jit.CFunction       # pool_stop(pool)


_functions: _PoolFunctions | None = None
_functions_lock = threading.Lock()


def _load() -> _PoolFunctions:
    global _functions
    with _functions_lock:
        if _functions is None:
            x86 = jit.host_cpu_is_x86()
            futex = x86 and sys.platform == "linux"
            lib = jit.compile_cached("pool", (x86, futex), lambda: build_pool_ir(x86, futex))
            p, n = ctypes.c_void_p, ctypes.c_int64
            _functions = _PoolFunctions(lib.function("pool_run", None, p, p, n, p, n),
                                        lib.function("pool_worker", None, p, n),
                                        lib.function("pool_stop", None, p))
        return _functions


def _aligned_zeros(nbytes: int, align: int = 64) -> tuple[np.ndarray, int]:
    """(owner array, aligned address) of `nbytes` zeroed bytes."""
    buf = np.zeros(nbytes + align, np.uint8)
    addr = int(buf.ctypes.data)
    return buf, addr + (-addr) % align


def _shutdown(stop: jit.CFunction, control: np.ndarray, address: int,
              threads: list[threading.Thread]) -> None:
    """Stop and join the workers (control is passed so it outlives them)."""
    if threads:
        stop(address)
        for t in threads:
            t.join()
        threads.clear()
    del control


class Graph:
    """Nodes for Pool.run: (task address, int64 args array, flags). Keeps the args alive."""

    def __init__(self) -> None:
        self._rows: list[list[int]] = []
        self._keep: list[np.ndarray] = []
        self._nodes: np.ndarray | None = None

    def add(self, task: int, args: np.ndarray, barrier: bool = False) -> None:
        assert args.dtype == np.int64 and args.flags.c_contiguous
        self._rows.append([task, int(args.ctypes.data), BARRIER if barrier else 0])
        self._keep.append(args)
        self._nodes = None

    def barrier(self) -> None:
        """All threads meet after the last node added so far (no-op on an empty graph)."""
        if self._rows:
            self._rows[-1][2] |= BARRIER
            self._nodes = None

    @property
    def nodes(self) -> np.ndarray:
        """int64 [n, 3]: {task, args, flags} rows, the layout pool_execute reads."""
        if self._nodes is None:
            self._nodes = np.array(self._rows, np.int64).reshape(-1, 3)
        return self._nodes

    def __len__(self) -> int:
        return len(self._rows)


class Pool:
    """n_threads - 1 native workers plus the calling thread; runs graphs (see module docstring).

    One graph at a time (a lock serializes callers). close() stops and joins the workers; a pool
    nobody closed is stopped when collected or at exit.
    """

    def __init__(self, n_threads: int) -> None:
        if n_threads < 1:
            raise ValueError(f"n_threads must be at least 1, got {n_threads}")
        self.n_threads = n_threads
        self._fns = _load()
        self._control, self._address = _aligned_zeros(_CONTROL_BYTES)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        for tid in range(1, n_threads):
            t = threading.Thread(target=self._fns.worker, args=(self._address, tid),
                                 name=f"modelyard-pool-{tid}", daemon=True)
            t.start()
            self._threads.append(t)
        self._finalizer = weakref.finalize(self, _shutdown, self._fns.stop, self._control,
                                           self._address, self._threads)
        self.closed = False

    def run(self, graph: Graph | np.ndarray, step: int = 0, threads: int | None = None) -> None:
        """Run every node of `graph` on `threads` threads (default: all); returns when done.

        Tasks split their work by the thread count they are given, so a graph may run on fewer
        threads than the pool has (when the machine is busy, say); the others stay idle.
        """
        nodes = graph.nodes if isinstance(graph, Graph) else graph
        n = nodes.shape[0]
        if n == 0:
            return
        active = self.n_threads if threads is None else max(1, min(threads, self.n_threads))
        with self._lock:
            if self.closed:
                raise RuntimeError("the pool is closed")
            self._fns.run(self._address, nodes.ctypes.data, n, step, active)

    @property
    def slow_waits(self) -> int:
        """Barrier waits so far that outlasted the pause phase (another thread was off-core)."""
        return ctypes.c_int64.from_address(self._address + _SLOW_WAITS).value

    def run_task(self, task: int, args: np.ndarray, step: int = 0, threads: int | None = None) -> None:
        """Run one task on `threads` threads (default: all)."""
        nodes = np.array([[task, args.ctypes.data, 0]], np.int64)
        self.run(nodes, step, threads)

    def close(self) -> None:
        with self._lock:
            self.closed = True
        self._finalizer()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

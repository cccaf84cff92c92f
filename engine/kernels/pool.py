"""A native worker pool: compiled worker loops that run task graphs SPMD, like ggml's graph compute.

Handing work to Python threads costs 25-45 us; these workers are compiled code (each started
once by a Python thread that calls into it, so ctypes has dropped the GIL for the thread's whole
life), and a dispatch costs ~1-2 us.

A *task* is a compiled function  void task(ptr args, ptr step, i64 tid, i64 n_threads)  that
does thread tid's share of some work (a row range of a matmul, some attention heads, ...).
A *graph* is an array of nodes {ptr task, ptr args, i64 flags}. Nodes flagged BARRIER (and the
last one) end a *segment*; a segment's work is cut into `active` shares, share s being every node
of the segment called with tid = s (so a share's nodes run in order on one thread, as a tid's
did). Threads claim shares, not own them: each takes the next unclaimed share of the segment,
runs it, marks it done, and takes another until none is left, then waits until all are done
and goes to the next segment. A thread the OS took off its core (a client, the event loop, a
neighbour on a shared machine) so holds up only a share it already claimed, never the segment:
the others run the shares it did not get to (on 2 cores with 8 streaming clients a static split
made a decode step take twice its quiet-machine time, scripts/bench_serve.py). Results do not
depend on which thread runs a share: a task sees only its share number and the share count.

    caller:  wait until every thread left the previous job; publish (nodes, n, step, segments);
             job += 1; [futex-wake sleepers]; execute(0); return (when the last segment is done)
    worker:  loop { wait until job changes; if stop: return; execute(tid) }
    execute: for each segment: while a share is unclaimed: claim s; run its nodes with tid = s;
             done += 1.  Wait until done = shares.  Then: exits += 1.

A segment's sync line holds its claim word and its done word, each (job << 32 | count), so the
lines need no reset between jobs: a word of an older job reads as count 0. The caller waits for
`exits` before it publishes a job, so no thread is left in an older job (the only memory a
thread reads after the last segment is done is the pool's own: its sync lines and this block).

Waiting, in workers between jobs and in segment waits: `pause` for a few microseconds, then
sched_yield (so other processes on a busy machine get the core), and a worker idle for a few
more milliseconds (SLEEP_AFTER_YIELDS) sleeps in futex_wait on the job word, so an idle loaded
model burns no CPU; the caller wakes sleepers with futex_wake. Off Linux the sleep is a 200 us
usleep poll instead.

Worker state machine (the job word and the stop flag drive it; only pool_run/pool_stop write them):

    spinning --~25 us idle--> yielding --~3 ms idle--> sleeping (futex_wait on the job word)
        |                        |                           |
        +------------------------+---- job changed ----------+--> executing --graph done--> spinning
    any state but executing --stop flag (close)--> exited

A share's state machine (per segment and job; its claim and done words move it):

    unclaimed --claim (CAS on the claim word)--> running --done word += 1--> done
    (a segment is done when its done word counts every share; then every thread moves on)

Control block (one per pool; hot words on their own 64-byte lines):
    0: i32 job   8: ptr nodes   16: i64 n_nodes   24: ptr step   32: i64 active
   40: ptr segment ends (i64 index of each segment's last node)   48: i64 segments
   56: ptr sync lines (SYNC_LINE bytes per segment: claim word, then done word a line later)
   64: i32 stop   128: i32 sleepers   192: i64 exits (threads out of the current job)
  320: i64 slow waits
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
WAIT_PAUSES = 256           # ~6 us of `pause` in a segment wait before yielding
JOB_PAUSES = 1024           # ~25 us of `pause` waiting for a job before yielding
SLEEP_AFTER_YIELDS = 8000   # then ~3 ms of sched_yield (~0.4 us each when idle) before sleeping
BARRIER = 1                 # node flag: all threads meet after this node

_JOB, _NODES, _N_NODES, _STEP, _ACTIVE, _ENDS, _N_SEGS, _SYNC = 0, 8, 16, 24, 32, 40, 48, 56
_STOP, _SLEEPERS, _EXITS, _SLOW_WAITS = 64, 128, 192, 320
_CONTROL_BYTES = 384
SYNC_LINE = 128             # a segment's claim word, and its done word 64 bytes on
NODE_BYTES = 24             # {ptr task, ptr args, i64 flags}

_FUTEX_SYSCALL = 202        # x86-64 Linux
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129
_WAKE_ALL = "2147483647"    # futex_wake's count: every sleeper


def _futex(result: str, op: int, value: str) -> str:
    """An IR line: result = syscall(futex, the job word, op, value, no timeout)."""
    return (f"  {result} = call i64 (i64, ...) @syscall(i64 {_FUTEX_SYSCALL}, ptr %pool, i32 {op}, "
            f"i32 {value}, ptr null, ptr null, i32 0)")


# What pool_run publishes for a job and pool_execute reads: (name, type, control block offset);
# the name is pool_run's parameter and pool_execute's value alike.
_PUBLISHED = [("nodes", "ptr", _NODES), ("n", "i64", _N_NODES), ("step", "ptr", _STEP),
              ("nth", "i64", _ACTIVE), ("ends", "ptr", _ENDS), ("nseg", "i64", _N_SEGS),
              ("sync", "ptr", _SYNC)]


def _published(op: str) -> str:
    """IR lines that load (op "load") or store (op "store") every published field."""
    lines = []
    for name, ty, offset in _PUBLISHED:
        lines.append(f"  %{name}.p = getelementptr inbounds i8, ptr %pool, i64 {offset}")
        lines.append(f"  %{name} = load {ty}, ptr %{name}.p, align 8" if op == "load"
                     else f"  store {ty} %{name}, ptr %{name}.p, align 8")
    return "\n".join(lines)


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

; wait until the i64 at %p reads %want (counting a wait past the pause phase: a sign that a
; thread was off its core)
define internal void @await(ptr %pool, ptr %p, i64 %want) {{
entry:
  br label %wait
wait:
  %k = phi i64 [0, %entry], [%k1, %spin]
  %w = load atomic i64, ptr %p acquire, align 8
  %there = icmp eq i64 %w, %want
  br i1 %there, label %woke, label %spin
spin:
  call void @backoff(i64 %k, i64 {WAIT_PAUSES})
  %k1 = add i64 %k, 1
  br label %wait
woke:
  %slow = icmp ugt i64 %k, {WAIT_PAUSES}
  br i1 %slow, label %count, label %done
count:
  %slowp = getelementptr inbounds i8, ptr %pool, i64 {_SLOW_WAITS}
  %c = atomicrmw add ptr %slowp, i64 1 monotonic
  br label %done
done:
  ret void
}}

; the count of a (job << 32 | count) word for job %tag (a word of an older job counts 0)
define internal i64 @count_of(i64 %w, i64 %tag) alwaysinline {{
entry:
  %hi = and i64 %w, -4294967296
  %mine = icmp eq i64 %hi, %tag
  %lo = and i64 %w, 4294967295
  %c = select i1 %mine, i64 %lo, i64 0
  ret i64 %c
}}

; the count c of a (job << 32 | count) word for job %tag, raised to c + 1 when c < %limit (a
; CAS, retried if another thread raised it first); returns c, or %limit when it was there already
define internal i64 @take_next(ptr %p, i64 %tag, i64 %limit) {{
entry:
  br label %try
try:
  %w = load atomic i64, ptr %p acquire, align 8
  %c = call i64 @count_of(i64 %w, i64 %tag)
  %room = icmp ult i64 %c, %limit
  br i1 %room, label %take, label %full
take:
  %c1 = add i64 %c, 1
  %new = or i64 %tag, %c1
  %r = cmpxchg ptr %p, i64 %w, i64 %new acq_rel acquire
  %ok = extractvalue {{ i64, i1 }} %r, 1
  br i1 %ok, label %done, label %try
full:
  ret i64 %limit
done:
  ret i64 %c
}}

; one thread's part in job %job (see the module docstring). One active thread runs every node
; as share 0 with no synchronisation.
define void @pool_execute(ptr %pool, i64 %tid, i32 %job) {{
entry:
{_published('load')}
  %exitsp = getelementptr inbounds i8, ptr %pool, i64 {_EXITS}
  %job64 = zext i32 %job to i64
  %tag = shl i64 %job64, 32
  %empty = icmp eq i64 %n, 0
  %idle = icmp uge i64 %tid, %nth
  %skip = or i1 %empty, %idle
  br i1 %skip, label %out, label %mode
mode:
  %solo = icmp ule i64 %nth, 1
  br i1 %solo, label %alone, label %segment
alone:
  %ai = phi i64 [0, %mode], [%ai1, %alone]
  call void @run_node(ptr %nodes, i64 %ai, ptr %step, i64 0, i64 1)
  %ai1 = add i64 %ai, 1
  %amore = icmp ult i64 %ai1, %n
  br i1 %amore, label %alone, label %left
segment:
  %seg = phi i64 [0, %mode], [%seg1, %segdone]
  %begin = phi i64 [0, %mode], [%next, %segdone]
  %endp = getelementptr inbounds i64, ptr %ends, i64 %seg
  %end = load i64, ptr %endp, align 8
  %lineoff = mul i64 %seg, {SYNC_LINE}
  %claimp = getelementptr inbounds i8, ptr %sync, i64 %lineoff
  %donep = getelementptr inbounds i8, ptr %claimp, i64 64
  br label %try
try:
  %share = call i64 @take_next(ptr %claimp, i64 %tag, i64 %nth)
  %unclaimed = icmp ult i64 %share, %nth
  br i1 %unclaimed, label %node, label %finish
node:
  %x = phi i64 [%begin, %try], [%x1, %node]
  call void @run_node(ptr %nodes, i64 %x, ptr %step, i64 %share, i64 %nth)
  %x1 = add i64 %x, 1
  %xmore = icmp ule i64 %x1, %end
  br i1 %xmore, label %node, label %mark
mark:
  %done = call i64 @take_next(ptr %donep, i64 %tag, i64 %nth)  ; never full: this share is not counted yet
  br label %try
finish:
  %all = or i64 %tag, %nth
  call void @await(ptr %pool, ptr %donep, i64 %all)
  br label %segdone
segdone:
  %next = add i64 %end, 1
  %seg1 = add i64 %seg, 1
  %more = icmp ult i64 %seg1, %nseg
  br i1 %more, label %segment, label %left
left:
  %e = atomicrmw add ptr %exitsp, i64 1 release
  br label %out
out:
  ret void
}}

; node %i's task, called for one share
define internal void @run_node(ptr %nodes, i64 %i, ptr %step, i64 %share, i64 %nth) alwaysinline {{
entry:
  %off = mul i64 %i, {NODE_BYTES}
  %nodep = getelementptr inbounds i8, ptr %nodes, i64 %off
  %task = load ptr, ptr %nodep, align 8
  %argsp = getelementptr inbounds i8, ptr %nodep, i64 8
  %args = load ptr, ptr %argsp, align 8
  call void %task(ptr %args, ptr %step, i64 %share, i64 %nth)
  ret void
}}

; the caller: wait until every thread of the last job left it, publish the graph, bump the job
; word, wake sleepers, take part as thread 0 (returns when the last segment is done)
define void @pool_run(ptr %pool, ptr %nodes, i64 %n, ptr %step, i64 %nth, ptr %ends,
                      i64 %nseg, ptr %sync) {{
entry:
  %prevp = getelementptr inbounds i8, ptr %pool, i64 {_ACTIVE}
  %prev = load i64, ptr %prevp, align 8
  %exitsp = getelementptr inbounds i8, ptr %pool, i64 {_EXITS}
  call void @await(ptr %pool, ptr %exitsp, i64 %prev)
  store atomic i64 0, ptr %exitsp monotonic, align 8
{_published('store')}
  %sleepers = getelementptr inbounds i8, ptr %pool, i64 {_SLEEPERS}
  %old = atomicrmw add ptr %pool, i32 1 seq_cst
  %job = add i32 %old, 1
{wake}
run:
  call void @pool_execute(ptr %pool, i64 0, i32 %job)
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
  call void @pool_execute(ptr %pool, i64 %tid, i32 %job)
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
    run: jit.CFunction        # pool_run(pool, nodes, n, step, active, ends, n_segments, sync)
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
            _functions = _PoolFunctions(lib.function("pool_run", None, p, p, n, p, n, p, n, p),
                                        lib.function("pool_worker", None, p, n),
                                        lib.function("pool_stop", None, p))
        return _functions


def _aligned_zeros(nbytes: int, align: int = 64) -> tuple[np.ndarray, int]:
    """(owner array, aligned address) of `nbytes` zeroed bytes."""
    buf = np.zeros(nbytes + align, np.uint8)
    addr = int(buf.ctypes.data)
    return buf, addr + (-addr) % align


def _shutdown(stop: jit.CFunction, memory: object, address: int,
              threads: list[threading.Thread]) -> None:
    """Stop and join the workers (the control block and sync lines are passed so they outlive
    them)."""
    if threads:
        stop(address)
        for t in threads:
            t.join()
        threads.clear()
    del memory


_ONE_SEGMENT = np.zeros(1, np.int64)  # a one-node graph's segment ends (read only)
_ONE_SEGMENT_ADDRESS = int(_ONE_SEGMENT.ctypes.data)


def segment_ends(nodes: np.ndarray) -> np.ndarray:
    """The index of each segment's last node: every BARRIER node, and the last node."""
    n = nodes.shape[0]
    ends = np.flatnonzero(nodes[:, 2] & BARRIER).astype(np.int64)
    if n and (len(ends) == 0 or ends[-1] != n - 1):
        ends = np.append(ends, np.int64(n - 1))
    return np.ascontiguousarray(ends)


class Graph:
    """Nodes for Pool.run: (task address, int64 args array, flags). Keeps the args alive."""

    def __init__(self) -> None:
        self._rows: list[list[int]] = []
        self._keep: list[np.ndarray] = []
        self._nodes: np.ndarray | None = None
        self._ends = np.zeros(0, np.int64)
        self._ends_address = 0

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
            self._ends = segment_ends(self._nodes)
            self._ends_address = int(self._ends.ctypes.data)
        return self._nodes

    @property
    def ends(self) -> np.ndarray:
        """int64 [segments]: the index of each segment's last node."""
        self.nodes  # noqa: B018  (builds both)
        return self._ends

    @property
    def ends_address(self) -> int:
        self.nodes  # noqa: B018  (builds both)
        return self._ends_address

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
        # segments' sync lines; grown by doubling, and every earlier array kept: a thread may
        # still be reading the last job's lines when the next run replaces the array
        self._sync: list[np.ndarray] = []
        self._sync_address, self._sync_lines = 0, 0
        self._grow_sync(256)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        for tid in range(1, n_threads):
            t = threading.Thread(target=self._fns.worker, args=(self._address, tid),
                                 name=f"modelyard-pool-{tid}", daemon=True)
            t.start()
            self._threads.append(t)
        self._finalizer = weakref.finalize(self, _shutdown, self._fns.stop,
                                           (self._control, self._sync), self._address, self._threads)
        self.closed = False

    def run(self, graph: Graph | np.ndarray, step: int = 0, threads: int | None = None) -> None:
        """Run every node of `graph` on `threads` threads (default: all); returns when done.

        Tasks split their work by the thread count they are given, so a graph may run on fewer
        threads than the pool has (when the machine is busy, say); the others stay idle.
        """
        if isinstance(graph, Graph):
            nodes, ends = graph.nodes, graph.ends
            n_segments, ends_address = len(ends), graph.ends_address
        elif graph.shape[0] == 1:  # run_task's one node (numpy's segment_ends costs ~5 us)
            nodes, n_segments, ends_address = graph, 1, _ONE_SEGMENT_ADDRESS
        else:
            nodes, ends = graph, segment_ends(graph)
            n_segments, ends_address = len(ends), int(ends.ctypes.data)
        n = nodes.shape[0]
        if n == 0:
            return
        active = self.n_threads if threads is None else max(1, min(threads, self.n_threads))
        with self._lock:
            if self.closed:
                raise RuntimeError("the pool is closed")
            if n_segments > self._sync_lines:
                self._grow_sync(2 * n_segments)
            self._fns.run(self._address, nodes.ctypes.data, n, step, active, ends_address,
                          n_segments, self._sync_address)

    def _grow_sync(self, lines: int) -> None:
        buf, address = _aligned_zeros(lines * SYNC_LINE)
        self._sync.append(buf)
        self._sync_address, self._sync_lines = address, lines

    @property
    def slow_waits(self) -> int:
        """Segment waits so far that outlasted the pause phase (another thread was off-core)."""
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

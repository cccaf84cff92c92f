"""The native worker pool: every share of every node runs once, segments order them, shares go
to whichever thread claims them, workers stop."""
from __future__ import annotations

import ctypes
import gc
import platform
import sys
import threading
import time

import numpy as np
import pytest

from engine.kernels import jit, pool
from engine.kernels.pool import Graph, Pool

# Test tasks, each described above its IR.
TEST_IR = """
; every thread adds 1 to args[tid]
define void @mark(ptr %args, ptr %step, i64 %tid, i64 %n) {
  %p = getelementptr inbounds i64, ptr %args, i64 %tid
  %v = load i64, ptr %p
  %v1 = add i64 %v, 1
  store i64 %v1, ptr %p
  ret void
}

; thread 0 copies the marks table (args[0] points at it, args[1] = its length) into args[2..]
define void @snapshot(ptr %args, ptr %step, i64 %tid, i64 %n) {
entry:
  %first = icmp eq i64 %tid, 0
  br i1 %first, label %copy, label %done
copy:
  %table = load ptr, ptr %args
  %lenp = getelementptr inbounds i64, ptr %args, i64 1
  %len = load i64, ptr %lenp
  br label %loop
loop:
  %i = phi i64 [0, %copy], [%i1, %loop]
  %src = getelementptr inbounds i64, ptr %table, i64 %i
  %v = load i64, ptr %src
  %j = add i64 %i, 2
  %dst = getelementptr inbounds i64, ptr %args, i64 %j
  store i64 %v, ptr %dst
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %len
  br i1 %more, label %loop, label %done
done:
  ret void
}

; every thread stores the step pointer's first word + tid into args[tid]
define void @read_step(ptr %args, ptr %step, i64 %tid, i64 %n) {
  %s = load i64, ptr %step
  %v = add i64 %s, %tid
  %p = getelementptr inbounds i64, ptr %args, i64 %tid
  store i64 %v, ptr %p
  ret void
}

declare i32 @usleep(i32)
declare i64 @syscall(i64, ...)

; the share's OS thread id (gettid, x86-64 Linux) into args[share]
define void @who(ptr %args, ptr %step, i64 %tid, i64 %n) {
  %t = call i64 (i64, ...) @syscall(i64 186)
  %p = getelementptr inbounds i64, ptr %args, i64 %tid
  store i64 %t, ptr %p
  ret void
}

; share 1 sleeps 20 ms: whoever runs share 0 waits for it at the end of the graph
define void @late(ptr %args, ptr %step, i64 %tid, i64 %n) {
entry:
  %one = icmp eq i64 %tid, 1
  br i1 %one, label %sleep, label %done
sleep:
  %r = call i32 @usleep(i32 20000)
  br label %done
done:
  ret void
}
"""


@pytest.fixture(scope="module")
def task() -> dict[str, int]:
    lib = jit.compile_ir(TEST_IR)
    return {name: lib.address(name) for name in ("mark", "snapshot", "read_step", "late", "who")}


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_every_share_of_every_node_runs_once(task, n_threads: int) -> None:
    with Pool(n_threads) as p:
        marks = np.zeros(4, np.int64)
        g = Graph()
        for _ in range(5):
            g.add(task["mark"], marks, barrier=True)  # each thread writes only its own slot
        for _ in range(20):
            p.run(g)
        assert marks.tolist() == [100] * n_threads + [0] * (4 - n_threads)


def test_a_barrier_orders_nodes(task) -> None:
    """After a barrier, share 0 sees the writes every share made before it, run after run, with
    idle gaps now and then (so the workers sleep and shares move between threads)."""
    n = 3
    with Pool(n) as p:
        marks = np.zeros(n, np.int64)
        snap = np.zeros(2 + n, np.int64)
        snap[0], snap[1] = marks.ctypes.data, n
        g = Graph()
        for _ in range(4):
            g.add(task["mark"], marks)
            g.barrier()
            g.add(task["snapshot"], snap)
            g.barrier()
        for k in range(1, 120):
            if k % 10 == 0:
                time.sleep(0.005)
            p.run(g)
            assert snap[2:].tolist() == [4 * k] * n


def test_step_pointer_reaches_every_task(task) -> None:
    with Pool(2) as p:
        out = np.zeros(2, np.int64)
        step = np.array([40], np.int64)
        p.run_task(task["read_step"], out, int(step.ctypes.data))
        assert out.tolist() == [40, 41]


def test_first_graph_right_after_start(task) -> None:
    """A graph run before the workers' threads got going still finds them (no lost job)."""
    for _ in range(20):
        with Pool(2) as p:
            marks = np.zeros(2, np.int64)
            p.run_task(task["mark"], marks)
            assert marks.tolist() == [1, 1]


def test_empty_graph_is_a_no_op(task) -> None:
    with Pool(2) as p:
        p.run(Graph())


def _workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("modelyard-pool")}


def test_close_joins_the_workers_and_refuses_more_work(task) -> None:
    before = _workers()
    p = Pool(3)
    started = _workers() - before
    assert len(started) == 2
    p.run_task(task["mark"], np.zeros(3, np.int64))
    p.close()
    assert not any(t.is_alive() for t in started)
    with pytest.raises(RuntimeError, match="closed"):
        p.run_task(task["mark"], np.zeros(3, np.int64))
    p.close()  # twice is fine


def test_a_pool_nobody_closed_stops_when_collected(task) -> None:
    before = _workers()
    p = Pool(2)
    p.run_task(task["mark"], np.zeros(2, np.int64))
    started = _workers() - before
    del p
    gc.collect()
    for t in started:
        t.join(timeout=5)
        assert not t.is_alive()


def test_idle_workers_go_to_sleep_and_wake_up(task) -> None:
    """An idle pool's workers end up blocked in the kernel (no CPU), and a new graph wakes them."""
    with Pool(3) as p:
        marks = np.zeros(3, np.int64)
        p.run_task(task["mark"], marks)
        sleepers = ctypes.c_int32.from_address(p._address + pool._SLEEPERS)
        deadline = time.monotonic() + 10
        while sleepers.value < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sleepers.value == 2
        p.run_task(task["mark"], marks)
        assert marks.tolist() == [2, 2, 2]


def test_bad_thread_count() -> None:
    with pytest.raises(ValueError, match="n_threads"):
        Pool(0)


def test_a_graph_can_run_on_fewer_threads(task) -> None:
    """Threads past `threads` sit the run out; the tasks see the smaller count."""
    with Pool(3) as p:
        marks = np.zeros(3, np.int64)
        g = Graph()
        g.add(task["mark"], marks, barrier=True)
        g.add(task["mark"], marks)
        p.run(g, threads=2)
        p.run(g, threads=1)
        p.run(g, threads=9)  # clamped to the pool's size
        assert marks.tolist() == [6, 4, 2]


def test_a_barrier_wait_past_the_pause_phase_is_counted(task) -> None:
    """Thread 0 waits ~20 ms for a sleeping thread 1, far past the ~6 us of `pause`."""
    with Pool(2) as p:
        assert p.slow_waits == 0
        p.run_task(task["mark"], np.zeros(2, np.int64), threads=1)  # no barrier on one thread
        assert p.slow_waits == 0
        for _ in range(3):  # someone waits ~20 ms for share 1 (unless a thread was off its
            p.run_task(task["late"], np.zeros(1, np.int64))  # core all along: try thrice)
        p.run_task(task["mark"], np.zeros(2, np.int64))  # after every thread left the last job
        assert p.slow_waits >= 1


@pytest.mark.skipif(not (sys.platform == "linux" and platform.machine() == "x86_64"),
                    reason="the test task calls gettid by its x86-64 Linux number")
def test_a_share_runs_on_whichever_thread_claims_it(task) -> None:
    """Shares are claimed, not owned: a worker slow to wake (asleep after idling) does not hold
    up the graph, the caller runs its share too; each share still runs exactly once."""
    with Pool(2) as p:
        who = np.zeros(2, np.int64)
        g = Graph()
        g.add(task["who"], who)
        caller = threading.get_native_id()
        both = 0
        for _ in range(20):
            time.sleep(0.01)  # past ~3 ms idle the worker sleeps in futex_wait
            who[:] = 0
            p.run(g)
            assert who.all()
            both += int(who[1] == caller)
        assert both >= 1


def test_a_graph_of_more_segments_than_the_sync_lines_grows_them(task) -> None:
    with Pool(2) as p:
        lines = p._sync_lines
        marks = np.zeros(2, np.int64)
        g = Graph()
        for _ in range(lines + 5):
            g.add(task["mark"], marks, barrier=True)
        p.run(g)
        p.run(g, threads=1)
        assert p._sync_lines > lines
        assert marks.tolist() == [2 * (lines + 5), lines + 5]

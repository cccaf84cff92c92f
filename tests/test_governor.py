"""The thread governor's choices against simulated run times (a pure policy: no threads here)."""
from __future__ import annotations

from engine.kernels.governor import EXPLORE_EVERY, SAMPLES, ThreadGovernor

DECODE = ThreadGovernor.kind("last", 1)
SAMPLES_TO_FORGET = SAMPLES  # runs until the estimate holds only new times


def drive(gov: ThreadGovernor, cost: dict[int, float], runs: int) -> list[int]:
    """Run `runs` times with fixed per-thread-count costs; returns the counts chosen."""
    chosen = []
    for _ in range(runs):
        n = gov.choose(DECODE)
        gov.record(DECODE, n, cost[n])
        chosen.append(n)
    return chosen


def test_one_thread_has_nothing_to_choose() -> None:
    gov = ThreadGovernor(1)
    assert drive(gov, {1: 1.0}, 5) == [1] * 5


def test_tries_all_threads_first_then_the_caller_alone() -> None:
    gov = ThreadGovernor(2)
    assert drive(gov, {1: 5.0, 2: 3.0}, 2) == [2, 1]


def test_keeps_the_faster_count_and_retries_the_other_now_and_then() -> None:
    gov = ThreadGovernor(2)
    chosen = drive(gov, {1: 5.0, 2: 3.0}, 4 * EXPLORE_EVERY)
    assert chosen.count(1) == 1 + 3  # the first try, then at runs 32, 64, 96
    assert chosen[2:EXPLORE_EVERY] == [2] * (EXPLORE_EVERY - 2)


def test_a_busy_machine_moves_to_one_thread_and_a_quiet_one_back() -> None:
    gov = ThreadGovernor(2)
    drive(gov, {1: 5.0, 2: 3.0}, 10)
    busy = drive(gov, {1: 5.0, 2: 9.0}, 2 * EXPLORE_EVERY)   # another process took a core
    late = busy[SAMPLES_TO_FORGET:]
    assert late.count(1) >= len(late) - 2  # only the retries of two threads
    quiet = drive(gov, {1: 5.0, 2: 3.0}, 2 * EXPLORE_EVERY)
    late = quiet[EXPLORE_EVERY + SAMPLES_TO_FORGET:]     # after one retry saw two threads fast
    assert late.count(2) >= len(late) - 1


def test_kinds_are_timed_apart() -> None:
    gov = ThreadGovernor(2)
    prefill = ThreadGovernor.kind("last", 512)
    assert prefill != DECODE and ThreadGovernor.kind("last", 3) == ThreadGovernor.kind("last", 2)
    drive(gov, {1: 5.0, 2: 9.0}, 10)          # decode prefers one thread ...
    assert gov.choose(prefill) == 2           # ... prefill is still untried on two

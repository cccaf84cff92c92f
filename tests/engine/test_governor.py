"""The thread governor's choices against simulated run times (a pure policy: no threads here)."""
from __future__ import annotations

import itertools

from engine.kernels.governor import EXPLORE_EVERY, EXPLORE_MAX, SAMPLES, ThreadGovernor

DECODE = ThreadGovernor.kind("last", 1)


def drive(gov: ThreadGovernor, cost: dict[int, float], runs: int, kind: object = DECODE) -> list[int]:
    """Run `runs` times with fixed per-thread-count costs; returns the counts chosen."""
    chosen = []
    for _ in range(runs):
        n = gov.choose(kind)
        gov.record(kind, n, cost[n])
        chosen.append(n)
    return chosen


def retries(chosen: list[int], n: int) -> list[int]:
    return [i for i, c in enumerate(chosen) if c == n]


def test_one_thread_has_nothing_to_choose() -> None:
    gov = ThreadGovernor(1)
    assert drive(gov, {1: 1.0}, 5) == [1] * 5


def test_a_kind_runs_on_all_threads_until_its_first_retry() -> None:
    gov = ThreadGovernor(2)
    chosen = drive(gov, {1: 5.0, 2: 3.0}, EXPLORE_EVERY + 2)
    assert chosen[:EXPLORE_EVERY] == [2] * EXPLORE_EVERY  # a rare kind never runs on one thread
    assert chosen[EXPLORE_EVERY:] == [1, 2]


def test_losing_retries_come_ever_rarer_up_to_the_longest_wait() -> None:
    gov = ThreadGovernor(2)
    chosen = drive(gov, {1: 5.0, 2: 3.0}, 8 * EXPLORE_MAX)
    at = retries(chosen, 1)
    gaps = [b - a for a, b in itertools.pairwise(at)]
    assert at[0] == EXPLORE_EVERY
    assert gaps == sorted(gaps) and gaps[0] == 2 * EXPLORE_EVERY + 1
    assert gaps[-1] == EXPLORE_MAX + 1  # capped: a changed machine is still noticed
    assert len(at) <= len(chosen) // EXPLORE_MAX + 4  # the doublings, then one per longest wait


def test_a_busy_machine_moves_to_one_thread_within_a_few_runs() -> None:
    gov = ThreadGovernor(2)
    drive(gov, {1: 5.0, 2: 3.0}, 4 * EXPLORE_EVERY)   # one thread tried and found slower
    busy = drive(gov, {1: 5.0, 2: 9.0}, 2 * EXPLORE_EVERY)  # another process took a core
    late = busy[2 * SAMPLES:]  # the slow runs retry at once until two threads' old times age out
    assert late.count(1) >= len(late) - 1


def test_a_quiet_machine_moves_back_at_the_next_retry() -> None:
    gov = ThreadGovernor(2)
    drive(gov, {1: 5.0, 2: 3.0}, 4 * EXPLORE_EVERY)
    drive(gov, {1: 5.0, 2: 9.0}, 2 * EXPLORE_EVERY)
    quiet = drive(gov, {1: 5.0, 2: 3.0}, 2 * EXPLORE_MAX)
    first = quiet.index(2)
    assert first <= EXPLORE_MAX  # the retry that sees two threads fast again
    late = quiet[first:]
    assert late.count(1) <= len(late) // EXPLORE_EVERY  # only the (losing) retries of one thread


def test_kinds_are_timed_apart() -> None:
    gov = ThreadGovernor(2)
    prefill = ThreadGovernor.kind("last", 512)
    assert prefill != DECODE and ThreadGovernor.kind("last", 3) == ThreadGovernor.kind("last", 2)
    drive(gov, {1: 5.0, 2: 9.0}, EXPLORE_EVERY + 4)  # decode learns to prefer one thread ...
    assert gov.choose(DECODE) == 1
    assert gov.choose(prefill) == 2                   # ... prefill still starts on two


def test_a_long_prompt_deepening_over_the_cache_stays_on_all_threads() -> None:
    # SmolLM2's 6,000-token prompt in 512-token chunks, twice, on 2 threads (1 thread: 2x): each
    # chunk costs its matmuls plus attention over the rows before it, so a deep chunk takes 5x
    # the first; that is the work growing, not a busy machine, and is no reason to retry
    gov = ThreadGovernor(2)
    for _ in range(2):
        for pos in range(0, 6000, 512):
            n = min(512, 6000 - pos)
            kind = ThreadGovernor.kind("last", n, n * (pos + n))
            threads = gov.choose(kind)
            assert threads == 2, pos
            gov.record(kind, threads, (0.25 + 0.25 * pos / 1024) * n / 512 * (2 / threads))

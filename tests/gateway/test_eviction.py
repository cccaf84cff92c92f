"""The eviction and idle policy, as a spec: plain records in, decisions out."""
from __future__ import annotations

from gateway.fleet.eviction import (
    Blocked,
    Fits,
    Resident,
    TooLarge,
    idle_expired,
    next_idle_deadline,
    plan_load,
)
from gateway.fleet.lifecycle import ModelState

READY, LOADING, DRAINING = ModelState.READY, ModelState.LOADING, ModelState.DRAINING
GB = 1 << 30


def ready(key: str, last_used: float, memory: int = GB, **kw: object) -> Resident:
    return Resident(key=key, state=READY, memory_bytes=memory, last_used=last_used, **kw)  # type: ignore[arg-type]


def plan(residents: list[Resident], need: int = GB, max_loaded: int = 2,
         budget: int = 100 * GB) -> object:
    return plan_load(residents, need, max_loaded=max_loaded, memory_budget=budget)


def test_loads_without_eviction_when_there_is_room() -> None:
    assert plan([ready("a", 1.0)]) == Fits(())


def test_evicts_the_least_recently_used_beyond_max_loaded_models() -> None:
    residents = [ready("new", 30.0), ready("old", 10.0), ready("mid", 20.0)]
    assert plan(residents, max_loaded=3) == Fits(("old",))


def test_evicts_as_many_as_the_memory_budget_needs_oldest_first() -> None:
    residents = [ready("a", 1.0, 3 * GB), ready("b", 2.0, 3 * GB), ready("c", 3.0, 3 * GB)]
    # 9 GiB held + 4 GiB needed in a 7 GiB budget: 6 GiB must go, i.e. a and b.
    assert plan(residents, need=4 * GB, max_loaded=10, budget=7 * GB) == Fits(("a", "b"))


def test_evicts_only_what_is_needed() -> None:
    residents = [ready("a", 1.0, 1 * GB), ready("b", 2.0, 5 * GB)]
    # 6 held + 2 needed in 7: evicting a (LRU) frees enough; b stays.
    assert plan(residents, need=2 * GB, max_loaded=10, budget=7 * GB) == Fits(("a",))


def test_never_evicts_a_model_that_is_serving() -> None:
    residents = [ready("busy", 1.0, in_flight=1), ready("idle", 5.0)]
    assert plan(residents) == Fits(("idle",))


def test_waits_when_only_serving_models_could_make_room() -> None:
    result = plan([ready("busy", 1.0, in_flight=2)], max_loaded=1)
    assert isinstance(result, Blocked)
    assert "busy" in result.reason and "2 in flight" in result.reason


def test_never_evicts_a_pinned_model() -> None:
    residents = [ready("pinned", 1.0, pinned=True), ready("other", 9.0)]
    assert plan(residents) == Fits(("other",))


def test_a_load_that_only_pinned_models_block_is_too_large() -> None:
    result = plan([ready("pinned", 1.0, pinned=True)], max_loaded=1)
    assert isinstance(result, TooLarge)
    assert "pinned" in result.reason


def test_a_model_larger_than_the_budget_is_too_large() -> None:
    result = plan([], need=5 * GB, budget=4 * GB)
    assert isinstance(result, TooLarge)
    assert "5.0 GiB" in result.reason and "4.0 GiB" in result.reason


def test_loading_and_draining_models_hold_room_and_are_not_evicted() -> None:
    residents = [Resident("l", LOADING, memory_bytes=GB, last_used=0.0),
                 Resident("d", DRAINING, memory_bytes=GB, last_used=0.0)]
    result = plan(residents, max_loaded=1)
    assert isinstance(result, Blocked)
    assert "l (loading)" in result.reason and "d (draining)" in result.reason


def test_a_draining_model_counts_as_gone_so_nothing_more_is_evicted() -> None:
    residents = [Resident("leaving", DRAINING, memory_bytes=GB, last_used=0.0),
                 ready("stays", 1.0)]
    result = plan(residents, max_loaded=2)
    assert isinstance(result, Blocked) and "leaving" in result.reason


def test_evicts_beyond_what_is_already_draining_when_that_is_not_enough() -> None:
    residents = [Resident("leaving", DRAINING, memory_bytes=GB, last_used=0.0),
                 ready("old", 1.0), ready("new", 2.0)]
    assert plan(residents, max_loaded=2) == Fits(("old",))


def test_unloaded_and_failed_models_do_not_count() -> None:
    residents = [Resident("u", ModelState.UNLOADED), Resident("f", ModelState.FAILED),
                 ready("a", 1.0)]
    assert plan(residents, max_loaded=2) == Fits(())


def test_evicts_nothing_when_evicting_everything_evictable_would_not_be_enough() -> None:
    # The idle model alone cannot make room while the busy one holds most of the budget:
    # evicting it would be a loss for nothing, so the load waits instead.
    residents = [ready("idle", 1.0, 1 * GB), ready("busy", 2.0, 6 * GB, in_flight=1)]
    assert isinstance(plan(residents, need=2 * GB, max_loaded=10, budget=7 * GB), Blocked)


def test_idle_models_expire_after_their_timeout_from_the_last_use() -> None:
    residents = [ready("stale", last_used=100.0, idle_timeout=60.0),
                 ready("fresh", last_used=150.0, idle_timeout=60.0)]
    assert idle_expired(residents, now=170.0) == ["stale"]
    assert next_idle_deadline(residents) == 160.0


def test_idle_timeout_zero_means_never() -> None:
    residents = [ready("forever", last_used=0.0, idle_timeout=0.0)]
    assert idle_expired(residents, now=1e9) == []
    assert next_idle_deadline(residents) is None


def test_a_serving_model_is_never_idle() -> None:
    residents = [ready("busy", last_used=0.0, idle_timeout=1.0, in_flight=1)]
    assert idle_expired(residents, now=1e9) == []
    assert next_idle_deadline(residents) is None


def test_a_pinned_model_is_never_idle() -> None:
    residents = [ready("pinned", last_used=0.0, idle_timeout=1.0, pinned=True)]
    assert idle_expired(residents, now=1e9) == []


def test_only_ready_models_go_idle() -> None:
    residents = [Resident("l", LOADING, last_used=0.0, idle_timeout=1.0),
                 Resident("d", DRAINING, last_used=0.0, idle_timeout=1.0)]
    assert idle_expired(residents, now=1e9) == []

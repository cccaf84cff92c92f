"""The scheduler against a scripted stand-in model (tests/support/scripted_model.py); the real engine is
tested in test_batching and test_api."""
import asyncio
import dataclasses
import random
import threading

import numpy as np
import pytest

from engine.prompt import Prompt
from engine.sampling import SamplingParams
from gateway.generation.events import (
    Finished,
    GenerationCancelled,
    GenerationRequest,
    PromptProgress,
    QueueFullError,
    SchedulerClosedError,
    TextDelta,
)
from gateway.local import scheduler as scheduler_module
from gateway.local.scheduler import Scheduler
from gateway.local.stop_strings import StopScanner
from tests.support.scripted_model import FAIL, ScriptedModel, letters, script

# ------------------------------------------------------------------ StopScanner


def run_scanner(pieces, stops):
    scanner = StopScanner(stops)
    out, items = [], []
    for i, piece in enumerate(pieces):
        text, released = scanner.push(piece, i)
        out.append(text)
        items += released
        if scanner.stopped:
            break
    else:
        text, released = scanner.flush()
        out.append(text)
        items += released
    return "".join(out), items, scanner.stopped


def test_stop_string_across_tokens_is_cut_where_it_starts():
    text, items, stopped = run_scanner(["Hel", "lo wo", "rld"], ["o w"])
    assert (text, stopped) == ("Hell", True)
    assert items == [0, 1]  # the token holding "lo" is released with its surviving text


def test_possible_stop_prefix_is_held_until_it_cannot_match():
    scanner = StopScanner(["cd"])
    assert scanner.push("ab", 0) == ("ab", [0])
    assert scanner.push("xc", 1) == ("", [])           # "c" could begin "cd": hold the token
    assert scanner.push("e", 2) == ("xce", [1, 2])     # it did not
    assert scanner.push("c", 3) == ("", [])
    assert scanner.flush() == ("c", [3])


def test_no_stops_releases_everything_at_once():
    scanner = StopScanner([])
    assert scanner.push("abc", "x") == ("abc", ["x"])
    assert not scanner.stopped


@pytest.mark.parametrize("seed", range(200))
def test_released_text_is_the_text_before_the_first_stop(seed):
    rng = random.Random(seed)
    text = "".join(rng.choice("abc ") for _ in range(rng.randint(0, 40)))
    stops = ["".join(rng.choice("abc ") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
    cuts = (sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 10))))
            if len(text) > 1 else [])
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])] if text else []
    first = min((i for i in (text.find(s) for s in stops) if i >= 0), default=None)
    out, _, stopped = run_scanner(pieces, stops)
    assert out == (text if first is None else text[:first])
    assert stopped == (first is not None)


# ------------------------------------------------------------------ the scheduler


def request(text, max_tokens=100, stop=(), logprobs=False, extra=()):
    """Ask the scripted model to write `text` (then end), with extra raw tokens before the end."""
    ids = script(letters(text) + list(extra))
    return GenerationRequest(Prompt.of_tokens(ids), SamplingParams(temperature=1.0, seed=1),
                             max_tokens, tuple(stop), logprobs)


async def drain(generation):
    text, tokens, finished, progress = [], [], None, []
    async for event in generation:
        if isinstance(event, TextDelta):
            text.append(event.text)
            tokens += event.tokens
        elif isinstance(event, PromptProgress):
            progress.append(event)
        else:
            finished = event
    return "".join(text), tokens, finished


def run(main, **model_kw):
    """asyncio.run(main(scheduler, model)) with a scheduler that is always closed."""
    async def wrapper():
        model = ScriptedModel(**model_kw)
        sched = Scheduler(model, name="fake")
        try:
            return await main(sched, model)
        finally:
            sched.close()
    return asyncio.run(wrapper())


def test_an_observer_is_told_every_event_its_consumer_receives():
    class Observer:
        def __init__(self):
            self.seen = []

        def event(self, request, event):
            self.seen.append((request, event))

    observer = Observer()

    async def main(sched, model):
        observed = dataclasses.replace(request("abc", logprobs=True), observer=observer)
        generation = sched.submit(observed)
        return observed, [event async for event in generation]

    observed, events = run(main)
    assert events and isinstance(events[-1], Finished)
    assert observer.seen == [(observed, event) for event in events]


def test_finish_reasons_and_usage():
    async def main(sched, model):
        eog = await drain(sched.submit(request("abc")))
        length = await drain(sched.submit(request("abcd", max_tokens=2)))
        stop = await drain(sched.submit(request("abcde", stop=["cd"])))
        return eog, length, stop

    eog, length, stop = run(main, n_slots=1)
    assert eog[0] == "abc" and eog[2] == Finished("stop", 4, 3, cached_tokens=0)
    # one slot: each prompt finds the previous one's tokens there and reuses the common prefix
    assert length[0] == "ab" and length[2] == Finished("length", 5, 2, cached_tokens=3)
    assert stop[0] == "ab" and stop[2] == Finished("stop", 6, 4, cached_tokens=4, stop_word="cd")


def test_full_context_is_length_not_stop():
    async def main(sched, model):
        return await drain(sched.submit(request("abcdefghij")))

    text, _, finished = run(main, n_ctx=14)
    # 11 prompt tokens; the slot holds 14, so 3 more are evaluated and a 4th is sampled from them
    assert finished.finish_reason == "length" and text == "abcd" and finished.completion_tokens == 4


def test_logprobs_travel_with_their_tokens():
    async def main(sched, model):
        return await drain(sched.submit(request("abc", logprobs=True)))

    text, tokens, _ = run(main)
    assert [t.text for t in tokens] == list(text) == ["a", "b", "c"]
    assert tokens[0].bytes == b"a" and tokens[0].logprob == pytest.approx(0.0)


def test_concurrent_requests_share_each_forward_pass():
    async def main(sched, model):
        texts = ["abcdefgh", "bcdefghi", "cdefghij"]
        results = await asyncio.gather(*(drain(sched.submit(request(t))) for t in texts))
        return texts, results, model

    texts, results, model = run(main, n_slots=4)
    assert [r[0] for r in results] == texts
    decode_batches = [len(c.chunks) for c in model.calls if all(len(t) == 1 for _, t, _ in c.chunks)]
    assert max(decode_batches) == 3                        # one forward pass, three sequences
    assert len(model.calls) < sum(len(t) + 1 for t in texts)  # far fewer passes than one by one


def test_requests_beyond_the_slots_wait_in_order():
    async def main(sched, model):
        gens = [sched.submit(request(t)) for t in ("cc", "aa", "bb")]
        results = await asyncio.gather(*(drain(g) for g in reversed(gens)))
        return model, results[::-1]

    model, results = run(main, n_slots=1)
    assert [r[0] for r in results] == ["cc", "aa", "bb"]
    prefills = [c.chunks[0][1] for c in model.calls if len(c.chunks[0][1]) > 1]
    assert prefills == [request(t).prompt.token_ids() for t in ("cc", "aa", "bb")]


def test_cancelled_generation_leaves_the_batch_and_frees_its_slot():
    async def main(sched, model):
        gate = model.transformer.gate
        long = sched.submit(request("a" * 50))
        waiting = sched.submit(request("bb"))
        gate.release()
        first = await long.__anext__()
        assert (sched.active, sched.queued) == (1, 1)
        calls = len(model.calls)
        long.cancel()
        for _ in range(10):
            gate.release()
        text, _, finished = await asyncio.wait_for(drain(waiting), 10)
        with pytest.raises(GenerationCancelled):
            await drain(long)     # whatever it had produced, then the news
        return model, calls, first, text, finished

    model, calls, first, text, finished = run(main, n_slots=1, gate=threading.Semaphore(0))
    assert first.text == "a"
    long_passes = [c for c in model.calls[calls:] if any(t == [1] for _, t, _ in c.chunks)]
    assert len(long_passes) <= 1          # at most the pass already under way
    assert text == "bb" and finished.finish_reason == "stop"


def test_leaving_the_context_early_cancels():
    async def main(sched, model):
        gate = model.transformer.gate
        gate.release()
        async with sched.submit(request("a" * 50)) as gen:
            await gen.__anext__()
        for _ in range(5):
            gate.release()
        follow = await asyncio.wait_for(drain(sched.submit(request("c"))), 10)
        return model, follow, sched.active

    model, follow, active = run(main, n_slots=1, gate=threading.Semaphore(0))
    assert follow[0] == "c" and active == 0
    assert len(model.calls) <= 6


def test_model_errors_reach_the_request_and_the_scheduler_survives():
    async def main(sched, model):
        with pytest.raises(RuntimeError, match="scripted failure"):
            failing = GenerationRequest(Prompt.of_tokens([1, FAIL, 99]), SamplingParams(), 10)
            await drain(sched.submit(failing))
        return await drain(sched.submit(request("b"))), sched.active, sched.queued

    (text, _, _), active, queued = run(main)
    assert text == "b" and (active, queued) == (0, 0)


def test_invalid_requests_are_refused_before_queueing():
    async def main(sched, model):
        with pytest.raises(ValueError, match="vocabulary"):
            sched.submit(GenerationRequest(Prompt.of_tokens([1, 500, 99]), SamplingParams(), 10))
        with pytest.raises(ValueError, match="context"):
            sched.submit(GenerationRequest(Prompt.of_tokens([1] * 64), SamplingParams(), 10))
        return sched.queued

    assert run(main) == 0


def test_queue_limit_and_close_fail_waiting_and_running_requests():
    async def main():
        gate = threading.Semaphore(0)
        model = ScriptedModel(n_slots=2, gate=gate)
        sched = Scheduler(model, name="fake", max_queue=2)
        running = [sched.submit(request("aaa")), sched.submit(request("bbb"))]
        sched.submit(request("zz")).cancel()   # cancelled while waiting: frees its place
        gate.release()
        for gen in running:
            await gen.__anext__()             # both hold a slot now
        assert (sched.active, sched.queued) == (2, 0)
        waiting = [sched.submit(request("c")), sched.submit(request("d"))]
        with pytest.raises(QueueFullError):
            sched.submit(request("e"))
        assert (sched.active, sched.queued) == (2, 2)
        closer = asyncio.get_running_loop().run_in_executor(None, sched.close)
        await asyncio.sleep(0.05)
        gate.release()                        # the pass under way ends, then the thread stops
        await asyncio.wait_for(closer, 10)
        for gen in running + waiting:
            with pytest.raises(SchedulerClosedError):
                await asyncio.wait_for(drain(gen), 10)
        with pytest.raises(SchedulerClosedError):
            sched.submit(request("f"))
        assert (sched.active, sched.queued) == (0, 0)

    asyncio.run(main())


def test_max_queue_zero_still_fills_every_slot():
    async def main():
        gate = threading.Semaphore(0)
        sched = Scheduler(ScriptedModel(n_slots=2, gate=gate), name="fake", max_queue=0)
        try:
            gens = [sched.submit(request("a")), sched.submit(request("b"))]
            with pytest.raises(QueueFullError):
                sched.submit(request("c"))
            for _ in range(10):
                gate.release()
            return [(await asyncio.wait_for(drain(g), 10))[0] for g in gens]
        finally:
            gate.release(100)
            sched.close()

    assert asyncio.run(main()) == ["a", "b"]


def test_embeddings_run_in_the_batch():
    async def main(sched, model):
        gen = sched.submit(request("abcdef"))
        vec = await sched.embed([1, 2, 3])
        text = await drain(gen)
        return model, vec, text

    model, vec, text = run(main)
    # the scripted hidden state of a token is the token id in every column: mean 2, normalised
    assert np.allclose(vec, np.full(4, 0.5)) and vec.dtype == np.float32
    assert text[0] == "abcdef"
    assert any(c.output == "hidden" for c in model.calls)


def test_prompt_progress_for_a_prompt_read_in_several_steps():
    async def main():
        model = ScriptedModel(n_slots=1, n_ctx=256)
        sched = Scheduler(model, name="fake", prefill_budget=40, idle_budget=40)
        try:
            events = [e async for e in sched.submit(request("ab" * 50))]
            short = [e async for e in sched.submit(request("b"))]
            return events, short
        finally:
            sched.close()

    events, short = asyncio.run(main())
    progress = [e for e in events if isinstance(e, PromptProgress)]
    assert [(e.processed, e.total) for e in progress] == [(40, 101), (80, 101), (101, 101)]
    first_text = next(i for i, e in enumerate(events) if isinstance(e, TextDelta))
    assert first_text > events.index(progress[-1])
    assert not any(isinstance(e, PromptProgress) for e in short)  # read in one step: no progress


def _prefills(model):
    """The forward passes that read prompts: per pass, the prompts' first tokens."""
    return [[t[0] for _, t, _ in c.chunks if len(t) > 1] for c in model.calls
            if any(len(t) > 1 for _, t, _ in c.chunks)]


def test_requests_planned_together_are_read_in_one_step(monkeypatch):
    monkeypatch.setattr(scheduler_module, "GATHER_WAIT", 60.0)  # only arrivals end the wait

    async def main(sched, model):
        async def client(text, planning_takes):
            sched.arrivals.planning()           # as ServedModel.prepare does
            await asyncio.sleep(planning_takes)  # the template, the tokenizer
            return await drain(sched.submit(request(text)))

        results = await asyncio.wait_for(asyncio.gather(client("abc", 0), client("bcd", 0.05),
                                                        client("cde", 0.1)), 30)
        return results, model

    results, model = run(main, n_slots=4)
    assert [r[0] for r in results] == ["abc", "bcd", "cde"]
    # the first arrival waited for the two still being planned: one step read all three
    assert _prefills(model)[0] == [letters("abc")[0], letters("bcd")[0], letters("cde")[0]]


def test_a_request_that_fails_planning_holds_nothing_up(monkeypatch):
    monkeypatch.setattr(scheduler_module, "GATHER_WAIT", 60.0)

    async def main(sched, model):
        async def failing():
            sched.arrivals.planning()
            await asyncio.sleep(0.02)
            raise ValueError("a 400 in planning")

        bad = asyncio.ensure_future(failing())

        async def client():
            sched.arrivals.planning()
            return await drain(sched.submit(request("abc")))

        result = await asyncio.wait_for(client(), 30)  # not the 60 s the count could hold it
        with pytest.raises(ValueError):
            await bad
        return result, sched.arrivals.count()

    (text, _, finished), left = run(main)
    assert text == "abc" and finished.finish_reason == "stop" and left == 0


def test_decoding_streams_never_wait_for_arrivals(monkeypatch):
    monkeypatch.setattr(scheduler_module, "GATHER_WAIT", 60.0)

    async def main(sched, model):
        gate = model.transformer.gate                # one forward pass per permit
        running = sched.submit(request("a" * 40))
        next_event = asyncio.ensure_future(running.__anext__())
        while not next_event.done():                 # passes until its first token
            gate.release()
            await asyncio.sleep(0.01)
        first = next_event.result()                  # it decodes now (its next pass waits)
        never = asyncio.Event()

        async def stuck():
            sched.arrivals.planning()                # on its way, and it never comes
            await never.wait()

        waiting = asyncio.ensure_future(stuck())
        await asyncio.sleep(0)
        late = sched.submit(request("bcd"))          # arrives while "a..." decodes
        gate.release(1000)
        results = await asyncio.wait_for(asyncio.gather(drain(running), drain(late)), 30)
        never.set()
        await waiting
        return first, results

    first, (rest, late) = run(main, n_slots=2, n_ctx=128, gate=threading.Semaphore(0))
    assert first.text + rest[0] == "a" * 40 and late[0] == "bcd"


def test_counts_return_to_zero_and_the_thread_sleeps_when_idle():
    async def main(sched, model):
        gens = [sched.submit(request("ab" * (i + 1))) for i in range(6)]
        for g in gens[::2]:
            g.cancel()
        results = await asyncio.gather(*(drain(g) for g in gens[1::2]))
        steps = sched.runner._steps
        await asyncio.sleep(0.2)
        return results, (sched.active, sched.queued), steps, sched.runner._steps

    results, counts, steps, later = run(main, n_slots=2)
    assert [r[0] for r in results] == ["ab" * 2, "ab" * 4, "ab" * 6]
    assert counts == (0, 0) and later == steps


def test_metrics_record_queue_slots_batches_and_cache_hits():
    from gateway.metrics import MetricsSink

    class Recorder(MetricsSink):
        def __init__(self):
            self.calls = []

        def set_queue(self, model, n):
            self.calls.append(("queue", model, n))

        def set_active_slots(self, model, n):
            self.calls.append(("active", model, n))

        def observe_batch(self, model, size):
            self.calls.append(("batch", model, size))

        def add_prompt_cache_hits(self, model, n):
            self.calls.append(("hits", model, n))

    async def main():
        metrics = Recorder()
        sched = Scheduler(ScriptedModel(n_slots=3), name="fake", metrics=metrics)
        try:
            texts = ("abcdefgh", "ef", "ij", "kl")    # four for three slots: one waits
            await asyncio.gather(*(drain(sched.submit(request(t))) for t in texts))
            await drain(sched.submit(request("abcdefgh")))   # again: from the prompt cache
        finally:
            sched.close()
        return metrics.calls

    calls = asyncio.run(main())
    assert {c[1] for c in calls} == {"fake"}
    values = lambda kind: [c[2] for c in calls if c[0] == kind]  # noqa: E731
    assert max(values("batch")) == 3 and max(values("queue")) >= 1 and max(values("active")) == 3
    assert values("queue")[-1] == 0 and values("active")[-1] == 0
    assert sum(values("hits")) == 8   # the slot held "abcdefgh" + SEP: all but the last token


def test_served_model_reports_its_queue_and_slots():
    """The registry's /admin/models rows read `queued` and `active` from the served model."""
    from gateway.local.served_model import ServedModel

    async def main():
        gate = threading.Semaphore(0)
        served = ServedModel(ScriptedModel(n_slots=1, gate=gate), None, name="fake", max_queue=4)
        try:
            running = served.scheduler.submit(request("aaa"))
            waiting = served.scheduler.submit(request("b"))
            gate.release()
            await running.__anext__()          # the first holds the one slot, the second waits
            counts = served.occupancy()         # (queued, active)
            gate.release(100)
            await asyncio.wait_for(asyncio.gather(drain(running), drain(waiting)), 10)
            return counts, served.occupancy()
        finally:
            gate.release(100)
            served.scheduler.close()

    assert asyncio.run(main()) == ((1, 1), (0, 0))



"""The scheduler against a scripted stand-in model (the real engine is tested in test_api)."""
import asyncio
import random
import threading

import numpy as np
import pytest

from engine.sampling import Sampled, SamplingParams
from gateway.scheduler import (Finished, GenerationRequest, QueueFullError, Scheduler,
                               SchedulerClosedError, StopScanner, TextDelta)

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
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 10)))) if len(text) > 1 else []
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])] if text else []
    first = min((i for i in (text.find(s) for s in stops) if i >= 0), default=None)
    out, _, stopped = run_scanner(pieces, stops)
    assert out == (text if first is None else text[:first])
    assert stopped == (first is not None)


# ------------------------------------------------------------------ a scripted model

class FakeTokenizer:
    eog_ids = frozenset({0})

    def token_bytes(self, token):
        return chr(ord("a") + token - 1).encode()

    def incremental_decoder(self, skip_special=False):
        tok = self

        class Decoder:
            def push(self, token):
                return tok.token_bytes(token).decode()

            def flush(self):
                return ""
        return Decoder()


class FakeModel:
    """Generates the script given as the prompt: ids are the tokens to emit (0 = end)."""

    n_ctx = 64

    def __init__(self, gate=None):
        self.tokenizer = FakeTokenizer()
        self.calls = []          # (prompt, thread name)
        self.pulled = {}         # prompt -> tokens handed out
        self.gate = gate         # threading.Semaphore released once per token, when set

    def stream(self, ids, params, max_tokens):
        key = tuple(ids)
        self.calls.append((key, threading.current_thread().name))
        self.pulled[key] = 0
        for step, token in enumerate(ids):
            if step >= max_tokens or step + len(ids) >= self.n_ctx + 1:
                return
            if token == 0:
                return
            if token < 0:
                raise RuntimeError("scripted failure")
            if self.gate is not None:
                self.gate.acquire()
            self.pulled[key] += 1
            yield Sampled(token, -0.5, [(token, -0.5)])

    def embed(self, ids):
        self.calls.append((tuple(ids), threading.current_thread().name))
        return np.full(4, float(len(ids)), dtype=np.float32)


def request(ids, max_tokens=100, stop=(), logprobs=False):
    return GenerationRequest(list(ids), SamplingParams(), max_tokens, tuple(stop), logprobs)


async def drain(generation):
    text, tokens, finished = [], [], None
    async for event in generation:
        if isinstance(event, TextDelta):
            text.append(event.text)
            tokens += event.tokens
        else:
            finished = event
    return "".join(text), tokens, finished


def test_finish_reasons_and_usage():
    async def main():
        model = FakeModel()
        sched = Scheduler(model, name="fake")
        try:
            eog = await drain(sched.submit(request([1, 2, 3, 0, 4])))
            length = await drain(sched.submit(request([1, 2, 3, 4], max_tokens=2)))
            stop = await drain(sched.submit(request([1, 2, 3, 4, 5], stop=["cd"])))
            return eog, length, stop
        finally:
            sched.close()

    eog, length, stop = asyncio.run(main())
    assert eog[0] == "abc" and eog[2] == Finished("stop", 5, 3)
    assert length[0] == "ab" and length[2] == Finished("length", 4, 2)
    assert stop[0] == "ab" and stop[2] == Finished("stop", 5, 4)


def test_full_context_is_length_not_stop():
    async def main():
        model = FakeModel()
        model.n_ctx = 6
        sched = Scheduler(model, name="fake")
        try:
            return await drain(sched.submit(request([1, 2, 3, 4, 5])))
        finally:
            sched.close()

    text, _, finished = asyncio.run(main())
    assert finished.finish_reason == "length" and len(text) == finished.completion_tokens


def test_logprobs_travel_with_their_tokens():
    async def main():
        sched = Scheduler(FakeModel(), name="fake")
        try:
            return await drain(sched.submit(request([1, 2, 3], logprobs=True)))
        finally:
            sched.close()

    text, tokens, _ = asyncio.run(main())
    assert [t.text for t in tokens] == list(text) == ["a", "b", "c"]
    assert tokens[0].bytes == b"a" and tokens[0].top == [("a", b"a", -0.5)]


def test_requests_run_fifo_on_one_worker_thread():
    async def main():
        model = FakeModel()
        sched = Scheduler(model, name="fake")
        try:
            gens = [sched.submit(request([k, k])) for k in (3, 1, 2)]
            results = await asyncio.gather(*(drain(g) for g in reversed(gens)))
            return model, results[::-1]
        finally:
            sched.close()

    model, results = asyncio.run(main())
    assert [r[0] for r in results] == ["cc", "aa", "bb"]
    assert [c[0] for c in model.calls] == [(3, 3), (1, 1), (2, 2)]
    assert {c[1] for c in model.calls} == {"modelyard-fake"}


def test_cancelled_generation_stops_and_the_next_one_runs():
    async def main():
        gate = threading.Semaphore(0)
        model = FakeModel(gate)
        sched = Scheduler(model, name="fake")
        try:
            long = sched.submit(request([1] * 50))
            nxt = sched.submit(request([2, 2]))
            gate.release()
            first = await long.__anext__()
            long.cancel()
            for _ in range(10):  # let the worker notice; every token needs the gate
                gate.release()
            text, _, finished = await asyncio.wait_for(drain(nxt), 10)
            return model, first, text, finished
        finally:
            sched.close()

    model, first, text, finished = asyncio.run(main())
    assert first.text == "a"
    assert model.pulled[(1,) * 50] <= 3
    assert text == "bb" and finished.finish_reason == "stop"


def test_leaving_the_context_early_cancels():
    async def main():
        gate = threading.Semaphore(0)
        model = FakeModel(gate)
        sched = Scheduler(model, name="fake")
        try:
            gate.release()
            async with sched.submit(request([1] * 50)) as gen:
                await gen.__anext__()
            for _ in range(5):
                gate.release()
            follow = await asyncio.wait_for(drain(sched.submit(request([3]))), 10)
            return model, follow
        finally:
            sched.close()

    model, follow = asyncio.run(main())
    assert model.pulled[(1,) * 50] <= 3 and follow[0] == "c"


def test_model_errors_reach_the_request_and_the_worker_survives():
    async def main():
        sched = Scheduler(FakeModel(), name="fake")
        try:
            with pytest.raises(RuntimeError, match="scripted failure"):
                await drain(sched.submit(request([1, -1])))
            return await drain(sched.submit(request([2])))
        finally:
            sched.close()

    assert asyncio.run(main())[0] == "b"


def test_queue_limit_and_close_fail_waiting_and_running_requests():
    async def main():
        gate = threading.Semaphore(0)
        sched = Scheduler(FakeModel(gate), name="fake", max_queue=2)
        running = sched.submit(request([1, 1, 1]))
        sched.submit(request([9])).cancel()   # cancelled while waiting: skipped, frees its place
        gate.release()
        await running.__anext__()             # the worker holds it; it no longer waits
        waiting = [sched.submit(request([2])), sched.submit(request([3]))]
        with pytest.raises(QueueFullError):
            sched.submit(request([4]))
        closer = asyncio.get_running_loop().run_in_executor(None, sched.close)
        while not running._job.cancelled.is_set():
            await asyncio.sleep(0.01)
        gate.release()                        # the running job takes one more token, then sees it
        await asyncio.wait_for(closer, 10)
        for gen in [running] + waiting:
            with pytest.raises(SchedulerClosedError):
                await asyncio.wait_for(drain(gen), 10)
        with pytest.raises(SchedulerClosedError):
            sched.submit(request([5]))

    asyncio.run(main())


def test_max_queue_zero_still_runs_one_request():
    async def main():
        gate = threading.Semaphore(0)
        sched = Scheduler(FakeModel(gate), name="fake", max_queue=0)
        try:
            first = sched.submit(request([1]))
            with pytest.raises(QueueFullError):
                sched.submit(request([2]))
            gate.release()
            return await asyncio.wait_for(drain(first), 10)
        finally:
            sched.close()

    assert asyncio.run(main())[0] == "a"


def test_embeddings_run_on_the_worker():
    async def main():
        model = FakeModel()
        sched = Scheduler(model, name="fake")
        try:
            return model, await sched.embed([1, 2, 3])
        finally:
            sched.close()

    model, vec = asyncio.run(main())
    assert vec.tolist() == [3.0] * 4 and model.calls == [((1, 2, 3), "modelyard-fake")]

"""llama-server's stream telemetry on modelyard: `return_progress` (prompt_progress) and
`timings_per_token` (timings), on /completion, /v1/chat/completions and /v1/responses, and
llama-server's POST /chat/completions/input_tokens.

The expectations are llama.cpp's own: the rules its server test `test_return_progress`
(tools/server/tests/unit/test_chat_completion.py) checks a progress stream against, and the
shapes of tools/server/server-task.cpp (`result_prompt_progress::to_json`) and
server-common.cpp (`server_slot_stats::to_json`). With the reading budget in place of llama.cpp's
n_batch: one report when the slot starts (processed == cache), one per chunk read after it. A
stream that asks for none of it keeps OpenAI's shape, read by openai-python's own types.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import math
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from engine.batch import IDLE_PREFILL_BUDGET
from engine.prompt import Prompt
from engine.sampling import SamplingParams
from gateway.generation.events import GenerationRequest, PromptProgress, TextDelta
from gateway.local.scheduler import Scheduler
from tests.support.apps import Apps
from tests.support.scripted_model import ScriptedModel, letters, script

PROGRESS_KEYS = {"total", "cache", "processed", "time_ms"}
TIMINGS_KEYS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
                "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


def check_progress_stream(reports: list[dict[str, int]], batch: int) -> None:
    """test_return_progress's rules, and its count: a start report, then one per batch read."""
    assert reports and all(set(r) == PROGRESS_KEYS for r in reports)
    first, last = reports[0], reports[-1]
    assert first["total"] > 0 and first["cache"] == first["processed"]
    for before, now in itertools.pairwise(reports):
        assert (now["total"], now["cache"]) == (before["total"], before["cache"])
        assert now["processed"] > before["processed"] and now["time_ms"] >= before["time_ms"]
    assert last["processed"] == last["total"]
    assert len(reports) == 1 + math.ceil((first["total"] - first["cache"]) / batch)


# --------------------------------------------------------------------------------- the scheduler

def scripted(text: str, **flags: Any) -> GenerationRequest:
    return GenerationRequest(Prompt.of_tokens(script(letters(text))),
                             SamplingParams(temperature=1.0, seed=1), 100, **flags)


def as_dict(e: PromptProgress) -> dict[str, int]:
    return {"total": e.total, "cache": e.cached, "processed": e.processed,
            "time_ms": int(e.seconds * 1000)}


def run_scripted(requests_: list[GenerationRequest], budget: int) -> list[list[Any]]:
    """Each request's events, one after another, on one slot (the next reuses its prefix)."""
    async def main() -> list[list[Any]]:
        sched = Scheduler(ScriptedModel(n_slots=1, n_ctx=256), name="fake", prefill_budget=budget,
                          idle_budget=budget)
        try:
            return [[e async for e in sched.submit(r)] for r in requests_]
        finally:
            sched.close()
    return asyncio.run(main())


def test_return_progress_reports_the_start_then_every_chunk_read():
    long, again, short = run_scripted([scripted("ab" * 50, progress=True),
                                       scripted("ab" * 50, progress=True),
                                       scripted("b", progress=True)], budget=40)
    reports = [as_dict(e) for e in long if isinstance(e, PromptProgress)]
    check_progress_stream(reports, 40)
    assert [(r["processed"], r["cache"]) for r in reports] == [(0, 0), (40, 0), (80, 0), (101, 0)]
    # the same prompt again: its slot holds all of it but the last token, read in one chunk
    reports = [as_dict(e) for e in again if isinstance(e, PromptProgress)]
    check_progress_stream(reports, 40)
    assert reports[0]["cache"] == 100 and len(reports) == 2
    # a prompt read in one step reports too when asked (unasked it does not: test_scheduler.py)
    assert len([e for e in short if isinstance(e, PromptProgress)]) == 2
    for events in (long, again, short):
        last_progress = max(i for i, e in enumerate(events) if isinstance(e, PromptProgress))
        assert last_progress < next(i for i, e in enumerate(events) if isinstance(e, TextDelta))


def test_timings_per_token_puts_where_the_generation_stands_on_every_delta():
    timed, plain = run_scripted([scripted("abcdef", timings=True), scripted("abcdef")], budget=40)
    deltas = [e for e in timed if isinstance(e, TextDelta)]
    assert "".join(d.text for d in deltas) == "abcdef"
    counts = [d.timings.completion_tokens for d in deltas if d.timings is not None]
    assert len(counts) == len(deltas) and counts == sorted(counts) and counts[-1] == 6
    assert all(d.timings is not None and d.timings.prompt_tokens == 7 for d in deltas)
    assert all(e.timings is None for e in plain if isinstance(e, TextDelta))


# --------------------------------------------------------------------------------- the APIs

# ~300 tokens with the chat template. A lone request reads with nothing decoding beside it, so
# its steps take IDLE_PREFILL_BUDGET tokens each (llama.cpp's n_batch): 2 steps
LONG = "This is a test. " * 70


@pytest.fixture(scope="module")
def server(smollm2_path: Path, module_apps: Apps) -> Any:
    srv = module_apps.serve({"models": [{
        "model": str(smollm2_path), "aliases": ["smol"], "n_ctx": 1024, "n_parallel": 1}]})
    srv.openai = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)  # type: ignore[attr-defined]
    return srv


def stream(url: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """llama.cpp's tests/utils.py make_stream_request: the `data:` lines, up to [DONE]."""
    out = []
    with requests.post(url, json=data, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            text = line.decode()
            if "[DONE]" in text:
                break
            if text.startswith("data: "):
                out.append(json.loads(text[6:]))
    return out


@pytest.mark.real_model
@pytest.mark.parametrize("reuse_cache", [False, True])
def test_chat_return_progress_passes_llama_cpps_rules(server, reuse_cache):
    # a text no other test sends: without reuse, only the template's opening can match
    text = LONG if reuse_cache else "That was a test. " * 70
    body = {"model": "smol", "max_tokens": 4, "stream": True, "return_progress": True,
            "messages": [{"role": "user", "content": text}], "temperature": 0}
    if reuse_cache:
        stream(server.url + "/v1/chat/completions", body)
    chunks = stream(server.url + "/v1/chat/completions", body)
    reports = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    check_progress_stream(reports, IDLE_PREFILL_BUDGET)
    if reuse_cache:  # all of it but the last token, whose logits come next: 2 reports
        assert reports[0]["cache"] == reports[0]["total"] - 1 and len(reports) == 2
    else:  # the slot held another prompt: a few template tokens at most are reused
        assert reports[0]["cache"] < IDLE_PREFILL_BUDGET and len(reports) >= 3
    n_prompt = server.openai.chat.completions.create(
        model="smol", messages=body["messages"], max_tokens=1).usage.prompt_tokens
    assert reports[0]["total"] == n_prompt
    first_text = next(i for i, c in enumerate(chunks) if c["choices"] and
                      c["choices"][0]["delta"].get("content"))
    assert all(i < first_text for i, c in enumerate(chunks) if "prompt_progress" in c)


@pytest.mark.real_model
def test_completion_streams_progress_and_per_token_timings_in_llama_cpps_shape(server):
    chunks = stream(server.url + "/completion", {
        "prompt": LONG, "n_predict": 6, "stream": True, "return_progress": True,
        "timings_per_token": True, "temperature": 0, "cache_prompt": False})
    reports = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    check_progress_stream(reports, IDLE_PREFILL_BUDGET)
    assert all(c["content"] == "" and c["stop"] is False for c in chunks if "prompt_progress" in c)
    texts = [c for c in chunks if not c["stop"] and "prompt_progress" not in c]
    assert texts and all(set(c["timings"]) >= TIMINGS_KEYS for c in texts)
    assert [c["timings"]["predicted_n"] for c in texts] == [c["tokens_predicted"] for c in texts]
    final = chunks[-1]
    assert final["stop"] is True and final["timings"]["predicted_n"] == final["tokens_predicted"]
    # unasked: neither field
    plain = stream(server.url + "/completion", {"prompt": "Hi", "n_predict": 3, "stream": True})
    assert not any("prompt_progress" in c or ("timings" in c and not c["stop"]) for c in plain)


@pytest.mark.real_model
def test_chat_timings_per_token_and_the_usage_chunk(server):
    chunks = stream(server.url + "/v1/chat/completions", {
        "model": "smol", "max_tokens": 5, "stream": True, "timings_per_token": True,
        "stream_options": {"include_usage": True}, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello."}]})
    texts = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert texts and all(set(c["timings"]) >= TIMINGS_KEYS for c in texts)
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["timings"]["predicted_n"] == usage["usage"][
        "completion_tokens"]


@pytest.mark.real_model
def test_responses_telemetry_as_llama_cpps_test_reads_it(server):
    # test_responses_stream_with_llama_telemetry's request and checks
    events = stream(server.url + "/v1/responses", {
        "model": "smol", "input": LONG, "max_output_tokens": 8, "temperature": 0.8,
        "stream": True, "timings_per_token": True, "return_progress": True})
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    check_progress_stream([e["prompt_progress"] for e in progress], IDLE_PREFILL_BUDGET)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert any("timings" in e for e in deltas)
    assert all({"prompt_per_second", "predicted_per_second"} <= set(e["timings"])
               for e in events if "timings" in e)
    # llama-server closes every stream with response.completed; the response stays truthful
    completed = events[-1]
    assert completed["type"] == "response.completed"
    assert "usage" in completed["response"] and "timings" in completed
    cut = completed["response"]["usage"]["output_tokens"] == 8
    assert completed["response"]["status"] == ("incomplete" if cut else "completed")
    # every event, the extra ones too, is still a valid OpenAI event, numbered in order
    for e in events:
        EVENT.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


@pytest.mark.real_model
def test_openai_clients_read_a_telemetry_stream_and_see_none_unasked(server):
    with server.openai.responses.stream(model="smol", input="Name a colour.",
                                        max_output_tokens=6, temperature=0,
                                        extra_body={"return_progress": True,
                                                    "timings_per_token": True}) as s:
        kinds = [event.type for event in s]
        final = s.get_final_response()
    assert kinds.count("response.in_progress") >= 2 and final.output_text
    plain = stream(server.url + "/v1/responses", {"model": "smol", "input": LONG,
                                                  "max_output_tokens": 4, "stream": True})
    assert not any("prompt_progress" in e or "timings" in e for e in plain)
    kinds = [e["type"] for e in plain]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.count("response.in_progress") == 1
    # OpenAI's close: response.incomplete when max_output_tokens cut it
    cut = plain[-1]["response"]["usage"]["output_tokens"] == 4
    assert kinds[-1] == ("response.incomplete" if cut else "response.completed")


@pytest.mark.real_model
def test_chat_input_tokens_counts_what_the_chat_route_bills(server):
    messages = [{"role": "system", "content": "Book"},
                {"role": "user", "content": "What is the best book"}]
    billed = server.openai.chat.completions.create(model="smol", messages=messages,
                                                   max_tokens=1).usage.prompt_tokens
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        r = requests.post(server.url + path, json={"model": "smol", "messages": messages},
                          timeout=60)
        assert r.status_code == 200 and r.json() == {"input_tokens": billed}
    bad = requests.post(server.url + "/chat/completions/input_tokens", json={"model": "smol"},
                        timeout=60)
    assert bad.status_code == 400 and "messages" in bad.text

"""llama.cpp's server API on modelyard, driven as llama.cpp's own test suite drives llama-server
(`requests`, its paths and field names). Expectations: llama.cpp's reference outputs for SmolLM2
(tests/data/smollm2: greedy tokens, tokenizer ids), its README's shapes, and agreement with the
OpenAI routes of the same server."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import requests

from tests.support.apps import Apps
from tests.support.refs import REFS_DIR

pytestmark = pytest.mark.real_model

GREEDY = json.loads((REFS_DIR / "greedy.json").read_text())["prompts"]
TOKENIZE = json.loads((REFS_DIR / "tokenize.json").read_text())["items"]
N_PARALLEL = 3


class LlamaClient:
    """The calls llama.cpp's tests/utils.py makes: make_request and make_stream_request."""

    def __init__(self, url: str) -> None:
        self.url = url

    def make_request(self, method: str, path: str, data: Any = None,
                     headers: dict[str, str] | None = None) -> requests.Response:
        return requests.request(method, self.url + path, json=data, headers=headers, timeout=120)

    def make_stream_request(self, path: str, data: Any) -> list[dict[str, Any]]:
        out = []
        with requests.post(self.url + path, json=data, stream=True, timeout=120) as r:
            assert r.status_code == 200, r.text
            for line in r.iter_lines():
                text = line.decode()
                if text.startswith("data: ") and text != "data: [DONE]":
                    out.append(json.loads(text[6:]))
        return out


@pytest.fixture(scope="module")
def server(smollm2_path: Path, module_apps: Apps) -> Any:
    srv = module_apps.serve({"models": [{
        "model": str(smollm2_path), "aliases": ["smollm2", "smol"], "n_ctx": 1024,
        "n_parallel": N_PARALLEL}]})
    srv.llama = LlamaClient(srv.url)  # type: ignore[attr-defined]
    srv.openai = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)  # type: ignore[attr-defined]
    return srv


GREEDY_BODY = {"temperature": 0, "repeat_penalty": 1.0, "n_predict": 64, "return_tokens": True}


def test_completion_is_llama_cpps_greedy_continuation_with_its_fields(server):
    ref = GREEDY["capital"]
    r = server.llama.make_request("POST", "/completion", {"prompt": ref["prompt"], **GREEDY_BODY})
    assert r.status_code == 200, r.text
    body = r.json()
    # llama.cpp's greedy tokens up to "approximately" (the next digit is a near-tie there)
    assert body["tokens"][:14] == ref["raw_ids"][:14]
    # and exactly what the OpenAI route of the same engine gives
    same = server.openai.completions.create(model="smollm2", prompt=ref["prompt"], max_tokens=64,
                                            temperature=0, extra_body={"repeat_penalty": 1.0})
    assert body["content"] == same.choices[0].text
    assert (body["tokens_predicted"], body["tokens_evaluated"]) == (64, len(ref["prompt_ids"]))
    assert body["stop"] is True and body["stop_type"] == "limit" and body["truncated"] is False
    assert body["model"] == "smollm2" and body["generation_settings"]["n_predict"] == 64
    t = body["timings"]
    assert t["predicted_n"] == 64 and t["prompt_n"] + t["cache_n"] == len(ref["prompt_ids"])
    assert t["predicted_ms"] > 0 and t["predicted_per_second"] > 0


def test_a_prompt_of_token_ids_or_mixed_parts_reads_the_same(server):
    ref = GREEDY["capital"]
    ids = server.llama.make_request("POST", "/completion",
                                    {"prompt": ref["prompt_ids"], **GREEDY_BODY}).json()
    mixed = server.llama.make_request("POST", "/completion", {
        "prompt": [ref["prompt_ids"][0], " capital of France is"], **GREEDY_BODY}).json()
    assert ids["tokens"][:14] == ref["raw_ids"][:14] and ids["tokens"] == mixed["tokens"]


def test_several_prompts_give_an_array_in_order(server):
    body = server.llama.make_request("POST", "/completion", {
        "prompt": ["The capital of France is", "def fibonacci(n):"], "n_predict": 4,
        "temperature": 0}).json()
    assert isinstance(body, list) and [b["index"] for b in body] == [0, 1]
    assert body[0]["content"] == GREEDY["capital"]["completion_text"][:len(body[0]["content"])]


def test_the_stream_carries_the_same_text_then_a_final_chunk_with_timings(server):
    ref = GREEDY["capital"]
    chunks = server.llama.make_stream_request("/completion", {"prompt": ref["prompt"], "stream": True,
                                                              **GREEDY_BODY})
    *pieces, last = chunks
    assert all(c["stop"] is False for c in pieces) and last["stop"] is True
    whole = server.llama.make_request("POST", "/completion", {"prompt": ref["prompt"],
                                                              **GREEDY_BODY}).json()
    assert "".join(c["content"] for c in pieces) == whole["content"]
    assert [t for c in pieces for t in c["tokens"]] == whole["tokens"]
    assert last["timings"]["predicted_n"] == 64 and last["stop_type"] == "limit"


def test_n_probs_gives_each_tokens_alternatives_greedy_first(server):
    body = server.llama.make_request("POST", "/completion", {
        "prompt": "The capital of France is", "n_predict": 5, "temperature": 0, "n_probs": 3,
        "return_tokens": True}).json()
    probs = body["completion_probabilities"]
    assert len(probs) == 5 == len(body["tokens"])
    for p, token in zip(probs, body["tokens"]):
        assert p["id"] == token and len(p["top_logprobs"]) == 3
        assert p["top_logprobs"][0]["id"] == token  # greedy took the most likely one
        assert p["logprob"] == pytest.approx(p["top_logprobs"][0]["logprob"], abs=1e-4)
        lps = [a["logprob"] for a in p["top_logprobs"]]
        assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)


def test_post_sampling_probs_are_the_filtered_distribution(server):
    """llama.cpp's shape (server-task.cpp probs_vector_to_json): `prob` and `top_probs`; the
    kept candidates' probabilities are the sampler's (top_k 2 leaves two that sum to 1)."""
    body = server.llama.make_request("POST", "/completion", {
        "prompt": "Today was the day. Today I would finally become a", "n_predict": 4,
        "n_probs": 10, "temperature": 1.0, "top_k": 2, "top_p": 1.0, "min_p": 0.0,
        "post_sampling_probs": True, "return_tokens": True, "seed": 3}).json()
    probs = body["completion_probabilities"]
    assert len(probs) == 4 and body["generation_settings"]["post_sampling_probs"] is True
    for p, token in zip(probs, body["tokens"]):
        assert p["id"] == token and "logprob" not in p and 0.0 < p["prob"] <= 1.0
        tops = p["top_probs"]
        assert 1 <= len(tops) <= 2 and token in [t["id"] for t in tops]
        assert sum(t["prob"] for t in tops) == pytest.approx(1.0)
        assert p["prob"] == next(t["prob"] for t in tops if t["id"] == token)
    plain = server.llama.make_request("POST", "/completion", {
        "prompt": "Today was the day. Today I would finally become a", "n_predict": 1,
        "n_probs": 2, "temperature": 1.0, "top_k": 2, "seed": 3}).json()
    top2 = plain["completion_probabilities"][0]["top_logprobs"]
    logps = np.array([t["logprob"] for t in top2])
    first = server.llama.make_request("POST", "/completion", {
        "prompt": "Today was the day. Today I would finally become a", "n_predict": 1,
        "n_probs": 2, "temperature": 1.0, "top_k": 2, "top_p": 1.0, "min_p": 0.0,
        "post_sampling_probs": True, "seed": 3}).json()["completion_probabilities"][0]
    renormalised = np.exp(logps) / np.exp(logps).sum()  # top_k 2, then the softmax
    assert [t["prob"] for t in first["top_probs"]] == pytest.approx(list(renormalised), abs=1e-4)


def test_ignore_eos_shows_its_bans_in_generation_settings_logit_bias(server):
    """llama.cpp's format_logit_bias: [{bias, token}], a ban's -inf written as null."""
    banned = server.llama.make_request("POST", "/completion", {
        "prompt": "Once upon a time", "n_predict": 2, "ignore_eos": True}).json()
    bias = banned["generation_settings"]["logit_bias"]
    tokenizer = server.llama.make_request("POST", "/tokenize", {
        "content": "<|im_end|><|endoftext|>", "parse_special": True}).json()["tokens"]
    assert bias and all(b["bias"] is None for b in bias)
    assert set(tokenizer) <= {b["token"] for b in bias}
    plain = server.llama.make_request("POST", "/completion", {
        "prompt": "Once upon a time", "n_predict": 2, "logit_bias": [[42, 1.5]]}).json()
    assert plain["generation_settings"]["logit_bias"] == [{"bias": 1.5, "token": 42}]


def test_stop_words_end_with_stop_type_word(server):
    body = server.llama.make_request("POST", "/completion", {
        "prompt": "The capital of France is", "n_predict": 32, "temperature": 0,
        "stop": ["United"]}).json()
    assert body["stop_type"] == "word" and body["stopping_word"] == "United"
    assert body["content"] == " Paris.\n\nThe "  # llama.cpp's greedy text, cut before the word


def test_response_fields_keeps_only_those_and_lifts_nested_ones(server):
    body = server.llama.make_request("POST", "/completion", {
        "prompt": "The capital of France is", "n_predict": 3, "temperature": 0,
        "response_fields": ["content", "generation_settings/n_predict", "nope"]}).json()
    assert set(body) == {"content", "generation_settings/n_predict"}
    assert body["generation_settings/n_predict"] == 3 and body["content"]


def test_n_predict_0_reads_the_prompt_only(server):
    body = server.llama.make_request("POST", "/completion",
                                     {"prompt": "hello", "n_predict": 0}).json()
    assert body["content"] == "" and body["tokens_predicted"] == 0 and body["tokens_evaluated"] > 0


def test_bad_completion_bodies_are_400_naming_the_field(server):
    for body, param in [({"n_predict": 3}, "prompt"), ({"prompt": "x", "n_probs": 99}, "n_probs"),
                        ({"prompt": [1, 99999999]}, "prompt"),
                        ({"prompt": "x", "logit_bias": [[1, "up"]]}, "logit_bias")]:
        r = server.llama.make_request("POST", "/completion", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)


def test_tokenize_gives_llama_cpps_ids_and_detokenize_inverts_it(server):
    for item in TOKENIZE:
        if not item["text"]:
            continue
        r = server.llama.make_request("POST", "/tokenize", {"content": item["text"]})
        assert r.json()["tokens"] == item["ids"], item["text"]
        back = server.llama.make_request("POST", "/detokenize", {"tokens": item["ids"]}).json()
        if item["roundtrip_ok"]:
            assert back["content"] == item["text"]
        pieces = server.llama.make_request("POST", "/tokenize", {
            "content": item["text"], "with_pieces": True}).json()["tokens"]
        assert [p["id"] for p in pieces] == item["ids"]
        raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                       for p in pieces)
        if item["roundtrip_ok"]:
            assert raw == item["text"].encode()


def test_tokenize_add_special_and_parse_special(server):
    plain = server.llama.make_request("POST", "/tokenize", {"content": "<|im_start|>"}).json()
    literal = server.llama.make_request("POST", "/tokenize", {"content": "<|im_start|>",
                                                              "parse_special": False}).json()
    assert plain["tokens"] == [1] and len(literal["tokens"]) > 1  # <|im_start|> is id 1


def test_apply_template_renders_the_models_chat_template(server):
    r = server.llama.make_request("POST", "/apply-template",
                                  {"messages": [{"role": "user", "content": "hi"}]})
    prompt = r.json()["prompt"]
    assert "<|im_start|>user\nhi<|im_end|>\n" in prompt and prompt.endswith("<|im_start|>assistant\n")
    # the same text the chat route reads: its prompt token count matches
    chat = server.openai.chat.completions.create(model="smollm2", max_tokens=1,
                                                 messages=[{"role": "user", "content": "hi"}])
    ids = server.llama.make_request("POST", "/tokenize", {"content": prompt}).json()["tokens"]
    assert chat.usage.prompt_tokens == len(ids)
    # llama.cpp's add_generation_prompt false: the conversation without the assistant header
    bare = server.llama.make_request("POST", "/apply-template", {
        "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False})
    assert bare.json()["prompt"] + "<|im_start|>assistant\n" == prompt


def test_apply_template_hands_tools_and_reasoning_content_to_the_template(smollm2_path, module_apps):
    srv = module_apps.serve({"models": [{
        "model": str(smollm2_path), "aliases": ["smol-tools"], "n_ctx": 256, "n_parallel": 1,
        "chat_template": "{% for t in tools or [] %}{{ t.function.name }};{% endfor %}"
                         "{% for m in messages %}{{ m.reasoning_content or '-' }};{% endfor %}"}]})
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    with_tools = LlamaClient(srv.url).make_request("POST", "/apply-template", {
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "", "reasoning_content": "look it up"}],
        "tools": [tool, tool]}).json()
    # the request's tools in order; an assistant turn's reasoning_content, as llama.cpp passes it
    assert with_tools["prompt"] == "get_weather;get_weather;-;look it up;"


def test_apply_template_gives_the_template_the_chat_routes_reasoning_variables(
        smollm2_path, module_apps):
    """As the chat route: the entry's reasoning_effort none is enable_thinking false (llama-server's
    --reasoning off); a request's chat_template_kwargs reach the template too."""
    srv = module_apps.serve({"models": [{
        "model": str(smollm2_path), "aliases": ["nothink"], "n_ctx": 256, "n_parallel": 1,
        "reasoning_effort": "none",
        "chat_template": "{{ enable_thinking if enable_thinking is defined else 'unset' }}|"
                         "{{ flavour | default('-') }}"}]})
    client = LlamaClient(srv.url)
    ask = [{"role": "user", "content": "hi"}]
    assert client.make_request("POST", "/apply-template", {"messages": ask}).json() == {
        "prompt": "False|-"}
    kwargs = client.make_request("POST", "/apply-template", {
        "messages": ask, "chat_template_kwargs": {"flavour": "mint"}}).json()
    assert kwargs == {"prompt": "False|mint"}
    chat = requests.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": "nothink", "messages": ask, "max_tokens": 1}).json()
    assert chat["usage"]["prompt_tokens"] == len(client.make_request(
        "POST", "/tokenize", {"content": "False|-", "add_special": True}).json()["tokens"])


def test_props_and_slots_report_the_defaults_and_the_slots(server, smollm2_path):
    props = server.llama.make_request("GET", "/props").json()
    params = props["default_generation_settings"]["params"]
    # SmolLM2's file carries no general.sampling.*: llama.cpp's own defaults apply
    assert (params["temperature"], params["top_k"], params["top_p"], params["min_p"]) == (
        0.8, 40, 0.95, 0.05)
    assert props["total_slots"] == N_PARALLEL and props["model_path"] == smollm2_path.name
    assert "<|im_start|>" in props["chat_template"] and props["default_generation_settings"]["n_ctx"] == 1024
    slots = server.llama.make_request("GET", "/slots?model=smol").json()
    assert [s["id"] for s in slots] == list(range(N_PARALLEL))
    assert all(s["n_ctx"] == 1024 and s["params"]["top_k"] == 40 for s in slots)
    unknown = server.llama.make_request("GET", "/props?model=nope")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_health_shapes(server):
    for path in ("/health", "/v1/health"):
        r = server.llama.make_request("GET", path)
        assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_router_api_lists_status_and_loads_and_unloads(server):
    def status() -> dict[str, str]:
        data = server.llama.make_request("GET", "/models").json()["data"]
        return {m["id"]: m["status"]["value"] for m in data}

    assert set(status()) == {"smollm2", "smol"}
    assert server.llama.make_request("POST", "/models/load", {"model": "smol"}).json() == {"success": True}
    assert status() == {"smollm2": "loaded", "smol": "loaded"}
    unloaded = server.llama.make_request("POST", "/models/unload", {"model": "smollm2"})
    assert unloaded.json() == {"success": True}
    assert status() == {"smollm2": "unloaded", "smol": "unloaded"}
    missing = server.llama.make_request("POST", "/models/load", {"model": "nope"})
    assert missing.status_code == 404
    # /v1/models keeps OpenAI's shape: no llama.cpp `status` there
    assert "status" not in server.llama.make_request("GET", "/v1/models").json()["data"][0]


def test_openai_retrieve_gives_the_model_object_with_fenced_extras(server):
    model = server.openai.models.retrieve("smol")
    assert model.id == "smol" and model.object == "model"
    extras = model.model_extra["modelyard"]
    assert extras["architecture"] == "llama" and extras["quantization"] == "Q4_1"
    assert extras["context_length"] == 1024 and extras["n_ctx_train"] == 8192
    assert extras["aliases"] == ["smollm2", "smol"] and isinstance(extras["loaded"], bool)
    with pytest.raises(openai.NotFoundError) as err:
        server.openai.models.retrieve("gpt-4")
    assert err.value.body["code"] == "model_not_found"
    listed = {m.id: m.model_extra["modelyard"] for m in server.openai.models.list().data}
    assert listed["smol"]["quantization"] == "Q4_1"

"""Ollama's /api/* on SmolLM2, through the clients that speak it: ollama-python and LangChain's
ChatOllama, unchanged; and the requests Open WebUI sends (backend/open_webui/routers/ollama.py:
/api/version, /api/tags, /api/ps, /api/chat streamed, /api/show, and its unload request, a
/api/generate with an empty prompt and keep_alive 0).

Replies are judged by the clients' own types, `json`/`jsonschema`, and /v1's answers for the
same request (the same engine, seeded: the same text and the same vectors).
"""
from __future__ import annotations

import json
from datetime import datetime

import httpx
import jsonschema
import numpy as np
import ollama
import pytest

from tests.support.servers import Server, write_config

pytestmark = pytest.mark.real_model

ASK = [{"role": "user", "content": "Name a colour."}]
GREEDY = {"temperature": 0, "num_predict": 12, "seed": 1}


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
        "models": [{"model": str(smollm2_path), "aliases": ["smol"], "n_ctx": 2048,
                    "n_parallel": 4}]})
    srv = Server(config).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=120)


def test_chat_matches_v1_and_streams_the_same_text(server, client):
    whole = client.chat(model="smol", messages=ASK, options=GREEDY, stream=False)
    v1 = server.client.chat.completions.create(model="smol", messages=ASK, temperature=0,
                                               max_tokens=12, seed=1)
    assert whole.message.content == v1.choices[0].message.content
    assert whole.done and whole.done_reason == v1.choices[0].finish_reason
    assert whole.eval_count == v1.usage.completion_tokens
    assert whole.prompt_eval_count == v1.usage.prompt_tokens
    parts = list(client.chat(model="smol:latest", messages=ASK, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].model == "smol:latest" and parts[-1].eval_count == whole.eval_count


def test_root_says_ollama_is_running_to_the_client(server, client):
    # what the client's own connection (its headers: Accept application/json) gets at GET /
    # and HEAD /, the probes Open WebUI and the ollama CLI make before anything else
    r = client._client.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert client._client.head("/").status_code == 200
    browser = httpx.get(server.url + "/", headers={"Accept": "text/html,*/*;q=0.8"})
    assert browser.status_code == 200 and "<html" in browser.text.lower()


def test_the_stream_is_ndjson_one_object_per_line(server):
    with httpx.stream("POST", server.url + "/api/chat", timeout=60, json={
            "model": "smol", "messages": ASK, "options": GREEDY}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = list(r.iter_lines())
    objects = [json.loads(line) for line in lines]
    assert objects[-1]["done"] is True and all(not o["done"] for o in objects[:-1])
    assert all(o["message"]["role"] == "assistant" for o in objects)
    assert objects[-1]["total_duration"] >= objects[-1]["eval_duration"] > 0


def test_generate_templated_and_raw(server, client):
    templated = client.generate(model="smol", prompt="Name a colour.", options=GREEDY)
    v1 = server.client.chat.completions.create(model="smol", messages=ASK, temperature=0,
                                               max_tokens=12, seed=1)
    assert templated.response == v1.choices[0].message.content
    raw = client.generate(model="smol", prompt="The sky is", raw=True, options=GREEDY)
    legacy = server.client.completions.create(model="smol", prompt="The sky is", temperature=0,
                                              max_tokens=12, seed=1)
    assert raw.response == legacy.choices[0].text
    assert raw.prompt_eval_count == legacy.usage.prompt_tokens


def test_format_schema_and_json_mode_give_valid_json(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 20}},
              "required": ["colour"]}
    r = client.chat(model="smol", messages=ASK, format=schema,
                    options={"temperature": 0, "num_predict": 60})
    jsonschema.validate(json.loads(r.message.content), schema)
    r = client.generate(model="smol", prompt='Reply with exactly {"ok": true}', format="json",
                        options={"temperature": 0, "num_predict": 100})
    assert r.done_reason == "stop" and isinstance(json.loads(r.response), dict)


def add(a: int, b: int) -> int:
    """Add two integers

    Args:
      a: the first
      b: the second
    """
    return a + b


def test_tools_round_trip_with_the_client_types(client):
    messages = [{"role": "user", "content": "What is 2 plus 3? Use the tool."}]
    r = client.chat(model="smol", messages=messages, tools=[add],
                    options={"temperature": 0, "num_predict": 40})
    calls = r.message.tool_calls
    assert calls and calls[0].function.name == "add"
    assert set(calls[0].function.arguments) <= {"a", "b"}
    streamed = [p for p in client.chat(model="smol", messages=messages, tools=[add], stream=True,
                                       options={"temperature": 0, "num_predict": 40})
                if p.message.tool_calls]
    assert [c.function.name for c in streamed[0].message.tool_calls] == [c.function.name
                                                                        for c in calls]
    answer = client.chat(model="smol", options={"temperature": 0, "num_predict": 10}, messages=[
        *messages, r.message, {"role": "tool", "tool_name": "add", "content": "5"}])
    assert answer.done


def test_embed_is_v1_normalized_and_legacy_embeddings_raw(server, client):
    texts = ["a red apple", "the sea"]
    e = client.embed(model="smol", input=texts)
    v1 = server.client.embeddings.create(model="smol", input=texts)
    for got, want in zip(e.embeddings, v1.data):
        want_v = np.asarray(want.embedding)
        np.testing.assert_allclose(got, want_v / np.linalg.norm(want_v), rtol=1e-5, atol=1e-6)
    legacy = client.embeddings(model="smol", prompt="the sea")
    np.testing.assert_allclose(legacy.embedding, v1.data[1].embedding, rtol=1e-5, atol=1e-6)


def test_list_show_ps_version(server, client):
    client.chat(model="smol", messages=ASK, options={"num_predict": 1}, keep_alive="10m")
    listed = client.list().models
    assert [m.model for m in listed] == ["smol:latest"]
    assert listed[0].details.format == "gguf" and listed[0].size > 0
    shown = client.show("smol")
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert shown.modelinfo["llama.context_length"] == 2048
    running = client.ps().models
    assert [m.model for m in running] == ["smol:latest"] and running[0].context_length == 2048
    left = (running[0].expires_at - datetime.now(running[0].expires_at.tzinfo)).total_seconds()
    assert 500 < left <= 600  # keep_alive 10m, from the last use
    assert httpx.get(server.url + "/api/version").json()["version"]


def test_errors_are_ollamas_shape(server, client):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="nope", messages=ASK)
    assert e.value.status_code == 404 and "nope" in e.value.error
    r = httpx.post(server.url + "/api/chat", json={"model": "smol", "messages": ASK,
                                                   "options": {"num_ctx": 4096}})
    assert r.status_code == 400 and "num_ctx" in r.json()["error"]
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="smol", messages=ASK, think=True)
    assert e.value.status_code == 400 and "thinking" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("smol")
    assert e.value.status_code == 501 and "config file" in e.value.error
    r = httpx.post(server.url + "/api/chat", json={"model": "smol", "messages": [
        {"role": "user", "content": "what is this?", "images": ["aGVsbG8="]}]})
    assert r.status_code == 400 and "images" in r.json()["error"]


def test_load_and_unload_requests(server, client):
    loaded = client.chat(model="smol", messages=[])
    assert loaded.done and loaded.done_reason == "load"
    assert server.snapshot()["smol"]["state"] == "ready"
    unloaded = client.generate(model="smol:latest", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert server.snapshot()["smol"]["state"] == "unloaded"
    assert client.ps().models == []


def test_langchain_chat_ollama(server):
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model="smol", base_url=server.url, temperature=0, num_predict=12, seed=1)
    reply = llm.invoke("Name a colour.")
    v1 = server.client.chat.completions.create(model="smol", messages=ASK, temperature=0,
                                               max_tokens=12, seed=1)
    assert reply.content == v1.choices[0].message.content
    assert "".join(c.content for c in llm.stream("Name a colour.")) == reply.content
    tooled = ChatOllama(model="smol", base_url=server.url, temperature=0,
                        num_predict=40).bind_tools([add])
    call = tooled.invoke("What is 2 plus 3? Use the tool.").tool_calls
    assert call and call[0]["name"] == "add"


def test_open_webui_sequence(server):
    """What Open WebUI sends when a connection is added, a chat runs and a model is unloaded."""
    base = server.url
    version = httpx.get(f"{base}/api/version").json()
    assert tuple(int(x) for x in version["version"].split("."))  # it parses the parts as ints
    models = httpx.get(f"{base}/api/tags").json()["models"]
    assert {"name", "model", "modified_at", "size", "digest", "details"} <= set(models[0])
    name = models[0]["model"]
    with httpx.stream("POST", f"{base}/api/chat", timeout=60, json={
            "model": name, "stream": True, "messages": [
                {"role": "system", "content": "You are helpful."}, *ASK],
            "options": {"temperature": 0.7, "num_predict": 8}}) as r:
        objects = [json.loads(line) for line in r.iter_lines()]
    assert objects[-1]["done"] and objects[-1]["done_reason"] in ("stop", "length")
    assert all(set(o["message"]) <= {"role", "content", "thinking", "tool_calls"}
               for o in objects)
    running = httpx.get(f"{base}/api/ps").json()["models"]
    expires = {m["name"]: datetime.fromisoformat(m["expires_at"]) for m in running}
    assert name in expires
    show = httpx.post(f"{base}/api/show", json={"model": name}).json()
    assert {"details", "model_info", "capabilities", "template", "parameters"} <= set(show)
    unload = httpx.post(f"{base}/api/generate", json={"model": name, "keep_alive": 0,
                                                      "prompt": ""}).json()
    assert unload["done"] and unload["done_reason"] == "unload"

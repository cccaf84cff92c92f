"""API keys, per-key limits, CORS and per-request keep_alive, through real clients (openai,
httpx) against a server on a loopback port. Error bodies must have OpenAI's shape (the openai
client raises its typed errors from them)."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.support.ggufgen import write_tiny_llama
from tests.support.servers import Server

ALICE, BOB, ADMIN = "sk-alice-0123456789", "sk-bob-abcdefghij", "sk-admin-zyxwvut"
NO_EOG = {"0": -100, "1": -100, "2": -100}  # the tiny model's special tokens, banned
READY = "/health"  # the one path that needs no key


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("auth")
    return write_tiny_llama(d / "a.gguf", seed=1), write_tiny_llama(d / "b.gguf", seed=2)


@pytest.fixture(scope="module")
def server(models, module_apps, tmp_path_factory, monkeypatch_module) -> Any:
    a, b = models
    d = tmp_path_factory.mktemp("cfg")
    (d / "bob.key").write_text(BOB + "\n")
    monkeypatch_module.setenv("ALICE_KEY", ALICE)
    config = d / "modelyard.yaml"
    config.write_text(yaml.safe_dump({
        "auth": {"admin_key": ADMIN, "keys": [
            {"name": "alice", "key": "${ALICE_KEY}", "requests_per_minute": 1000},
            {"name": "bob", "key_file": "bob.key", "models": ["a"], "max_concurrent": 1,
             "requests_per_minute": 100},
        ]},
        "cors": {"allow_origins": ["http://app.example"]},
        "models": [{"model": str(a), "aliases": ["a", "a-too"], "n_ctx": 128},
                   {"model": str(b), "aliases": ["b"], "n_ctx": 128},
                   {"model": str(a), "aliases": ["a-long"], "n_ctx": 256}]}))  # a's file again
    return module_apps.serve(config, ready_path=READY)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def client(server: Any, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def chat(c: openai.OpenAI, model: str = "a", **kw: Any) -> Any:
    return c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=2, **kw)


def test_a_missing_or_wrong_key_is_401_in_openais_shape(server):
    missing = httpx.post(server.url + "/v1/chat/completions", json={"model": "a", "messages": []})
    assert missing.status_code == 401  # before the body is even looked at
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.AuthenticationError) as wrong:
        chat(client(server, "sk-alice-0123456788"))
    assert wrong.value.body["code"] == "invalid_api_key"
    assert "sk-alice" not in str(wrong.value.body)  # a key is never echoed


def test_bearer_and_x_api_key_both_work(server):
    assert chat(client(server, ALICE)).model == "a"
    r = httpx.post(server.url + "/v1/completions", headers={"X-Api-Key": BOB},
                   json={"model": "a", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_a_key_limited_to_some_models_gets_403_for_others_and_sees_only_its_own(server):
    bob = client(server, BOB)
    assert chat(bob, "a-too").model == "a-too"  # any alias of an allowed model
    with pytest.raises(openai.PermissionDeniedError) as err:
        chat(bob, "b")
    assert err.value.body["code"] == "model_not_allowed"
    with pytest.raises(openai.PermissionDeniedError):
        chat(bob, "a-long")  # another entry on a's file: other settings, not granted
    assert sorted(m.id for m in bob.models.list().data) == ["a", "a-too"]
    assert sorted(m.id for m in client(server, ALICE).models.list().data) == [
        "a", "a-long", "a-too", "b"]
    with pytest.raises(openai.PermissionDeniedError):
        bob.models.retrieve("b")
    r = httpx.post(server.url + "/completion", headers={"Authorization": f"Bearer {BOB}"},
                   json={"model": "b", "prompt": "x", "n_predict": 1})
    assert r.status_code == 403  # the llama.cpp routes ask the same question


def test_admin_endpoints_and_the_router_api_need_the_admin_key(server):
    for key, status in [(ALICE, 403), (ADMIN, 200)]:
        h = {"Authorization": f"Bearer {key}"}
        assert httpx.get(server.url + "/admin/models", headers=h).status_code == status
        r = httpx.post(server.url + "/models/load", headers=h, json={"model": "a"})
        assert r.status_code == status, r.text
    assert httpx.get(server.url + "/admin/status").status_code == 401
    # the admin key is a key for the API too
    assert chat(client(server, ADMIN)).model == "a"


def test_health_and_metrics_stay_public_and_metrics_name_keys_never_values(server):
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/v1/health").status_code == 200  # public alike
    text = httpx.get(server.url + "/metrics").text
    assert 'modelyard_key_requests_total{key="alice",status="200"}' in text
    assert 'key="-",status="401"' in text
    for secret in (ALICE, BOB, ADMIN):
        assert secret not in text


def test_requests_per_minute_is_429_with_retry_after(apps, models, tmp_path):
    a, _ = models
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"auth": {"keys": [
        {"name": "carol", "key": "sk-carol", "requests_per_minute": 2}]},
        "models": [{"model": str(a), "aliases": ["a"], "n_ctx": 64}]}))
    srv = apps.serve(config, ready_path=READY)
    carol = client(srv, "sk-carol")
    chat(carol), chat(carol)
    with pytest.raises(openai.RateLimitError) as err:
        chat(carol)
    assert err.value.body["code"] == "rate_limit_exceeded"
    assert 1 <= int(err.value.response.headers["Retry-After"]) <= 60


def test_max_concurrent_is_429_while_the_keys_other_request_runs(server):
    bob = client(server, BOB)
    started = threading.Event()
    done: list[Any] = []

    def long_stream() -> None:
        stream = bob.chat.completions.create(model="a", messages=[{"role": "user", "content": "x"}],
                                             max_tokens=60, stream=True, logit_bias=NO_EOG)
        for _ in stream:
            started.set()
        done.append(True)

    t = threading.Thread(target=long_stream)
    t.start()
    assert started.wait(30)
    with pytest.raises(openai.RateLimitError) as err:
        chat(bob)
    assert "max_concurrent" in err.value.body["message"]
    t.join(60)
    assert done
    assert chat(bob).model == "a"  # free again once the stream ended


def test_keys_are_never_logged(server, caplog):
    with caplog.at_level(logging.DEBUG):
        chat(client(server, ALICE))
        with pytest.raises(openai.AuthenticationError):
            chat(client(server, "sk-guess"))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "POST /v1/chat/completions 200" in logged
    assert ALICE not in logged and "sk-guess" not in logged


def test_llama_cpp_pythons_api_key_is_enforced(apps, models, tmp_path):
    a, _ = models
    config = tmp_path / "llama.json"
    config.write_text(f'{{"api_key": "sk-one", "models": [{{"model": "{a}", "model_alias": "a"}}]}}')
    srv = apps.serve(config, ready_path=READY)
    with pytest.raises(openai.AuthenticationError):
        chat(client(srv, "wrong"))
    assert chat(client(srv, "sk-one")).model == "a"


# ------------------------------------------------------------------ CORS

def test_cors_preflight_and_responses_for_allowed_origins_only(server):
    pre = httpx.options(server.url + "/v1/chat/completions", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 200  # answered before keys are checked
    assert pre.headers["access-control-allow-origin"] == "http://app.example"
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    other = httpx.options(server.url + "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "http://app.example",
                                                      "Authorization": f"Bearer {ALICE}"})
    assert r.headers["access-control-allow-origin"] == "http://app.example"


def test_no_cors_headers_without_cors_config(apps, models, tmp_path):
    a, _ = models
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"models": [{"model": str(a), "aliases": ["a"]}]}))
    srv = apps.serve(config, ready_path=READY)
    r = httpx.get(srv.url + "/v1/models", headers={"Origin": "http://app.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    pre = httpx.options(srv.url + "/v1/models", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in pre.headers


# ------------------------------------------------------------------ keep_alive

def state_of(srv: Server, alias: str) -> dict[str, Any]:
    rows = httpx.get(srv.url + "/admin/models").json()["data"]
    return next(r for r in rows if alias in r["aliases"])


def wait_state(srv: Server, alias: str, state: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while state_of(srv, alias)["state"] != state:
        assert time.monotonic() < deadline, state_of(srv, alias)
        time.sleep(0.05)


def test_keep_alive_0_unloads_after_the_request_and_minus_1_keeps_it(apps, models, tmp_path):
    a, _ = models
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"registry": {"idle_timeout": "1s"},
                                      "models": [{"model": str(a), "aliases": ["a"], "n_ctx": 64}]}))
    srv = apps.serve(config, ready_path=READY)
    c = client(srv, "x")
    chat(c, extra_body={"keep_alive": 0})
    wait_state(srv, "a", "unloaded", timeout=5)
    chat(c, extra_body={"keep_alive": -1})
    time.sleep(2.0)  # twice the idle timeout
    assert state_of(srv, "a")["state"] == "ready" and state_of(srv, "a")["keep_alive"] == -1
    chat(c, extra_body={"keep_alive": "300ms"})  # a duration, as Ollama takes it
    wait_state(srv, "a", "unloaded", timeout=5)
    chat(c)  # none: the config's idle_timeout again
    assert state_of(srv, "a")["keep_alive"] is None
    with pytest.raises(openai.BadRequestError) as err:
        chat(c, extra_body={"keep_alive": "soon"})
    assert err.value.body["param"] == "keep_alive"


def test_the_console_page_loads_without_a_key_but_its_admin_calls_need_one(server):
    page = httpx.get(server.url + "/", headers={"Accept": "text/html"})
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert httpx.get(server.url + "/").text == "Ollama is running"  # public too, as Ollama's
    assert httpx.get(server.url + "/admin/events").status_code == 401
    assert httpx.post(server.url + "/", json={}).status_code == 401  # only GET/HEAD are public

"""The prompt cache through the server: llama.cpp's slot actions (its
tools/server/tests/unit/test_slot_save.py's steps and numbers' meaning), the pool beyond the
slots shared across conversations, its blocks surviving an unload, and how it is reported
(llama.cpp's timings.cache_n, OpenAI's usage.prompt_tokens_details.cached_tokens, the
Prometheus counters). The independent expectation for every reuse: the same greedy text as a
cold read of the prompt (`cache_prompt: false`), and prompt_n + cache_n = the prompt's tokens.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests

from engine.prompt_cache import BLOCK
from engine.prompt_cache.disk import SUFFIX
from tests.support.apps import Apps

FRANCE = "What is the capital of France?"
GERMANY = "What is the capital of Germany?"
SYSTEM = ("You are a coding agent. You may call these tools: read_file(path), write_file(path, "
          "text), run(command), search(query). Answer briefly and precisely. ") * 16


def post(server: Any, path: str, data: Any = None) -> requests.Response:
    return requests.post(server.url + path, json=data, timeout=300)


def complete(server: Any, prompt: str, **extra: Any) -> dict[str, Any]:
    r = post(server, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0,
                                     "ignore_eos": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def n_tokens(server: Any, text: str) -> list[int]:
    return post(server, "/tokenize", {"content": text, "add_special": True}).json()["tokens"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cache")
    (root / "slots").mkdir()
    return root / "slots", root / "blocks"


@pytest.fixture(scope="module")
def server(smollm2_path: Path, module_apps: Apps, folders: tuple[Path, Path]) -> Any:
    slots, blocks = folders
    return module_apps.serve({"models": [{
        "model": str(smollm2_path), "aliases": ["smol"], "n_ctx": 2048, "n_parallel": 2,
        "prompt_cache": "256MiB", "prompt_cache_disk": "1GiB", "prompt_cache_dir": str(blocks),
        "slot_save_path": str(slots)}]})


def test_slot_save_restore_erase_as_llama_server(server):
    first = complete(server, FRANCE, id_slot=1)
    full = len(n_tokens(server, FRANCE))
    assert first["timings"]["prompt_n"] + first["timings"]["cache_n"] == full
    saved = post(server, "/slots/1?action=save", {"filename": "slot1.bin"})
    assert saved.status_code == 200, saved.text
    body = saved.json()
    # the slot holds the prompt and every generated token but the last (never evaluated)
    assert body["n_saved"] == full + 8 - 1 and body["id_slot"] == 1
    assert body["filename"] == "slot1.bin" and body["n_written"] > 0 and "save_ms" in body["timings"]
    common = next(i for i, (a, b) in enumerate(zip(n_tokens(server, FRANCE),
                                                   n_tokens(server, GERMANY))) if a != b)
    in_slot_1 = complete(server, GERMANY, id_slot=1)
    assert in_slot_1["timings"]["cache_n"] == common       # only the different part is read
    assert in_slot_1["timings"]["prompt_n"] == len(n_tokens(server, GERMANY)) - common
    restored = post(server, "/slots/0?action=restore", {"filename": "slot1.bin"})
    assert restored.status_code == 200, restored.text
    assert restored.json()["n_restored"] == body["n_saved"]
    assert restored.json()["n_read"] == body["n_written"]
    # slot 1 holds GERMANY now: erased, it can no longer lend slot 0 more than the file's prefix
    erased = post(server, "/slots/1?action=erase")
    assert erased.status_code == 200 and erased.json()["id_slot"] == 1
    assert erased.json()["n_erased"] == len(n_tokens(server, GERMANY)) + 8 - 1
    in_slot_0 = complete(server, GERMANY, id_slot=0)
    assert in_slot_0["timings"]["cache_n"] == common
    cold = complete(server, GERMANY, id_slot=0, cache_prompt=False)
    assert cold["timings"]["cache_n"] == 0
    assert in_slot_0["content"] == in_slot_1["content"] == cold["content"]


@pytest.mark.parametrize("name", ["../slot.bin", "a/b.bin", "..", "", "x\\y", "/etc/passwd"])
def test_a_filename_outside_the_folder_is_refused(server, folders, name):
    for action in ("save", "restore"):
        r = post(server, f"/slots/0?action={action}", {"filename": name})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "filename"
    assert not (folders[0].parent / "slot.bin").exists()


def test_bad_slot_actions_are_400_and_a_missing_file_changes_nothing(server):
    assert post(server, "/slots/7?action=erase").status_code == 400
    assert post(server, "/slots/x?action=erase").status_code == 400
    assert post(server, "/slots/0?action=dance").json()["error"]["param"] == "action"
    deep = requests.post(server.url + "/slots/0?action=save", data='{"a":' * 5000 + "1" + "}" * 5000,
                         headers={"content-type": "application/json"}, timeout=60)
    assert deep.status_code == 400
    complete(server, FRANCE, id_slot=0)
    r = post(server, "/slots/0?action=restore", {"filename": "nothing-here.bin"})
    assert r.status_code == 400 and "Unable to restore" in r.json()["error"]["message"]
    assert complete(server, FRANCE, id_slot=0)["timings"]["cache_n"] > 0  # still holds it


def test_without_a_slot_folder_the_actions_are_not_supported(smollm2_path, apps):
    client = apps.client({"models": [{"model": str(smollm2_path), "aliases": ["m"]}]})
    r = client.post("/slots/0?action=save", json={"filename": "a.bin"})
    assert r.status_code == 501 and "slot_save_path" in r.json()["error"]["message"]


def test_a_third_conversation_on_two_slots_and_an_unload_still_hit(server, folders):
    convs = [SYSTEM + f"\nUser {i}: task number {i}, please." for i in range(3)]
    system_tokens = len(n_tokens(server, SYSTEM))
    assert system_tokens > 2 * BLOCK
    for text in convs:  # three conversations through two slots
        complete(server, text)
    follow = convs[0] + " And then?"
    hit = post(server, "/v1/completions", {"model": "smol", "prompt": follow, "max_tokens": 8,
                                           "temperature": 0}).json()
    cached = hit["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 2 * BLOCK                     # the system prompt's blocks, at least
    assert post(server, "/models/unload", {"model": "smol"}).json() == {"success": True}
    assert list(folders[1].glob("*/*/*" + SUFFIX))  # its blocks went to disk
    back = complete(server, convs[2] + " And then?")
    assert back["timings"]["cache_n"] >= 2 * BLOCK  # mapped back on the new load
    cold = complete(server, convs[2] + " And then?", cache_prompt=False)
    assert back["content"] == cold["content"]
    metrics = requests.get(server.url + "/metrics", timeout=30).text
    assert 'modelyard_prompt_cache_misses_total{model="smol",reason="no_entry"}' in metrics


def test_every_api_reports_the_reused_tokens(server):
    """Ollama (>= 0.30: prompt_eval_count is the whole prompt, prompt_eval_cached_count the
    reused part), Anthropic's cache_read_input_tokens and OpenAI's cached_tokens agree with
    llama.cpp's timings of the same prompt read again."""
    prompt = SYSTEM + "\nUser: and the tests?"
    whole = len(n_tokens(server, prompt))
    body = {"model": "smol", "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_predict": 2, "temperature": 0}}
    post(server, "/api/generate", body)
    again = post(server, "/api/generate", body).json()
    assert again["prompt_eval_count"] == whole
    assert again["prompt_eval_cached_count"] == whole - 1   # the last token is read for its logits
    chat = {"model": "smol", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": prompt}]}
    post(server, "/v1/messages", chat)
    usage = post(server, "/v1/messages", chat).json()["usage"]
    assert usage["cache_read_input_tokens"] > 2 * BLOCK
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > usage["cache_read_input_tokens"]
    openai_usage = post(server, "/v1/chat/completions", chat).json()["usage"]
    assert openai_usage["prompt_tokens_details"]["cached_tokens"] == (
        usage["input_tokens"] + usage["cache_read_input_tokens"] - 1)


def test_a_long_miss_is_counted_and_logged_where_it_diverged(server, caplog):
    ids = n_tokens(server, SYSTEM + "\nUser: one more thing")
    complete(server, ids)
    other = ids[:300] + list(reversed(ids[300:]))  # the same 300 tokens, then others
    before = requests.get(server.url + "/metrics", timeout=30).text
    with caplog.at_level("INFO", logger="modelyard.scheduler"):
        done = complete(server, other)
    assert done["timings"]["cache_n"] == 300
    assert any("diverged at position 300 of" in r.getMessage() for r in caplog.records)
    after = requests.get(server.url + "/metrics", timeout=30).text
    line = 'modelyard_prompt_cache_misses_total{model="smol",reason="diverged"}'
    count = [float(t.split()[-1]) for t in after.splitlines() if t.startswith(line)]
    was = [float(t.split()[-1]) for t in before.splitlines() if t.startswith(line)] or [0.0]
    assert count and count[0] == was[0] + 1

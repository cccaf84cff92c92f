"""qwen35 through the gateway: modelyard scan accepts the synth3 files, and the hybrid model
served beside a dense one, its n choices batched, gives llama.cpp's greedy tokens (the
engine's checks are tests/engine/test_qwen35.py)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

import engine
from tests.support.refs import SYNTH3_DIR, SYNTH_DIR
from tests.support.scan_checks import assert_scan_accepts

MANIFEST = json.loads((SYNTH3_DIR / "qwen35_manifest.json").read_text())
ENTRIES = {e["file"][:-len(".gguf")]: e for e in MANIFEST["models"] if e["arch"] == "qwen35"}
F32 = "qwen35_d64_l4_gdn_f32"


def test_header_checks_and_scan_accept_the_files(tmp_path: Path) -> None:
    assert_scan_accepts(SYNTH3_DIR, ENTRIES, tmp_path, "qwen35", {"F32", "Q8_0"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    from tests.support.servers import Server, write_config

    config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
        "models": [
            {"model": str(SYNTH3_DIR / f"{F32}.gguf"), "aliases": ["hybrid"], "n_ctx": 128,
             "n_parallel": 3},
            {"model": str(SYNTH_DIR / "qwen3_d64_hd32_qknorm_f32.gguf"), "aliases": ["dense"],
             "n_ctx": 128, "n_parallel": 2},
        ],
    })
    srv = Server(config).start()
    yield srv
    srv.stop()


def test_served_beside_another_model_it_gives_llama_cpps_greedy_tokens(server) -> None:
    """Over HTTP, with the dense qwen3 asked at the same time and n = 3 choices batched (three
    slots' recurrent states stepped together): the prompt ids in, llama.cpp's greedy
    continuation out (its first 6 tokens; their top-two margins are 0.12 or more)."""
    ref = np.load(SYNTH3_DIR / f"{F32}.npz")
    ids, want = ref["ids"].tolist(), ref["greedy"].tolist()[:6]
    replies: dict[str, list[str]] = {}

    def ask(alias: str, n: int) -> None:
        r = server.client.completions.create(model=alias, prompt=ids, max_tokens=6, temperature=0,
                                             n=n, logit_bias={"493": -100, "495": -100})
        replies[alias] = [c.text for c in r.choices]

    threads = [threading.Thread(target=ask, args=a) for a in (("hybrid", 3), ("dense", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    with engine.load(SYNTH3_DIR / f"{F32}.gguf", n_ctx=128, n_threads=2) as model:
        text = model.tokenizer.decode(want)
    assert replies["hybrid"] == [text] * 3
    assert len(replies["dense"]) == 2


def test_a_request_continuing_an_earlier_one_resumes_from_its_state(server) -> None:
    """A second request whose prompt is the first one's plus new tokens resumes from the state
    checkpointed at the first prompt's end: usage reports those 40 tokens cached, and the
    reply is what the model gives that prompt read fresh (the engine, greedy)."""
    ref = np.load(SYNTH3_DIR / f"{F32}.npz")
    ids = [494, *ref["ids"].tolist()[:0:-1]]         # a prompt no earlier test sent
    more = ids + [5, 6, 7]
    bias = {"493": -100, "495": -100}
    first = server.client.completions.create(model="hybrid", prompt=ids, max_tokens=3,
                                             temperature=0, logit_bias=bias)
    second = server.client.completions.create(model="hybrid", prompt=more, max_tokens=4,
                                              temperature=0, logit_bias=bias)
    details = first.usage.prompt_tokens_details
    assert details is None or details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == len(ids)
    with engine.load(SYNTH3_DIR / f"{F32}.gguf", n_ctx=128, n_threads=2) as model:
        fresh = model.tokenizer.decode(list(model.generate(more, max_tokens=4, stop_at_eog=False)))
    assert second.choices[0].text == fresh

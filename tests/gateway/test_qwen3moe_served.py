"""qwen3moe through the gateway: modelyard scan accepts the synth3 files, and a served MoE
batched beside a dense model gives llama.cpp's greedy tokens (the engine's checks are
tests/engine/test_qwen3moe.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import engine
from tests.support.refs import SYNTH3_DIR, SYNTH_DIR
from tests.support.scan_checks import assert_scan_accepts

MANIFEST = json.loads((SYNTH3_DIR / "manifest.json").read_text())
ENTRIES = {e["file"][:-len(".gguf")]: e for e in MANIFEST["models"] if e["arch"] == "qwen3moe"}
F32 = "qwen3moe_d64_e8k2_f32"


def _load(name: str) -> engine.Model:
    return engine.load(SYNTH3_DIR / f"{name}.gguf", n_ctx=128, n_threads=2, flash_attn=False)


def test_header_checks_and_scan_accept_the_files(tmp_path: Path) -> None:
    assert_scan_accepts(SYNTH3_DIR, ENTRIES, tmp_path, "qwen3moe", {"F32", "Q8_0"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    from tests.support.servers import Server, write_config

    config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
        "models": [
            {"model": str(SYNTH3_DIR / f"{F32}.gguf"), "aliases": ["moe"], "n_ctx": 128,
             "n_parallel": 3},
            {"model": str(SYNTH_DIR / "qwen3_d64_hd32_qknorm_f32.gguf"), "aliases": ["dense"],
             "n_ctx": 128, "n_parallel": 2},
        ],
    })
    srv = Server(config).start()
    yield srv
    srv.stop()


def test_served_beside_another_model_it_gives_llama_cpps_greedy_tokens(server) -> None:
    """Over HTTP, with the dense qwen3 asked at the same time and n = 3 choices batched: the
    prompt ids in, llama.cpp's greedy continuation out (its first 6 tokens, margins > 0.13)."""
    import threading

    ref = np.load(SYNTH3_DIR / f"{F32}.npz")
    ids, want = ref["ids"].tolist(), ref["greedy"].tolist()[:6]
    replies: dict[str, list[str]] = {}

    def ask(alias: str, n: int) -> None:
        r = server.client.completions.create(model=alias, prompt=ids, max_tokens=6, temperature=0,
                                             n=n, logit_bias={"493": -100, "495": -100})
        replies[alias] = [c.text for c in r.choices]

    threads = [threading.Thread(target=ask, args=a) for a in (("moe", 3), ("dense", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    with _load(F32) as model:
        text = model.tokenizer.decode(want)
    assert replies["moe"] == [text] * 3
    assert len(replies["dense"]) == 2

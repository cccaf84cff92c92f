"""gemma4 through the gateway: modelyard scan and the header checks accept the synth3 files, and
a served gemma4 batched with other sequences, beside another model asked at the same time, gives
llama.cpp's greedy tokens (the engine's checks are tests/engine/test_gemma4.py)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

import engine
from tests.support.refs import SYNTH3_DIR, SYNTH_DIR
from tests.support.scan_checks import assert_scan_accepts

MANIFEST = json.loads((SYNTH3_DIR / "gemma4_manifest.json").read_text())
NAMES = [e["file"][:-len(".gguf")] for e in MANIFEST["models"]]
F32 = "gemma4_d64_l6_ple_kvshare_f32"
EOG = MANIFEST["models"][0]["llama_meta"]["eog_ids"]


def test_header_checks_and_scan_accept_the_files(tmp_path: Path) -> None:
    assert_scan_accepts(SYNTH3_DIR, NAMES, tmp_path, "gemma4", {"F32", "Q8_0"})


def test_a_config_naming_a_gemma4_file_is_accepted(tmp_path: Path) -> None:
    from gateway.config.loader import load_config

    path = tmp_path / "modelyard.yaml"
    path.write_text(f"models:\n  - model: {SYNTH3_DIR / f'{F32}.gguf'}\n    aliases: [g4]\n")
    config = load_config(path)
    assert [m.aliases for m in config.models] == [["g4"]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    from tests.support.servers import Server, write_config

    config = write_config(tmp_path_factory.mktemp("cfg") / "modelyard.yaml", {
        "models": [
            {"model": str(SYNTH3_DIR / f"{F32}.gguf"), "aliases": ["g4"], "n_ctx": 128,
             "n_parallel": 4},
            {"model": str(SYNTH_DIR / "gemma3_d64_l6_swa8_f32.gguf"), "aliases": ["g3"],
             "n_ctx": 128, "n_parallel": 2},
        ],
    })
    srv = Server(config).start()
    yield srv
    srv.stop()


def test_batched_beside_another_model_it_gives_llama_cpps_greedy_tokens(server) -> None:
    """Over HTTP: gemma4 asked for n = 3 choices of llama.cpp's prompt and, at the same time, a
    shorter prompt of its own, while gemma3 answers too. The prompt's choices are llama.cpp's
    greedy continuation (EOS not a stop there, so its end-of-generation ids are banned here;
    the greedy run holds none); the other sequence what it gives alone."""
    ref = np.load(SYNTH3_DIR / f"{F32}.npz")
    ids, want = ref["ids"].tolist(), ref["greedy"].tolist()[:8]
    assert not set(want) & set(EOG)
    other = ids[:17]
    bias = {str(t): -100 for t in EOG}
    replies: dict[str, list[str]] = {}

    def ask(key: str, alias: str, prompt: list[int], n: int) -> None:
        r = server.client.completions.create(model=alias, prompt=prompt, max_tokens=len(want),
                                             temperature=0, n=n, logit_bias=bias)
        replies[key] = [c.text for c in r.choices]

    jobs = (("g4", "g4", ids, 3), ("g4 other", "g4", other, 1), ("g3", "g3", ids[:10], 2))
    threads = [threading.Thread(target=ask, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    with engine.load(SYNTH3_DIR / f"{F32}.gguf", n_ctx=128, n_threads=2, flash_attn=False) as model:
        text = model.tokenizer.decode(want)
        alone_ids = list(model.generate(other, max_tokens=len(want), stop_at_eog=False))
        alone = model.tokenizer.decode(alone_ids)
    assert not set(alone_ids) & set(EOG)  # the ban changed nothing there either
    assert replies["g4"] == [text] * 3
    assert replies["g4 other"] == [alone]
    assert len(replies["g3"]) == 2

"""A loaded model whose file is deleted keeps serving from its mapping (the mapping holds the
whole file, as after a rename) until it unloads; loading it again then fails with a message
that names the file and says it is gone."""
from __future__ import annotations

from pathlib import Path

from tests.support.ggufgen import TINY_SPECIAL, write_tiny_llama

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "temperature": 0, "logit_bias": TINY_SPECIAL}


def test_a_deleted_file_is_served_from_the_mapping_until_the_model_unloads(apps, tmp_path: Path):
    path = write_tiny_llama(tmp_path / "m.gguf", seed=4)
    client = apps.client({"models": [{"model": str(path), "aliases": ["m"], "n_ctx": 64}]})
    before = client.post("/v1/chat/completions", json=CHAT)
    assert before.status_code == 200
    path.unlink()
    for _ in range(2):  # the check before the request and after each step both pass
        after = client.post("/v1/chat/completions", json=CHAT)
        assert after.status_code == 200, after.text
        assert after.json()["choices"][0]["message"] == before.json()["choices"][0]["message"]
    assert client.post("/admin/models/m/unload").status_code == 200
    gone = client.post("/v1/chat/completions", json=CHAT)
    assert gone.status_code == 500
    error = gone.json()["error"]
    assert error["code"] == "model_load_failed"
    assert "m.gguf" in error["message"] and "does not exist (deleted" in error["message"]
    assert str(tmp_path) not in error["message"]

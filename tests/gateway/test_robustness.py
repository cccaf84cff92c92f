"""A model whose numbers go bad fails its own requests with a clear error and stops being ready
(failed, with the reason); every other model keeps serving."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from starlette.testclient import TestClient

from engine.gguf import GGUFFile
from tests.support.apps import Apps
from tests.support.ggufgen import write_tiny_llama


def _poison(path: Path, tensor: str) -> None:
    """Overwrite one F32 tensor of a GGUF file with NaN, in place."""
    f = GGUFFile(path)
    info = f.tensors[tensor]
    offset, n = info.offset, info.n_bytes
    f.close()
    data = bytearray(path.read_bytes())
    data[offset:offset + n] = np.full(n // 4, np.nan, dtype=np.float32).tobytes()
    path.write_bytes(bytes(data))


def _row(client: TestClient, alias: str) -> dict:
    return next(r for r in client.get("/admin/models").json()["data"] if alias in r["aliases"])


def test_nan_logits_fail_the_request_not_the_server(apps: Apps, tmp_path: Path) -> None:
    bad = write_tiny_llama(tmp_path / "bad.gguf", qtype=Q.F32, seed=1)
    _poison(bad, "output_norm.weight")
    write_tiny_llama(tmp_path / "good.gguf", qtype=Q.Q8_0, seed=2)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("models:\n  - model: bad.gguf\n    aliases: [bad]\n"
                   "  - model: good.gguf\n    aliases: [good]\n")
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": "hello there"}]}
    client = apps.client(cfg, raise_server_exceptions=False)
    for _ in range(2):  # the second time: the bad model loads again and fails again
        r = client.post("/v1/chat/completions", json={"model": "bad", **body})
        assert r.status_code == 500, r.text
        assert r.json()["error"]["code"] == "model_failed"
        assert "non-finite logits" in r.json()["error"]["message"]
        row = _row(client, "bad")
        for _ in range(200):  # the request's lease goes back, then the model unloads
            if row["state"] == "failed":
                break
            time.sleep(0.01)
            row = _row(client, "bad")
        assert row["state"] == "failed" and "non-finite logits" in row["last_error"]
        r = client.post("/v1/chat/completions", json={"model": "good", **body})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
    r = client.post("/v1/chat/completions", json={"model": "bad", "stream": True, **body})
    assert r.status_code == 200  # headers went out before the failure: an error event
    assert "non-finite logits" in r.text and "[DONE]" not in r.text


def test_a_full_queue_is_a_503_before_a_stream_starts(apps: Apps, tmp_path: Path) -> None:
    """max_queue is checked before any header goes out: a stream that cannot queue gets a plain
    503 with Retry-After, not an error event inside a 200 stream."""
    import httpx

    write_tiny_llama(tmp_path / "tiny.gguf", qtype=Q.Q8_0, seed=3)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("models:\n  - model: tiny.gguf\n    aliases: [tiny]\n"
                   "    n_ctx: 4096\n    n_parallel: 1\n    max_queue: 0\n")
    server = apps.serve(cfg)
    body = {"model": "tiny", "stream": True, "max_tokens": 4000,
            "logit_bias": {"0": -100, "1": -100, "2": -100},  # no end-of-generation: runs long
            "messages": [{"role": "user", "content": "hello there"}]}
    with (httpx.Client(base_url=server.url, timeout=60) as client,
          client.stream("POST", "/v1/chat/completions", json=body) as first):
        assert first.status_code == 200
        lines = first.iter_lines()
        assert any('"content":"' in line and '"content":""' not in line for line in lines
                   if line.startswith("data:"))  # it is generating: the slot is taken
        second = client.post("/v1/chat/completions", json=body)
        assert second.status_code == 503, second.text
        assert second.headers.get("retry-after")
        assert second.json()["error"]["code"] == "server_busy"

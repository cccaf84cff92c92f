"""A model file that changes under its memory map (truncated in place, as `cp` over it or a failed
re-download does) stops being served cleanly, and never kills the process with SIGBUS."""
from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.ggufgen import TINY_SPECIAL, write_tiny_llama
from tests.support.paths import REPO
from tests.support.servers import ServerProcess


def _mapped_megabyte(path: Path) -> str:
    """Child-script lines leaving `a`: a read-only mapping of a fresh 1 MiB file of 0x01 bytes."""
    return textwrap.dedent(f"""
        import mmap, os, numpy as np
        path = {str(path)!r}
        open(path, "wb").write(b"\\x01" * (1 << 20))
        fd = os.open(path, os.O_RDONLY)
        m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        os.close(fd)
        a = np.frombuffer(m, np.uint8)
    """)


def _run_child(script: str) -> subprocess.CompletedProcess[str]:
    """Run a script in a fresh interpreter that imports this checkout's engine."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)


def test_a_fault_in_a_guarded_mapping_reads_zeros_instead_of_killing_the_process(
        tmp_path: Path) -> None:
    # in a child process: without the guard this would be a SIGBUS
    path = tmp_path / "data.bin"
    script = textwrap.dedent("""
        from engine import sigbus
    """) + _mapped_megabyte(path) + textwrap.dedent("""
        slot = sigbus.guard(a.ctypes.data, a.nbytes)
        before = int(a.sum())
        os.truncate(path, 8192)
        after = int(a.sum())  # every page past the new end faults once
        print(before, after, sigbus.healed())
        sigbus.unguard(slot)
    """)
    done = _run_child(script)
    assert done.returncode == 0, done.stderr
    before, after, healed = map(int, done.stdout.split())
    pages = (1 << 20) // mmap.PAGESIZE
    assert before == 1 << 20
    assert after == 8192                     # the pages still in the file; zeros after them
    assert healed == pages - 8192 // mmap.PAGESIZE


def test_a_fault_outside_every_guarded_mapping_still_reaches_the_previous_handler(
        tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    script = textwrap.dedent("""
        import faulthandler
        faulthandler.enable()
        from engine import sigbus
        assert sigbus.install()
    """) + _mapped_megabyte(path) + textwrap.dedent("""
        os.truncate(path, 8192)
        print(int(a.sum()))
    """)
    done = _run_child(script)
    assert done.returncode == -7  # SIGBUS, reported by faulthandler as without the guard
    assert "Bus error" in done.stderr


def test_a_forward_pass_over_a_truncated_file_completes_instead_of_faulting(
        tmp_path: Path) -> None:
    # the window no check can close: the file shrinks while a kernel reads the weights
    path = write_tiny_llama(tmp_path / "m.gguf", n_embd=256, n_ff=512, seed=6)
    script = textwrap.dedent(f"""
        import os, engine
        from engine import sigbus
        model = engine.load({str(path)!r}, n_ctx=64)
        before = sigbus.healed()
        os.truncate({str(path)!r}, 4096)
        logits = model.logits([1, 2, 3])
        print(logits.shape[0], sigbus.healed() - before, model.file_changed())
        model.close()
    """)
    done = _run_child(script)
    assert done.returncode == 0, done.stderr
    rows, healed, why = done.stdout.split(maxsplit=2)
    assert int(rows) == 3 and int(healed) > 0 and "changed size" in why


def _stream(url: str, model: str, max_tokens: int, events: list[str]) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": max_tokens, "stream": True, "logit_bias": TINY_SPECIAL}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])


@pytest.mark.slow
def test_truncating_a_served_file_fails_its_requests_and_nothing_else(tmp_path: Path) -> None:
    # bigger layers than the default tiny model, so a stream is still running when the file
    # shrinks, and a truncation reaches pages the forward pass reads
    a = write_tiny_llama(tmp_path / "a.gguf", n_embd=256, n_ff=512, n_layer=4, seed=1,
                         n_ctx_train=2048)
    b = write_tiny_llama(tmp_path / "b.gguf", seed=2)
    config = tmp_path / "modelyard.yaml"
    config.write_text(yaml.safe_dump({"models": [
        {"model": str(a), "aliases": ["a"], "n_ctx": 2048},
        {"model": str(b), "aliases": ["b"], "n_ctx": 128},
    ]}))
    server = ServerProcess(config, tmp_path / "server.log").wait_ready()
    try:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "logit_bias": TINY_SPECIAL}
        for model in ("a", "b"):
            assert httpx.post(server.url + "/v1/chat/completions", json={"model": model, **chat},
                              timeout=60).status_code == 200
        events: list[str] = []
        streaming = threading.Thread(target=_stream, args=(server.url, "a", 1900, events))
        streaming.start()
        deadline = time.monotonic() + 30
        while len(events) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(events) >= 5, events
        size = a.stat().st_size
        os.truncate(a, size // 3)            # in place: the mapping now reaches past the end
        streaming.join(60)
        assert not streaming.is_alive()
        assert server.process.poll() is None, server.log()   # no SIGBUS
        # the running stream ended with a clear error, not with garbage or a hang
        assert events[-1] != "[DONE]"
        error = json.loads(events[-1])["error"]
        assert "a.gguf" in error["message"] and "changed size" in error["message"]
        assert str(tmp_path) not in error["message"]
        # the model is unloaded and failed; the next request gets a clear load error
        deadline = time.monotonic() + 20
        while (row := _row(server, "a"))["state"] == "draining" and time.monotonic() < deadline:
            time.sleep(0.05)  # the stream's lease goes back, then the model closes
        assert row["state"] == "failed" and "changed size" in row["last_error"]
        r = httpx.post(server.url + "/v1/chat/completions", json={"model": "a", **chat},
                       timeout=60)
        assert r.status_code == 500 and r.json()["error"]["code"] == "model_load_failed"
        assert "truncated" in r.json()["error"]["message"]
        # the other model and the server live on
        assert httpx.post(server.url + "/v1/chat/completions", json={"model": "b", **chat},
                          timeout=60).status_code == 200
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        server.close()


def _row(server: ServerProcess, alias: str) -> dict:
    rows = httpx.get(server.url + "/admin/models").json()["data"]
    return next(r for r in rows if r["aliases"][0] == alias and not r["retiring"])


@pytest.mark.parametrize("change", ["truncate", "rewrite"])
def test_a_changed_file_is_seen_before_the_next_request_touches_it(tmp_path: Path,
                                                                   change: str) -> None:
    from gateway.config import ModelEntry
    from gateway.local.served_model import load_served_model

    path = write_tiny_llama(tmp_path / "m.gguf", seed=4)
    served = load_served_model(ModelEntry(model=path, aliases=["m"], n_ctx=64))
    try:
        assert served.file_changed() is None
        if change == "truncate":
            os.truncate(path, path.stat().st_size - 4096)
            assert "changed size" in (served.file_changed() or "")
        else:
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            time.sleep(0.01)
            with open(path, "r+b") as f:  # same size, new bytes, same inode
                f.write(data)
            assert "rewritten in place" in (served.file_changed() or "")
    finally:
        served.close()


def test_a_file_replaced_by_rename_keeps_being_served_from_the_old_mapping(
        tmp_path: Path) -> None:
    from gateway.config import ModelEntry
    from gateway.local.served_model import load_served_model

    path = write_tiny_llama(tmp_path / "m.gguf", seed=4)
    served = load_served_model(ModelEntry(model=path, aliases=["m"], n_ctx=64))
    try:
        fresh = write_tiny_llama(tmp_path / "new.gguf", seed=5)
        os.replace(fresh, path)
        assert served.file_changed() is None  # the old file is intact under our mapping
    finally:
        served.close()

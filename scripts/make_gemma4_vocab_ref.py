"""Make tests/data/synth3/gemma4_vocab.json: a tiny Gemma 4 vocabulary (tokenizer.ggml.model
"gemma4", merges, <0xXX> byte tokens, user-defined markers) and llama.cpp's token ids for sample
texts, so the engine's gemma4 encoder is tested against llama.cpp's own tokenizer.

The vocabulary replaces the tokenizer of the synth3 gemma4 Q8_0 file (384 tokens, so its tensors
still fit); llama-server loads the copy and answers /tokenize. Run on a machine with llama.cpp's
tools built: python scripts/make_gemma4_vocab_ref.py --peer-bin /work/llama/build/bin
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tests/data/synth3/gemma4_d64_l6_ple_kvshare_q8_0.gguf"
OUT = ROOT / "tests/data/synth3/gemma4_vocab.json"
N_VOCAB = 384
SP = "\u2581"
TEXTS = ["Hello world", "hello  world\n\nthe end\n", "naïve café ☕", "\n\n\n", "\n",
         "tab\there, then\r\nmore", " leading and trailing ", "<|turn>user\nhi<turn|>\n",
         "<|channel>thought\nhmm<channel|>ok", "x" * 40, "the the the"]


def vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): specials, 256 byte tokens, then normal tokens built by
    merges in rank order."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|channel>",
              "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|think|>"]
    types = [3, 3, 3, 2, 3, 3, 4, 4, 4, 4, 4, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    singles = ["\n", "\n\n", SP, *"abcdefghijklmnopqrstuvwxyzHT,.'é"]
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (SP, "w"), ("o", "r"),
              ("l", "d"), ("or", "ld"), (SP + "w", "orld"), ("t", "h"), ("th", "e"),
              (SP, "the"), ("e", "n"), (SP, "en"), (SP + "en", "d"), ("i", "n"), (SP, "a"),
              (SP, SP), ("x", "x"), ("xx", "xx"), ("a", "n"), ("an", "d"), (SP, "and"),
              ("H", "ello"), ("c", "a"), ("ca", "f"), (SP, "caf"), ("e", "r"), ("er", "e"),
              ("t", "a"), ("ta", "b"), ("i", "ng"), ("n", "g"), ("r", "e")]
    for t in singles:
        tokens.append(t)
        types.append(1)
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(1)
    while len(tokens) < N_VOCAB:
        tokens.append(f"[unused{len(tokens)}]")
        types.append(5)
    assert len(tokens) == N_VOCAB, len(tokens)
    return tokens, types, [f"{a} {b}" for a, b in merges]


def write_model(path: Path, tokens: list[str], types: list[int], merges: list[str]) -> None:
    r = GGUFReader(SRC)
    w = GGUFWriter(path, "gemma4")
    for name, field in r.fields.items():
        if name.startswith(("tokenizer.", "GGUF.", "general.architecture")):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            w.add_array(name, value)
        else:
            w.add_key_value(name, value, vtype)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_merges(merges)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)  # llama.cpp adds BOS for gemma4 anyway
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenize(bin_dir: Path, model: Path, texts: list[str]) -> list[list[int]]:
    port = 18931
    proc = subprocess.Popen([str(bin_dir / "llama-server"), "-m", str(model), "--port", str(port),
                             "-c", "128", "-t", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        out = []
        for text in texts:
            body = json.dumps({"content": text, "add_special": True, "parse_special": True})
            req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", body.encode(),
                                         {"Content-Type": "application/json"})
            out.append(json.loads(urllib.request.urlopen(req, timeout=10).read())["tokens"])
        return out
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-bin", type=Path, default=Path("/work/llama/build/bin"))
    args = ap.parse_args()
    tokens, types, merges = vocab()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "gemma4_vocab.gguf"
        write_model(model, tokens, types, merges)
        ids = tokenize(args.peer_bin, model, TEXTS)
    OUT.write_text(json.dumps({
        "made_by": "scripts/make_gemma4_vocab_ref.py: llama-server /tokenize (add_special, "
                   "parse_special) of llama.cpp as vendored by llama-cpp-python 0.3.36",
        "tokens": tokens, "token_type": types, "merges": merges,
        "bos_token_id": 2, "eos_token_id": 1, "unknown_token_id": 3, "padding_token_id": 0,
        "add_bos_token": False,
        "samples": [{"text": t, "ids": i} for t, i in zip(TEXTS, ids)]}, indent=1,
        ensure_ascii=False))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

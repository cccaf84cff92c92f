"""A token's raw bytes never outnumber its vocabulary text's UTF-8 bytes, on every tokenizer
family: the gateway's early "cannot fit the context" refusal (ServedModel.max_token_bytes) takes
the longest text as the bound without rendering every token. Checked against the rendering
itself (Vocab.token_bytes), on real and reference vocabularies of each family."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.gguf import GGUFFile
from engine.tokenizer import Tokenizer

DATA = Path(__file__).resolve().parents[1] / "data"
FILES = ["encoders/bert_d64_l2_mean_f32.gguf",          # WordPiece (## pieces)
         "encoders/qwen3_emb_d64_last_f32.gguf",        # byte-level BPE
         "synth3/gemma4_d64_l6_ple_kvshare_f32.gguf"]   # Gemma 4's SentencePiece


def _check(path: Path) -> None:
    f = GGUFFile(path)
    try:
        metadata = f.metadata
        tok = Tokenizer.from_metadata(metadata)
        texts = metadata["tokenizer.ggml.tokens"]
        for i in range(len(texts)):
            assert len(tok.token_bytes(i)) <= len(str(texts[i]).encode()), (i, texts[i])
    finally:
        f.close()


@pytest.mark.parametrize("name", FILES)
def test_reference_vocabularies(name: str) -> None:
    _check(DATA / name)


def test_smollm2(smollm2_path: Path) -> None:         # byte-level BPE with byte tokens
    _check(smollm2_path)


def test_gemma3(gemma3_path: Path) -> None:           # SentencePiece with <0x..> byte tokens
    _check(gemma3_path)

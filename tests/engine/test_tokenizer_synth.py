"""The synthetic models' vocabularies (a 496-token BPE in four pre-tokenizer flavours, a 384-token
SentencePiece with byte fallback) against llama.cpp's tokenizations of the sample strings in
tests/data/synth/manifest.json. Metadata is read with gguf-py, not with our reader."""
from __future__ import annotations

import functools
import json

import pytest

from engine.tokenizer import Tokenizer
from tests.support.refs import SYNTH_DIR

MANIFEST = json.loads((SYNTH_DIR / "manifest.json").read_text())
SAMPLES = [(m["file"], s) for m in MANIFEST["models"] for s in m["tokenize_samples"]]


@functools.cache
def _tokenizer(file: str) -> Tokenizer:
    from gguf import GGUFReader

    reader = GGUFReader(SYNTH_DIR / file)
    return Tokenizer.from_metadata(
        {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")})


@pytest.mark.parametrize(("file", "sample"), SAMPLES,
                         ids=[f"{f}:{s['text'][:20]!r}" for f, s in SAMPLES])
def test_synth_samples_tokenize_as_llama_cpp(file: str, sample: dict) -> None:
    tok = _tokenizer(file)
    ids = tok.encode(sample["text"], parse_special=True)
    assert ids == sample["ids"]
    assert tok.encode(sample["text"], parse_special=False) == sample["ids_special_false"]
    assert [tok.token_text(i) for i in ids] == sample["pieces"]
    assert (tok.decode(ids) == sample["text"]) is sample["roundtrip_ok"]

"""GGUF parsing and validation: good files read like gguf-py reads them; bad files raise
ModelLoadError naming the file and the problem, never crash."""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

import engine.gguf
from engine.gguf import VOCABULARY_KEYS, GGUFFile, ModelLoadError, UndecodedArray, read_header
from tests.support.ggufgen import tensor_type_field, write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf",
                            qtype=GGMLQuantizationType.F32)


def _assert_rejected(data: bytes, path: Path, match: str) -> None:
    """Written to `path`, `data` is refused with a ModelLoadError that names the file."""
    path.write_bytes(data)
    with pytest.raises(ModelLoadError, match=match) as e:
        GGUFFile(path)
    assert str(path) in str(e.value)


def test_reads_like_gguf_py(tiny: Path) -> None:
    f = GGUFFile(tiny)
    r = GGUFReader(tiny)
    assert set(f.tensors) == {t.name for t in r.tensors}
    for t in r.tensors:
        info = f.tensors[t.name]
        assert info.offset == t.data_offset
        assert info.n_bytes == t.n_bytes
        assert list(info.shape) == [int(d) for d in t.shape]
        assert np.array_equal(f.tensor_data(t.name), np.asarray(t.data).view(np.uint8).reshape(-1))
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        expected = field.contents()
        got = f.metadata[key]
        if isinstance(expected, float):
            assert got == pytest.approx(expected)
        else:
            assert got == expected, key
    f.close()


def test_read_header_keeps_nothing_mapped(tiny: Path) -> None:
    meta, tensors = read_header(tiny)
    assert meta["general.architecture"] == "llama"
    assert "token_embd.weight" in tensors
    assert str(tiny) not in Path("/proc/self/maps").read_text()
    f = GGUFFile(tiny)  # the check above can see a mapping: an open file shows up there
    assert str(tiny) in Path("/proc/self/maps").read_text()
    f.close()


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.01, 0.05, 0.2, 0.5, 0.9, 0.999])
def test_truncated_file_is_rejected(tiny: Path, tmp_path: Path, fraction: float) -> None:
    data = tiny.read_bytes()
    _assert_rejected(data[:int(len(data) * fraction)], tmp_path / "cut.gguf",
                     "truncated|too short|can hold")


def _read_header_in_small_steps(path: Path) -> None:
    read_header(path, vocabulary=False)


@pytest.mark.parametrize("reader", [GGUFFile, read_header, _read_header_in_small_steps])
def test_every_header_truncation_is_rejected(tiny: Path, tmp_path: Path, reader: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if reader is _read_header_in_small_steps:
        monkeypatch.setattr(engine.gguf, "HEADER_READ", 40)  # read on many times
    data = tiny.read_bytes()
    f = GGUFFile(tiny)
    header_end = f.data_start
    f.close()
    cut = tmp_path / "cut.gguf"
    for n in range(0, header_end, max(1, header_end // 300)):
        cut.write_bytes(data[:n])
        with pytest.raises(ModelLoadError) as e:
            reader(cut)
        assert str(cut) in str(e.value)


@pytest.mark.parametrize("first_read", [24, 100, 4096, 1 << 16])
def test_read_header_reads_what_the_mapped_file_holds(tiny: Path, first_read: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """However little it reads first (then reading on, doubling), read_header's metadata and
    tensor table are the mapped reader's."""
    monkeypatch.setattr(engine.gguf, "HEADER_READ", first_read)
    meta, tensors = read_header(tiny)
    f = GGUFFile(tiny)
    assert meta == f.metadata and tensors == f.tensors
    f.close()


def test_read_header_reads_the_header_not_the_weights(tiny: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    f = GGUFFile(tiny)
    header_end, size = f.data_start, f.file_size
    f.close()
    assert header_end * 10 < size  # the weights are most of the file
    read: list[int] = []
    real = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        data = real(fd, n, offset)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counting)
    monkeypatch.setattr(engine.gguf, "HEADER_READ", 256)
    read_header(tiny)
    assert header_end <= sum(read) <= 4 * header_end  # doubling: each read at most twice the last


def test_without_the_vocabulary_its_arrays_are_bounds_checked_not_decoded(
        tiny: Path, tmp_path: Path) -> None:
    full, tensors = read_header(tiny)
    meta, same_tensors = read_header(tiny, vocabulary=False)
    assert same_tensors == tensors and meta.keys() == full.keys()
    skipped = [key for key in meta if key in VOCABULARY_KEYS]
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"} <= set(skipped)
    for key, value in meta.items():
        if key in VOCABULARY_KEYS:
            assert isinstance(value, UndecodedArray) and len(value) == len(full[key]), key
        else:
            assert value == full[key], key
    # a token whose length runs past the end of the file is refused all the same
    data = bytearray(tiny.read_bytes())
    key = b"tokenizer.ggml.tokens"
    first_length = data.index(key) + len(key) + 4 + 4 + 8  # value type, item type, count
    for length in (len(data), 2**64 - 1):
        struct.pack_into("<Q", data, first_length, length)
        bad = tmp_path / "long-token.gguf"
        bad.write_bytes(bytes(data))
        with pytest.raises(ModelLoadError, match=r"truncated header: tokenizer\.ggml\.tokens") as e:
            read_header(bad, vocabulary=False)
        assert str(bad) in str(e.value)


def test_tensor_offset_past_the_end(tiny: Path, tmp_path: Path) -> None:
    data = bytearray(tiny.read_bytes())
    pos = tensor_type_field(bytes(data), "blk.0.attn_q.weight") + 4
    struct.pack_into("<Q", data, pos, len(data) * 4 // 32 * 32)
    _assert_rejected(bytes(data), tmp_path / "offset.gguf", "blk.0.attn_q.weight.*beyond the end")


def test_misaligned_tensor_offset(tiny: Path, tmp_path: Path) -> None:
    data = bytearray(tiny.read_bytes())
    pos = tensor_type_field(bytes(data), "output_norm.weight") + 4
    (old,) = struct.unpack_from("<Q", data, pos)
    struct.pack_into("<Q", data, pos, old + 1)
    _assert_rejected(bytes(data), tmp_path / "misaligned.gguf", "aligned")


def test_unknown_tensor_type(tiny: Path, tmp_path: Path) -> None:
    data = bytearray(tiny.read_bytes())
    pos = tensor_type_field(bytes(data), "output_norm.weight")
    struct.pack_into("<I", data, pos, 9999)
    _assert_rejected(bytes(data), tmp_path / "type.gguf", "unknown tensor type 9999")


@pytest.mark.parametrize("head, message", [
    (b"GGML\x03\x00\x00\x00", "not a GGUF file"),
    (b"GGUF\x01\x00\x00\x00", "unsupported GGUF version 1"),
    (b"GGUF\x00\x00\x00\x03", "big-endian"),
])
def test_bad_magic_and_version(tiny: Path, tmp_path: Path, head: bytes, message: str) -> None:
    _assert_rejected(head + tiny.read_bytes()[8:], tmp_path / "bad.gguf", message)


def test_missing_and_non_gguf_files(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"nope\.gguf does not exist"):
        GGUFFile(tmp_path / "nope.gguf")
    text = tmp_path / "notes.gguf"
    text.write_text("these are not the weights you are looking for" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        GGUFFile(text)


def test_random_header_corruption_never_crashes(tiny: Path, tmp_path: Path) -> None:
    """Flip random bytes in the header: parsing either succeeds or raises ModelLoadError."""
    data = tiny.read_bytes()
    f = GGUFFile(tiny)
    header_end = f.data_start
    f.close()
    rng = np.random.default_rng(1)
    bad = tmp_path / "flipped.gguf"
    for _ in range(200):
        buf = bytearray(data)
        for pos in rng.integers(4, header_end, size=3):
            buf[pos] ^= int(rng.integers(1, 256))
        bad.write_bytes(bytes(buf))
        try:
            GGUFFile(bad).close()
        except ModelLoadError:
            pass


def test_split_model_opens_as_one(tmp_path: Path) -> None:
    """A model split in three files reads as one tensor table, each tensor from its own part."""
    whole = write_tiny_llama(tmp_path / "whole.gguf", qtype=GGMLQuantizationType.F32)
    first = write_tiny_llama(tmp_path / "split.gguf", qtype=GGMLQuantizationType.F32,
                             split_max_tensors=8)
    assert first.name.endswith("-00001-of-00003.gguf")
    a, b = GGUFFile(whole), GGUFFile(first)
    assert set(a.tensors) == set(b.tensors)
    assert {t.part for t in b.tensors.values()} == {0, 1, 2}
    for name in a.tensors:
        assert np.array_equal(a.tensor_data(name), b.tensor_data(name)), name
    a.close()
    b.close()


def test_split_model_named_in_capitals_opens(tmp_path: Path) -> None:
    """NAME-00001-of-00003.GGUF: the other parts are looked for with the first part's suffix
    (the config generator groups parts case-insensitively, so what it lists must load)."""
    first = write_tiny_llama(tmp_path / "split.gguf", qtype=GGMLQuantizationType.F32,
                             split_max_tensors=8)
    for part in sorted(tmp_path.glob("split-*-of-00003.gguf")):
        part.rename(part.with_suffix(".GGUF"))
    f = GGUFFile(first.with_suffix(".GGUF"))
    assert {t.part for t in f.tensors.values()} == {0, 1, 2}
    f.close()


def test_split_model_with_a_missing_part(tmp_path: Path) -> None:
    first = write_tiny_llama(tmp_path / "split.gguf", qtype=GGMLQuantizationType.F32,
                             split_max_tensors=8)
    (tmp_path / first.name.replace("00001-of", "00003-of")).unlink()
    with pytest.raises(ModelLoadError, match=r"00003-of-00003.gguf does not exist"):
        GGUFFile(first)
    with pytest.raises(ModelLoadError, match="open the first part"):
        GGUFFile(tmp_path / first.name.replace("00001-of", "00002-of"))

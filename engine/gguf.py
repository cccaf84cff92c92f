"""Read and validate GGUF files; memory-map their tensor data. No model knowledge lives here.

The header is parsed by hand (types and block sizes come from the `gguf` package) because
`gguf.GGUFReader` builds one numpy array per vocabulary string and takes ~2 s on a 49k-token
vocabulary; this parser takes a few tens of milliseconds and checks every bound as it reads.

File layout (little-endian, version 2 or 3):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x  (string key, u32 value type, value)
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset)
    padding to `general.alignment` (default 32)
    tensor data: each tensor at data_start + offset
"""
from __future__ import annotations

import math
import mmap
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import sigbus
from .formats.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
MAX_DIMS = 4
# arrays of arrays, at most this deep: no model file nests metadata (llama.cpp's reader refuses
# any nesting), and a hostile file nesting thousands deep must be a ModelLoadError, not a
# RecursionError
MAX_ARRAY_DEPTH = 4
# read_header's first read: most headers but the vocabulary fit; a longer one is read on, doubling
HEADER_READ = 1 << 16


class ModelLoadError(Exception):
    """A model file that cannot be used: names the file and what is wrong with it."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]         # ggml order: shape[0] is the contiguous (row) dimension
    qtype: GGMLQuantizationType
    offset: int                    # absolute byte offset in its file
    n_bytes: int
    part: int = 0                  # which file of a split model holds it (0 = the first)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.FLOAT64: "<d",
    GGUFValueType.BOOL: "<?",
}


_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALAR_STRUCTS: dict[int, struct.Struct] = {t: struct.Struct(fmt) for t, fmt in _SCALARS.items()}
_DIMS = [struct.Struct(f"<{n}Q") for n in range(MAX_DIMS + 1)]  # a tensor's shape: n_dims u64
_TYPE_OFFSET = struct.Struct("<IQ")                              # its ggml type and data offset
_QTYPES: dict[int, GGMLQuantizationType] = {int(q): q for q in GGMLQuantizationType}

# The tokenizer's vocabulary-sized arrays. A header-only read for judging a file
# (read_header(..., vocabulary=False)) checks their bounds like any other value but does not
# decode them: it needs their length only, and decoding 150k strings is most of a header's cost.
VOCABULARY_KEYS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                             "tokenizer.ggml.scores", "tokenizer.ggml.merges"})


@dataclass(frozen=True)
class UndecodedArray:
    """A metadata array whose bounds were checked but whose items were not decoded."""

    item_type: GGUFValueType
    count: int

    def __len__(self) -> int:
        return self.count


class _Cursor:
    """Bounds-checked little-endian reads over a buffer holding the first bytes of a file of
    `size` bytes (all of them unless a `more` reader is given, which returns a longer prefix
    when a read runs past the buffer: a header is read without reading the weights after it)."""

    def __init__(self, buf: memoryview | bytes, path: str, size: int | None = None,
                 more: Callable[[int], bytes] | None = None) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path
        self.size = len(buf) if size is None else size
        self._more = more

    def fail(self, problem: str) -> ModelLoadError:
        return ModelLoadError(self.path, problem)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            self._grow(n, what)

    def _grow(self, n: int, what: str) -> None:
        """Read further into the file so that n bytes from pos are in the buffer, or fail."""
        end = self.pos + n
        if n >= 0 and end <= self.size and self._more is not None:
            self.buf = self._more(min(self.size, max(end, 2 * len(self.buf))))
            if end <= len(self.buf):
                return
        raise self.fail(f"truncated header: {what} at byte {self.pos} runs past the end "
                        f"of the file ({self.size} bytes)")

    def unpack(self, fmt: str, what: str) -> Any:
        return self.unpack_s(struct.Struct(fmt), what)

    def unpack_s(self, s: struct.Struct, what: str, whole: bool = False) -> Any:
        """One value of `s` (or, `whole`, the tuple of all its values)."""
        pos = self.pos
        if pos + s.size > len(self.buf):
            self._grow(s.size, what)
        self.pos = pos + s.size
        values = s.unpack_from(self.buf, pos)
        return values if whole else values[0]

    def string(self, what: str) -> str:
        pos = self.pos
        if pos + 8 > len(self.buf):
            self._grow(8, what)
        (n,) = _U64.unpack_from(self.buf, pos)
        pos = self.pos = pos + 8
        if n > len(self.buf) - pos:
            self._grow(n, what)
        self.pos = pos + n
        return bytes(self.buf[pos:pos + n]).decode("utf-8", errors="replace")

    def tensor_entry(self, i: int) -> tuple[str, tuple[int, ...], int, int]:
        """Tensor #i's entry in the tensor table: name, shape, ggml type id, data offset."""
        name = self.string(f"tensor #{i} name")
        n_dims = self.unpack_s(_U32, f"tensor {name} dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"tensor {name}: {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        dims = _DIMS[n_dims]
        pos = self.pos
        if pos + dims.size + _TYPE_OFFSET.size > len(self.buf):
            self._grow(dims.size + _TYPE_OFFSET.size, f"tensor {name} shape, type and offset")
        self.pos = pos + dims.size + _TYPE_OFFSET.size
        qtype_id, offset = _TYPE_OFFSET.unpack_from(self.buf, pos + dims.size)
        return name, dims.unpack_from(self.buf, pos), qtype_id, offset

    def strings(self, count: int, what: str, decode: bool = True) -> list[str] | UndecodedArray:
        """`count` strings in a row (vocabularies hold ~100k of them).

        One Python pass reads the lengths; the texts are then decoded in bulk: the bytes of all
        strings joined by NUL, decoded once and split. Strings that hold a NUL or invalid UTF-8
        send the array down the one-by-one path instead, which decodes like string(). Without
        `decode`, only the bounds are checked (_skip_strings).
        """
        start = self.pos
        if count * 8 > self.size - start:  # each string takes at least its 8-byte length
            raise self.fail(f"truncated header: {what} holds {count} strings, more than the "
                            f"{self.size - start} bytes left in the file can hold")
        if not decode:
            self._skip_strings(count, what)
            return UndecodedArray(GGUFValueType.STRING, count)
        lengths = self._string_lengths(count, what)
        pos, buf = self.pos, self.buf
        if count == 0:
            return []
        region = np.frombuffer(buf, dtype=np.uint8, count=pos - start, offset=start)
        lens = np.array(lengths, dtype=np.int64)                        # [count]
        heads = np.cumsum(lens + 8) - lens - 8                          # [count] prefix offsets
        kept = np.ones(region.shape[0], dtype=bool)
        kept[(heads[:, None] + np.arange(1, 8)).ravel()] = False        # drop 7 of the 8 bytes
        joined = region[kept]                                           # 1 byte + text per string
        joined[np.cumsum(lens + 1) - lens - 1] = 0                      # each string starts with NUL
        if np.count_nonzero(joined) != joined.shape[0] - count:  # a NUL inside some string
            return self._strings_one_by_one(start, count, what)
        try:
            return joined.tobytes().decode("utf-8").split("\0")[1:]
        except UnicodeDecodeError:
            return self._strings_one_by_one(start, count, what)

    def _skip_strings(self, count: int, what: str) -> None:
        """Move past `count` strings, checking each one's bounds: the fastest walk Python has
        (one unpack and one compare a string), reading on when a string runs past the buffer
        and failing, naming the spot, past the end of the file."""
        length = _U64.unpack_from
        done = 0
        while True:
            buf, pos = self.buf, self.pos
            end = len(buf)
            i = done
            try:
                for i in range(done, count):
                    after = pos + 8 + length(buf, pos)[0]
                    if after > end:
                        done = i
                        break
                    pos = after
                else:
                    done = count
            except (struct.error, OverflowError):  # its length runs past the buffer (or any size)
                done = i
            self.pos = pos
            if done == count:
                return
            self.need(8, what)  # string #done runs past the buffer: read on, or fail
            self.pos = pos + 8
            self.need(length(self.buf, pos)[0], what)
            self.pos = pos

    def _string_lengths(self, count: int, what: str) -> list[int]:
        """The lengths of `count` strings from pos, moving past them; reads on as needed."""
        buf, end, pos = self.buf, len(self.buf), self.pos
        length = _U64.unpack_from
        lengths: list[int] = []
        keep = lengths.append
        for _ in range(count):
            if pos + 8 > end or (n := length(buf, pos)[0]) > end - pos - 8:
                # this string runs past the buffer: read on (or fail past the end of the file)
                self.pos = pos
                self.need(8, what)
                (n,) = length(self.buf, pos)
                self.pos = pos + 8
                self.need(n, what)
                buf, end = self.buf, len(self.buf)
            pos += 8 + n
            keep(n)
        self.pos = pos
        return lengths

    def _strings_one_by_one(self, start: int, count: int, what: str) -> list[str]:
        end_pos, self.pos = self.pos, start
        out = [self.string(what) for _ in range(count)]
        assert self.pos == end_pos
        return out

    def value(self, vtype: int, what: str, depth: int = 0, decode: bool = True) -> Any:
        scalar = _SCALAR_STRUCTS.get(vtype)
        if scalar is not None:
            return self.unpack_s(scalar, what)
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype != GGUFValueType.ARRAY:
            raise self.fail(f"{what}: unknown value type {vtype}")
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"{what}: arrays nested more than {MAX_ARRAY_DEPTH} deep")
        item_type = self.unpack_s(_U32, what)
        count = self.unpack_s(_U64, what)
        if count > self.size:
            raise self.fail(f"{what}: array length {count} is larger than the file")
        item = _SCALAR_STRUCTS.get(item_type)
        if item is not None:
            size = item.size * count
            self.need(size, what)
            start = self.pos
            self.pos += size
            if not decode:
                return UndecodedArray(GGUFValueType(item_type), count)
            return np.frombuffer(self.buf, dtype=np.dtype(item.format), count=count,
                                 offset=start).tolist()
        if item_type == GGUFValueType.STRING:
            return self.strings(count, what, decode)
        if item_type != GGUFValueType.ARRAY:
            raise self.fail(f"{what}: unknown array item type {item_type}")
        return [self.value(item_type, what, depth + 1) for _ in range(count)]


def tensor_nbytes(qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if shape[0] % block_elems:
        raise ValueError(f"row length {shape[0]} is not a multiple of the {qtype.name} "
                         f"block size {block_elems}")
    return math.prod(shape) // block_elems * block_bytes


def _parse(cur: _Cursor, vocabulary: bool = True
           ) -> tuple[int, dict[str, Any], dict[str, TensorInfo], int]:
    """The header under `cur` (at its start); `vocabulary=False` leaves VOCABULARY_KEYS
    undecoded (UndecodedArray, bounds checked)."""
    file_size = cur.size
    cur.need(4, "magic")
    magic = bytes(cur.buf[:4])
    if magic != MAGIC:
        raise cur.fail(f"not a GGUF file (magic {magic!r}, expected {MAGIC!r})")
    cur.pos = 4
    version = cur.unpack_s(_U32, "version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and version:
            raise cur.fail("big-endian GGUF files are not supported")
        raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.unpack_s(_U64, "tensor count")
    n_kv = cur.unpack_s(_U64, "metadata count")
    # each entry takes at least 8+4 (kv) or 8+4+4+8 (tensor) bytes: reject absurd counts early
    if n_kv * 12 + n_tensors * 24 > file_size:
        raise cur.fail(f"header claims {n_kv} metadata entries and {n_tensors} tensors, more "
                       f"than a {file_size}-byte file can hold")
    meta: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        vtype = cur.unpack_s(_U32, key)
        scalar = _SCALAR_STRUCTS.get(vtype)  # most values: read here, without value()'s checks
        if scalar is not None:
            meta[key] = cur.unpack_s(scalar, key)
        else:
            meta[key] = cur.value(vtype, key, decode=vocabulary or key not in VOCABULARY_KEYS)
    alignment = meta.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment!r} is not a power of two")
    raw_infos = [cur.tensor_entry(i) for i in range(n_tensors)]
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, shape, qtype_id, offset in raw_infos:
        qtype = _QTYPES.get(qtype_id)
        if qtype is None:
            raise cur.fail(f"tensor {name}: unknown tensor type {qtype_id}")
        if min(shape) <= 0:
            raise cur.fail(f"tensor {name}: bad shape {list(shape)}")
        try:
            n_bytes = tensor_nbytes(qtype, shape)
        except (KeyError, ValueError) as e:
            raise cur.fail(f"tensor {name}: {e}") from None
        if offset % alignment:
            raise cur.fail(f"tensor {name}: data offset {offset} is not aligned to {alignment}")
        start = data_start + offset
        if start + n_bytes > file_size:
            raise cur.fail(f"tensor {name}: data [{start}, {start + n_bytes}) lies beyond the "
                           f"end of the file ({file_size} bytes); the file is truncated or corrupt")
        if name in tensors:
            raise cur.fail(f"tensor {name} appears twice")
        tensors[name] = TensorInfo(name, shape, qtype, start, n_bytes)
    return version, meta, tensors, data_start


def _open(path: Path) -> tuple[int, int]:
    """A read-only descriptor of `path` and the file's size, at least a header's 24 bytes;
    a ModelLoadError naming the file otherwise (the descriptor closed)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise ModelLoadError(path, f"{path.name} does not exist (deleted or moved)") from None
    except OSError as e:
        raise ModelLoadError(path, f"cannot open: {e.strerror}") from None
    size = os.fstat(fd).st_size
    if size < 24:
        os.close(fd)
        raise ModelLoadError(path, f"file is {size} bytes, too short for a GGUF header")
    return fd, size


class _MappedPart:
    """One validated GGUF file and its read-only memory map."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd, size = _open(path)
        try:
            self.map: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            self.stat = os.fstat(fd)  # what the file was when mapped: changed() compares
        finally:
            os.close(fd)
        self.size = size
        # a file truncated under the map must not SIGBUS the process (engine/sigbus.py)
        self._guard = sigbus.guard(np.frombuffer(self.map, np.uint8).ctypes.data, size)
        view = memoryview(self.map)
        try:
            self.version, self.metadata, self.tensors, self.data_start = _parse(
                _Cursor(view, str(path)))
        except ModelLoadError:
            view.release()
            self.close()
            raise
        view.release()
        self.data: np.ndarray | None = np.frombuffer(self.map, dtype=np.uint8)  # [size], no copy

    def changed(self) -> str | None:
        """Why the file on disk is no longer the one mapped (None while it still is)."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return None  # deleted: the inode lives on under our map, whole, until we unmap it
        except OSError as e:
            return f"{self.path.name} can no longer be read ({e.strerror})"
        if now.st_size != self.stat.st_size:
            return f"{self.path.name} changed size ({self.stat.st_size} -> {now.st_size} bytes)"
        if (now.st_ino, now.st_dev) != (self.stat.st_ino, self.stat.st_dev):
            return None  # replaced by rename: our map still holds the old file, intact
        if now.st_mtime_ns != self.stat.st_mtime_ns:
            return f"{self.path.name} was rewritten in place"
        return None

    def close(self) -> None:
        self.data = None
        sigbus.unguard(self._guard)
        self._guard = None
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                pass  # a view is still alive; the mapping goes when it is collected
            self.map = None


# llama.cpp's names for the parts of a split model: NAME-00001-of-0000N.gguf (the generator in
# gateway/scan/discover.py groups files by the same pattern, so what it writes, this loads)
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})(?P<suffix>\.gguf)$", re.I)


def split_part_paths(path: Path, count: int) -> list[Path]:
    """The files of a model split in `count` parts, from the first part's name (SPLIT_NAME)."""
    m = SPLIT_NAME.match(path.name)
    if m is None or int(m["no"]) != 1:
        raise ModelLoadError(path, f"metadata says the model is split in {count} files, but the "
                                   f"name does not follow NAME-00001-of-{count:05d}.gguf")
    return [path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}{m['suffix']}")
            for i in range(1, count + 1)]


class GGUFFile:
    """A validated GGUF model: metadata, tensor table, read-only memory maps of its data.

    A split model (`split.count` > 1 in the first file) is opened whole: every part is mapped
    and validated, and the tensor table spans them all.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        first = _MappedPart(self.path)
        self._parts = [first]
        try:
            self._open_other_parts(first)
        except BaseException:
            self.close()
            raise
        self.version = first.version
        self.metadata = first.metadata
        self.data_start = first.data_start
        self.file_size = sum(p.size for p in self._parts)

    def _open_other_parts(self, first: _MappedPart) -> None:
        count = first.metadata.get("split.count", 1)
        self.tensors = dict(first.tensors)
        if not isinstance(count, int) or count < 1:
            raise ModelLoadError(self.path, f"split.count {count!r} is not a positive integer")
        if count == 1:
            return
        if first.metadata.get("split.no", 0) != 0:
            raise ModelLoadError(self.path, f"this is part {first.metadata['split.no'] + 1} "
                                            f"of a split model; open the first part")
        for no, part_path in enumerate(split_part_paths(self.path, count)[1:], start=1):
            part = _MappedPart(part_path)
            self._parts.append(part)
            if part.metadata.get("split.no") != no or part.metadata.get("split.count") != count:
                raise ModelLoadError(part_path, f"expected part {no + 1} of {count} of "
                                                f"{self.path.name}")
            for name, info in part.tensors.items():
                if name in self.tensors:
                    raise ModelLoadError(part_path, f"tensor {name} appears in two parts")
                self.tensors[name] = TensorInfo(info.name, info.shape, info.qtype, info.offset,
                                                info.n_bytes, part=no)
        expected = first.metadata.get("split.tensors.count", len(self.tensors))
        if expected != len(self.tensors):
            raise ModelLoadError(self.path, f"the parts hold {len(self.tensors)} tensors, "
                                            f"split.tensors.count says {expected}")

    def tensor_data(self, name: str) -> np.ndarray:
        """uint8 [n_bytes] view of one tensor's bytes inside its file's mapping (no copy)."""
        info = self.tensors[name]
        data = self._parts[info.part].data
        assert data is not None, "file is closed"
        return data[info.offset:info.offset + info.n_bytes]

    def changed(self) -> str | None:
        """Why a file of this model on disk is no longer what is mapped (None: all intact)."""
        for part in self._parts:
            if (why := part.changed()) is not None:
                return why
        return None

    def close(self) -> None:
        """Unmap. Views handed out earlier must have been dropped, or the unmap waits for GC."""
        for part in self._parts:
            part.close()


def read_header(path: str | os.PathLike[str], vocabulary: bool = True
                ) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """Metadata and tensor table of this one file (a split model's part on its own), for scans,
    estimates and servability checks: read with pread up to the header's end, nothing mapped.
    `vocabulary=False` checks the bounds of the tokenizer's big arrays without decoding them
    (VOCABULARY_KEYS are UndecodedArray then)."""
    path = Path(path)
    fd, size = _open(path)
    try:
        def prefix(n: int) -> bytes:
            try:
                return os.pread(fd, n, 0)
            except OSError as e:
                raise ModelLoadError(path, f"cannot read: {e.strerror}") from None

        cur = _Cursor(prefix(min(size, HEADER_READ)), str(path), size, prefix)
        _, meta, tensors, _ = _parse(cur, vocabulary)
        return meta, tensors
    finally:
        os.close(fd)

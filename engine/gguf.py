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


_U64 = struct.Struct("<Q")


class _Cursor:
    """Bounds-checked little-endian reads over a buffer."""

    def __init__(self, buf: memoryview, path: str) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def fail(self, problem: str) -> ModelLoadError:
        return ModelLoadError(self.path, problem)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"truncated header: {what} at byte {self.pos} runs past the end "
                            f"of the file ({len(self.buf)} bytes)")

    def unpack(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings in a row (vocabularies hold ~100k of them).

        One Python pass reads the lengths; the texts are then decoded in bulk: the bytes of all
        strings joined by NUL, decoded once and split. Strings that hold a NUL or invalid UTF-8
        send the array down the one-by-one path instead, which decodes like string().
        """
        buf, start, end = self.buf, self.pos, len(self.buf)
        pos = start
        length = _U64.unpack_from
        lengths = [0] * count
        for i in range(count):
            if pos + 8 > end:
                self.pos = pos
                self.need(8, what)
            (n,) = length(buf, pos)
            pos += 8
            if n > end - pos:
                self.pos = pos
                self.need(n, what)
            lengths[i] = n
            pos += n
        self.pos = pos
        if count == 0:
            return []
        region = np.frombuffer(buf, dtype=np.uint8, count=pos - start, offset=start)
        lens = np.array(lengths, dtype=np.int64)                        # [count]
        heads = np.cumsum(lens + 8) - lens - 8                          # [count] prefix offsets
        keep = np.ones(region.shape[0], dtype=bool)
        keep[(heads[:, None] + np.arange(1, 8)).ravel()] = False        # drop 7 of the 8 bytes
        joined = region[keep]                                           # 1 byte + text per string
        joined[np.cumsum(lens + 1) - lens - 1] = 0                      # each string starts with NUL
        if np.count_nonzero(joined) != joined.shape[0] - count:  # a NUL inside some string
            return self._strings_one_by_one(start, count, what)
        try:
            return joined.tobytes().decode("utf-8").split("\0")[1:]
        except UnicodeDecodeError:
            return self._strings_one_by_one(start, count, what)

    def _strings_one_by_one(self, start: int, count: int, what: str) -> list[str]:
        end_pos, self.pos = self.pos, start
        out = [self.string(what) for _ in range(count)]
        assert self.pos == end_pos
        return out

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        try:
            t = GGUFValueType(vtype)
        except ValueError:
            raise self.fail(f"{what}: unknown value type {vtype}") from None
        if t in _SCALARS:
            return self.unpack(_SCALARS[t], what)
        if t == GGUFValueType.STRING:
            return self.string(what)
        if t == GGUFValueType.ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.fail(f"{what}: arrays nested more than {MAX_ARRAY_DEPTH} deep")
            item_type = self.unpack("<I", what)
            count = self.unpack("<Q", what)
            if count > len(self.buf):
                raise self.fail(f"{what}: array length {count} is larger than the file")
            try:
                it = GGUFValueType(item_type)
            except ValueError:
                raise self.fail(f"{what}: unknown array item type {item_type}") from None
            if it in _SCALARS:
                fmt = _SCALARS[it]
                size = struct.calcsize(fmt) * count
                self.need(size, what)
                arr = np.frombuffer(self.buf, dtype=np.dtype(fmt), count=count, offset=self.pos)
                self.pos += size
                return arr.tolist()
            if it == GGUFValueType.STRING:
                return self.strings(count, what)
            return [self.value(item_type, what, depth + 1) for _ in range(count)]
        raise self.fail(f"{what}: unsupported value type {t.name}")


def tensor_nbytes(qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if shape[0] % block_elems:
        raise ValueError(f"row length {shape[0]} is not a multiple of the {qtype.name} "
                         f"block size {block_elems}")
    return math.prod(shape) // block_elems * block_bytes


def _parse(buf: memoryview, path: str, file_size: int
           ) -> tuple[int, dict[str, Any], dict[str, TensorInfo], int]:
    cur = _Cursor(buf, path)
    cur.need(4, "magic")
    if bytes(buf[:4]) != MAGIC:
        raise cur.fail(f"not a GGUF file (magic {bytes(buf[:4])!r}, expected {MAGIC!r})")
    cur.pos = 4
    version = cur.unpack("<I", "version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and version:
            raise cur.fail("big-endian GGUF files are not supported")
        raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.unpack("<Q", "tensor count")
    n_kv = cur.unpack("<Q", "metadata count")
    # each entry takes at least 8+4 (kv) or 8+4+4+8 (tensor) bytes: reject absurd counts early
    if n_kv * 12 + n_tensors * 24 > file_size:
        raise cur.fail(f"header claims {n_kv} metadata entries and {n_tensors} tensors, more "
                       f"than a {file_size}-byte file can hold")
    meta: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        vtype = cur.unpack("<I", f"type of {key}")
        meta[key] = cur.value(vtype, key)
    alignment = meta.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment!r} is not a power of two")
    raw_infos = []
    for i in range(n_tensors):
        name = cur.string(f"tensor #{i} name")
        n_dims = cur.unpack("<I", f"tensor {name} dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {name}: {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        shape = tuple(cur.unpack("<Q", f"tensor {name} shape") for _ in range(n_dims))
        qtype_id = cur.unpack("<I", f"tensor {name} type")
        offset = cur.unpack("<Q", f"tensor {name} offset")
        raw_infos.append((name, shape, qtype_id, offset))
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, shape, qtype_id, offset in raw_infos:
        try:
            qtype = GGMLQuantizationType(qtype_id)
        except ValueError:
            raise cur.fail(f"tensor {name}: unknown tensor type {qtype_id}") from None
        if any(d <= 0 for d in shape):
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


class _MappedPart:
    """One validated GGUF file and its read-only memory map."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ModelLoadError(path, f"{path.name} does not exist (deleted or moved)") from None
        except OSError as e:
            raise ModelLoadError(path, f"cannot open: {e.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size < 24:
                raise ModelLoadError(path, f"file is {size} bytes, too short for a GGUF header")
            self.map: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            self.stat = os.fstat(fd)  # what the file was when mapped: changed() compares
        finally:
            os.close(fd)
        self.size = size
        # a file truncated under the map must not SIGBUS the process (engine/sigbus.py)
        self._guard = sigbus.guard(np.frombuffer(self.map, np.uint8).ctypes.data, size)
        view = memoryview(self.map)
        try:
            self.version, self.metadata, self.tensors, self.data_start = _parse(view, str(path), size)
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


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """Metadata and tensor table of this one file (a split model's part on its own), without
    keeping anything mapped: for scans and estimates."""
    part = _MappedPart(Path(path))
    try:
        return part.metadata, part.tensors
    finally:
        part.close()

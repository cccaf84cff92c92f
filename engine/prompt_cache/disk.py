"""Prompt-cache blocks as files: written atomically, checked when read, mapped back.

    <root>/<model>/<fingerprint>/<block name hex>.kvb     one block per file
    <root>/<model>/<fingerprint>/.tmp-*                    a write in progress (never read)

A file is written to a temporary name, fsync'd, renamed into place and the folder fsync'd: a
crash before the rename leaves only a temporary file (removed when the store next opens), never
a file that is read back. A file is

    MAGIC (8 bytes) | header length (u32 little-endian) | header (JSON) | zero padding to 64
    | the arrays' bytes, each at its header offset

and the header names the fingerprint, the block's name, parent and position keys, and every
array's dtype, shape and offset. Reading checks all of it: the fingerprint (a file of another
model version or settings is never used), the name against the keys' chain hash, the file's
size, the arrays' layout against the model's; anything wrong is logged, the file removed, and
the block treated as absent. The arrays are views of a read-only mapping (np.memmap): a block
comes back without a read.

The fingerprint is the caller's (the model file, n_ctx, KV types, rope, LoRA...: whatever
changes the rows); another fingerprint's folder under the same model is stale and is removed
when the store opens. The whole root is bounded in bytes: `trim` removes the least recently used
files (mtime; a read touches it) until it fits.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..prompt import PositionKey
from .blocks import Block, chain_hash

log = logging.getLogger("modelyard.prompt_cache")

MAGIC = b"MYKVBLK1"
SUFFIX = ".kvb"
ALIGN = 64

Shapes = list[tuple[np.dtype[Any], int, tuple[int, ...]]]  # per array: dtype, layers, row shape


class StoreError(Exception):
    """A block file that cannot be written or read (the message names it and why)."""


def safe_name(text: str) -> str:
    """A folder name for a model name (letters, digits, -, _, .; nothing else)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:100] or "model"


def _keys_json(keys: tuple[PositionKey, ...]) -> list[Any]:
    return [k if isinstance(k, int) else [k[0], k[1]] for k in keys]


def _keys_from_json(raw: list[Any]) -> tuple[PositionKey, ...]:
    out: list[PositionKey] = []
    for k in raw:
        if isinstance(k, int) and not isinstance(k, bool):
            out.append(k)
        elif (isinstance(k, list) and len(k) == 2 and isinstance(k[0], str)
              and isinstance(k[1], int)):
            out.append((k[0], k[1]))
        else:
            raise ValueError(f"bad position key {k!r}")
    return tuple(out)


def write_atomic(path: Path, parts: list[bytes | memoryview]) -> int:
    """Write `parts` to `path` so that a reader sees the whole file or none: a temporary file
    in the same folder, fsync'd, renamed, the folder fsync'd. Returns the bytes written."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return size


def encode(header: dict[str, Any], arrays: list[np.ndarray]) -> list[bytes | memoryview]:
    """A file's parts: magic, header (with each array's offset filled in), padding, arrays."""
    specs, offset = [], 0
    for a in arrays:
        specs.append([a.dtype.str, list(a.shape), offset])
        offset += -(-a.nbytes // ALIGN) * ALIGN
    head = json.dumps({**header, "arrays": specs, "data_bytes": offset}).encode()
    start = -(-(len(MAGIC) + 4 + len(head)) // ALIGN) * ALIGN
    parts: list[bytes | memoryview] = [MAGIC, struct.pack("<I", len(head)), head,
                                       b"\0" * (start - len(MAGIC) - 4 - len(head))]
    for a in arrays:
        parts.append(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
        parts.append(b"\0" * (-a.nbytes % ALIGN))
    return parts


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header of a file written by `encode` and where its data starts; ValueError if the
    file is not one, or is shorter than its header says."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a block file (bad magic)")
        (n,) = struct.unpack("<I", f.read(4))
        if n > min(size, 64 << 20):
            raise ValueError("header length past the file's end")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    start = -(-(len(MAGIC) + 4 + n) // ALIGN) * ALIGN
    if size != start + int(header.get("data_bytes", -1)):
        raise ValueError(f"size {size} is not the {start + int(header.get('data_bytes', -1))} "
                         f"its header says (truncated?)")
    return header, start


def map_arrays(path: Path, header: dict[str, Any], start: int) -> list[np.ndarray]:
    """The file's arrays as read-only views of one mapping."""
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = []
    for dtype, shape, offset in header["arrays"]:
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        out.append(mm[start + offset:start + offset + n].view(dt).reshape(shape))
    return out


class DiskStore:
    def __init__(self, root: str | os.PathLike[str], model: str, fingerprint: str,
                 budget: int) -> None:
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.budget = budget
        self.folder = self.root / safe_name(model) / fingerprint
        self.folder.mkdir(parents=True, exist_ok=True)
        for other in self.folder.parent.iterdir():  # another version or settings: stale
            if other != self.folder and other.is_dir():
                log.info("prompt cache: removing stale %s", other)
                shutil.rmtree(other, ignore_errors=True)
        for tmp in self.folder.glob(".tmp-*"):  # a write a crash interrupted
            tmp.unlink(missing_ok=True)

    def index(self) -> list[Block]:
        """Every readable block file's block, rows not mapped yet (a bad file is removed)."""
        out = []
        for path in sorted(self.folder.glob("*" + SUFFIX)):
            try:
                header, _ = read_header(path)
                out.append(self._block(path, header))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._discard(path, exc)
        return out

    def write(self, block: Block) -> str:
        """The block's file (atomically); its path."""
        assert block.k is not None and block.v is not None
        path = self.folder / (block.name.hex() + SUFFIX)
        header = {"fingerprint": self.fingerprint, "name": block.name.hex(),
                  "parent": block.parent.hex(), "keys": _keys_json(block.keys)}
        try:
            write_atomic(path, encode(header, [*block.k, *block.v]))
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc}") from exc
        return str(path)

    def read(self, block: Block, shapes: Shapes) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The block's k and v, mapped from its file, checked against the model's `shapes`."""
        assert block.path is not None
        path = Path(block.path)
        try:
            header, start = read_header(path)
            if self._block(path, header).keys != block.keys:
                raise ValueError("its keys changed since it was indexed")
            arrays = map_arrays(path, header, start)
            if len(arrays) != len(shapes):
                raise ValueError(f"{len(arrays)} arrays, the model has {len(shapes)}")
            for a, (dtype, layers, row) in zip(arrays, shapes):
                if (a.dtype != dtype or a.ndim != 2 + len(row) or a.shape[0] != layers
                        or a.shape[1] != len(block.keys) or tuple(a.shape[2:]) != row):
                    raise ValueError(f"an array of {a.dtype}{list(a.shape)} does not fit the model")
            os.utime(path)  # recently used: the disk LRU keeps it
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._discard(path, exc)
            raise StoreError(f"{path}: {exc}") from exc
        half = len(arrays) // 2
        return arrays[:half], arrays[half:]

    def trim(self) -> int:
        """Remove the least recently used block files under the root until it fits the budget.
        Returns the files removed."""
        files = []
        for path in self.root.glob("*/*/*" + SUFFIX):
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((st.st_mtime_ns, st.st_size, path))
        total = sum(size for _, size, _ in files)
        removed = 0
        for _, size, path in sorted(files, key=lambda f: f[0]):
            if total <= self.budget:
                break
            path.unlink(missing_ok=True)
            total -= size
            removed += 1
        return removed

    def _block(self, path: Path, header: dict[str, Any]) -> Block:
        if header.get("fingerprint") != self.fingerprint:
            raise ValueError("written for another model version or settings (fingerprint)")
        keys = _keys_from_json(header["keys"])
        parent = bytes.fromhex(header["parent"])
        name = bytes.fromhex(header["name"])
        if chain_hash(parent, keys) != name or path.name != name.hex() + SUFFIX:
            raise ValueError("its name is not its keys' chain hash")
        nbytes = sum(int(np.prod(shape)) * np.dtype(dt).itemsize
                     for dt, shape, _ in header["arrays"])
        return Block(name, parent, keys, None, None, nbytes, path=str(path))

    @staticmethod
    def _discard(path: Path, why: BaseException) -> None:
        log.warning("prompt cache: ignoring %s: %s (removed)", path, why)
        path.unlink(missing_ok=True)

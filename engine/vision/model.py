"""VisionModel: an opened projector and its encoder; one image -> its embedding chunks.

An image becomes one chunk per tile (idefics3: every tile, then the overview) or a single
chunk; each chunk is float32 [n_tokens, n_embd] rows and a content key (the image bytes'
hash, the projector file and the tile index), so the KV cache's prefix matching reuses an
image it has seen and never confuses two images of the same size. Thread-safe: one lock
serialises encodes (the matmul scratch is shared); callers run it off the event loop.
"""
from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass

import numpy as np

from engine.gguf import ModelLoadError
from engine.vision.encoder import VisionEncoder
from engine.vision.mmproj import Projector, VisionParams
from engine.vision.preprocess import Preprocessed, decode, preprocess
from engine.vision.projectors import Head


@dataclass(frozen=True)
class ImageChunk:
    rows: np.ndarray     # float32 [n_tokens, n_embd]
    key: str             # content hash: image bytes, projector file, tile index


@dataclass(frozen=True)
class EncodedImage:
    chunks: tuple[ImageChunk, ...]   # in prompt order (idefics3: tiles row by row, overview last)
    grid: tuple[int, int]            # idefics3's tile rows and columns; (0, 0) for one chunk

    @property
    def n_tokens(self) -> int:
        return sum(c.rows.shape[0] for c in self.chunks)


class VisionModel:
    def __init__(self, path: str | os.PathLike[str], n_threads: int = 1, amx: bool | None = None) -> None:
        self.path = str(path)
        self.projector = Projector(path)
        try:
            self.hp: VisionParams = self.projector.hp
            self.head = Head(self.projector)
            unused = [n for n in self.projector.unused() if not n.startswith("mm.")
                      and not (self.hp.projector == "mlp"
                               and n.startswith(f"v.blk.{self.hp.n_layer - 1}."))]
            if unused:
                raise ModelLoadError(self.path, f"tensor {unused[0]} is not part of the "
                                                f"{self.hp.projector} encoder: not supported")
            self.encoder = VisionEncoder(self.projector, n_threads, amx)
        except BaseException:
            self.projector.close()
            raise
        st = os.stat(self.path)
        self._file_key = f"{self.path}:{st.st_size}:{st.st_mtime_ns}"
        self._lock = threading.Lock()

    def preprocess(self, data: bytes) -> Preprocessed:
        return preprocess(decode(data), self.hp)

    def encode_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [3, S, S] -> float32 [n_tokens, n_embd]."""
        with self._lock:
            return self.head.apply(self.encoder, self.encoder.vit(pixels))

    def tokens_per_tile(self) -> int:
        side, s = self.hp.patches_per_side, self.hp.scale_factor
        return (side // s) ** 2 if self.hp.projector in ("gemma3", "idefics3") else side * side

    def encode(self, data: bytes) -> EncodedImage:
        pre = self.preprocess(data)
        digest = hashlib.sha256(data).hexdigest()[:32]
        chunks = tuple(ImageChunk(self.encode_pixels(t), f"img:{digest}:{self._file_key}:{i}")
                       for i, t in enumerate(pre.tiles))
        return EncodedImage(chunks, pre.grid)

    def close(self) -> None:
        self.encoder.close()
        self.projector.close()

    def __enter__(self) -> VisionModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Can the engine serve this GGUF file? Judged from its header alone, without loading weights.

    why_not_servable(path) -> None, or the reason (str) a load would fail
    check_servable(path) / judge_header(path, meta, tensors) -> HParams, or ModelLoadError

The config check (gateway/config/), `modelyard scan` (gateway/scan/) and the registry (before
it evicts anything to make room) all ask this one function, so they agree with each other and
with a real load. It runs the loader's own judgements rather than a list of its own:

  header      engine.gguf.read_header (every part of a split model)
  hparams     HParams.from_metadata: the supported architectures, each family's declared keys
  tokenizer   tokenizer.ggml.model is one engine.tokenizer implements; its size matches n_vocab
  tensors     the loader's walk of the family's declared tensors (names, shapes, supported
              types: engine.formats.quants.SUPPORTED) over a stand-in file whose tensor bytes
              are a read-only mapping of zero pages

So a new architecture, tensor type or tensor name the engine learns is judged here the moment
the loader knows it. The answer is remembered per file identity (path, size, mtime, inode), so a
config reload does not read unchanged headers again.
"""
from __future__ import annotations

import functools
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from .gguf import ModelLoadError, TensorInfo, read_header, split_part_paths
from .hparams import HParams
from .tokenizer import vocabulary_model
from .weights import load_weights


class _HeaderOnlyFile:
    """The part of GGUFFile the tensor walk uses, with zero bytes in place of the weights."""

    def __init__(self, path: Path, metadata: dict[str, Any], tensors: dict[str, TensorInfo]):
        self.path = path
        self.metadata = metadata
        self.tensors = tensors
        # one read-only anonymous mapping as large as the largest tensor: its pages are the
        # kernel's shared zero page, so nothing is allocated or read, whatever the model's size
        size = max((t.n_bytes for t in tensors.values()), default=0)
        self._zeros = np.frombuffer(mmap.mmap(-1, max(size, 1), prot=mmap.PROT_READ),
                                    dtype=np.uint8)

    def tensor_data(self, name: str) -> np.ndarray:
        return self._zeros[:self.tensors[name].n_bytes]


def _check_tensors(f: _HeaderOnlyFile, hp: HParams) -> None:
    """The loader's own walk over the file's tensors (raises ModelLoadError as a load would)."""
    load_weights(f, hp, hp.n_ctx_train)  # type: ignore[arg-type]  # n_ctx: LongRoPE's choice only


def read_model_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """The metadata of `path` and the tensors of every part of it (a split model's later parts
    add theirs, each tagged with its part number)."""
    path = Path(path)
    meta, tensors = read_header(path)
    tensors = dict(tensors)
    count = meta.get("split.count", 1)
    if isinstance(count, int) and count > 1:
        for no, part in enumerate(split_part_paths(path, count)[1:], start=1):
            for name, info in read_header(part)[1].items():
                tensors[name] = TensorInfo(info.name, info.shape, info.qtype, info.offset,
                                           info.n_bytes, part=no)
    return meta, tensors


def check_servable(path: str | os.PathLike[str]) -> HParams:
    """The file's hyperparameters; raises ModelLoadError with the reason a load would fail."""
    return judge_header(path, *read_model_header(path))


def judge_header(path: str | os.PathLike[str], meta: dict[str, Any],
                 tensors: dict[str, TensorInfo]) -> HParams:
    """check_servable on a header already read (`tensors`: every part's)."""
    path = Path(path)
    hp = HParams.from_metadata(meta, str(path))
    try:
        vocabulary_model(meta)
    except ValueError as e:
        raise ModelLoadError(path, f"bad tokenizer metadata: {e}") from None
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or len(tokens) != hp.n_vocab:
        n = len(tokens) if isinstance(tokens, list) else 0
        raise ModelLoadError(path, f"tokenizer has {n} tokens, the model {hp.n_vocab}")
    _check_tensors(_HeaderOnlyFile(path, meta, tensors), hp)
    return hp


def why_not_servable(path: str | os.PathLike[str]) -> str | None:
    """None when a load of `path` can succeed as far as its header tells; else the reason."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    return _judged(str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=256)
def _judged(path: str, size: int, mtime_ns: int, inode: int) -> str | None:
    try:
        check_servable(path)
    except ModelLoadError as e:
        return e.problem
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as e:  # not foreseen
        return f"cannot make sense of its header ({type(e).__name__}: {e})"
    return None


def why_not_a_pair(model: str | os.PathLike[str], mmproj: str | os.PathLike[str]) -> str | None:
    """None when the projector file `mmproj` can give `model` images (its projector type is one
    engine/vision runs, and it writes rows of the text model's embedding width); else why not.
    From both headers alone, as why_not_servable (which should pass for `model` first)."""
    from .vision.mmproj import check_header  # engine.vision imports the kernels: only when asked

    try:
        hp = check_header(mmproj, *read_header(mmproj))
        n_embd = check_servable(model).n_embd
    except ModelLoadError as e:
        return e.problem
    except (OSError, ValueError, TypeError, KeyError, IndexError) as e:
        return f"cannot make sense of its header ({type(e).__name__}: {e})"
    if hp.projection_dim != n_embd:
        return (f"its projector writes rows of width {hp.projection_dim}, but the model's "
                f"embedding width is {n_embd}: they are not a pair")
    return None

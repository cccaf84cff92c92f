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
the loader knows it. The answer is remembered per path with the file's identity (size, mtime,
inode) it was given for: a config reload reads only the headers of files that changed, however
many entries the config has. One answer per path (a changed file replaces its old one), and at
most MAX_REMEMBERED paths, the least recently asked forgotten first: far more distinct model
files than any config names, a few hundred bytes each.
"""
from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .encoder import load_encoder_weights
from .gguf import ModelLoadError, TensorInfo, UndecodedArray, read_header, split_part_paths
from .hparams import HParams
from .lora import LoraSpec, read_deltas
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
    if hp.spec.is_encoder:
        load_encoder_weights(f, hp)
    else:
        load_weights(f, hp, hp.n_ctx_train)  # type: ignore[arg-type]  # n_ctx: LongRoPE's choice only


def read_model_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """The metadata of `path` and the tensors of every part of it (a split model's later parts
    add theirs, each tagged with its part number). The vocabulary's arrays are bounds-checked,
    not decoded: judging a file needs their lengths only."""
    path = Path(path)
    meta, tensors = read_header(path, vocabulary=False)
    tensors = dict(tensors)
    count = meta.get("split.count", 1)
    if isinstance(count, int) and count > 1:
        for no, part in enumerate(split_part_paths(path, count)[1:], start=1):
            for name, info in read_header(part, vocabulary=False)[1].items():
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
    if not isinstance(tokens, (list, UndecodedArray)) or len(tokens) != hp.n_vocab:
        n = len(tokens) if isinstance(tokens, (list, UndecodedArray)) else 0
        raise ModelLoadError(path, f"tokenizer has {n} tokens, the model {hp.n_vocab}")
    _check_tensors(_HeaderOnlyFile(path, meta, tensors), hp)
    return hp


MAX_REMEMBERED = 1 << 16  # paths; each answer is a short string or None and an int

# identity of a file as stat sees it: (size, mtime_ns, inode); a replaced or edited file differs
_Identity = tuple[int, int, int]
# why not (None: servable) and a number: the trained context, or bytes of a memory estimate
_Answer = tuple[str | None, int]


class _Answers:
    """Answers per key (a path, or a model and projector pair), each valid for the file
    identities it was given for; least recently used forgotten beyond MAX_REMEMBERED."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # asked from the loop's threads and config reloads alike
        self._answers: OrderedDict[tuple[str, ...], tuple[tuple[_Identity, ...], _Answer]] = (
            OrderedDict())

    def get(self, key: tuple[str, ...], ids: tuple[_Identity, ...]) -> _Answer | None:
        with self._lock:
            held = self._answers.get(key)
            if held is None or held[0] != ids:
                return None
            self._answers.move_to_end(key)
            return held[1]

    def put(self, key: tuple[str, ...], ids: tuple[_Identity, ...], answer: _Answer) -> None:
        with self._lock:
            self._answers[key] = (ids, answer)
            self._answers.move_to_end(key)
            while len(self._answers) > MAX_REMEMBERED:
                self._answers.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()


_answers = _Answers()


def _identity(path: str | os.PathLike[str]) -> tuple[str, _Identity]:
    """The absolute path and its identity (raises OSError as stat does). Not resolved: the
    identity tells whether the file behind a name is still the one judged, and a config
    hands over resolved paths already."""
    st = os.stat(path)
    return os.path.abspath(path), (st.st_size, st.st_mtime_ns, st.st_ino)


def why_not_servable(path: str | os.PathLike[str]) -> str | None:
    """None when a load of `path` can succeed as far as its header tells; else the reason."""
    return _judgement(path)[0]


def trained_context(path: str | os.PathLike[str]) -> int:
    """The context length the model of `path` was trained for (0 when it is not servable):
    what llama.cpp's n_ctx 0 means. Remembered with the judgement."""
    return _judgement(path)[1]


def _judgement(path: str | os.PathLike[str]) -> _Answer:
    try:
        resolved, ident = _identity(path)
    except OSError as e:
        return f"cannot read {path}: {e.strerror}", 0
    answer = _answers.get((resolved,), (ident,))
    if answer is None:
        answer = _judged(resolved)
        _answers.put((resolved,), (ident,), answer)
    return answer


def _judged(path: str) -> _Answer:
    try:
        hp = check_servable(path)
    except ModelLoadError as e:
        return e.problem, 0
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as e:  # not foreseen
        return f"cannot make sense of its header ({type(e).__name__}: {e})", 0
    return None, hp.n_ctx_train


def remembered(path: str | os.PathLike[str], what: str, compute: Callable[[], int]) -> int:
    """`compute()`'s number about `path` (`what` names it, e.g. a memory estimate and its
    arguments), remembered for the file's identity like the judgement: a config reload asks
    again without reading the header again. Raises what `compute` or stat raise."""
    resolved, ident = _identity(path)
    answer = _answers.get((resolved, what), (ident,))
    if answer is None:
        answer = None, compute()
        _answers.put((resolved, what), (ident,), answer)
    return answer[1]


def why_not_a_pair(model: str | os.PathLike[str], mmproj: str | os.PathLike[str]) -> str | None:
    """None when the projector file `mmproj` can give `model` images (its projector type is one
    engine/vision runs, and it writes rows of the text model's embedding width); else why not.
    From both headers alone, as why_not_servable (which should pass for `model` first);
    remembered for both files' identities as that is."""
    try:
        (m_path, m_id), (p_path, p_id) = _identity(model), _identity(mmproj)
    except OSError as e:
        return f"cannot read {e.filename}: {e.strerror}"
    answer = _answers.get((m_path, p_path), (m_id, p_id))
    if answer is None:
        answer = _pair_judged(m_path, p_path), 0
        _answers.put((m_path, p_path), (m_id, p_id), answer)
    return answer[0]


def why_not_an_adapter(model: str | os.PathLike[str], adapter: str | os.PathLike[str]) -> str | None:
    """Why `adapter` cannot be applied to `model` (read_deltas' judgement), or None."""
    meta, tensors = read_model_header(model)
    try:
        read_deltas([LoraSpec(adapter)], str(meta.get("general.architecture")), tensors)
    except ModelLoadError as e:
        return e.problem
    return None


def _pair_judged(model: str, mmproj: str) -> str | None:
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

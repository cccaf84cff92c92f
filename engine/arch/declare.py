"""What a family declares beside its block: the hyperparameters it reads and the tensors it has.

    Key(name, gguf, default, kind)         {arch}.<gguf> -> hp.<name> (hp.extra[name] when
                                            HParams has no such field)
    Tensor(name, gguf, dims, required)     blk.{i}.<gguf> -> layer.<name>
    Fused(gguf, cols, parts)               one blk.{i}.<gguf> whose row ranges are layer fields
    fuse(tensors, gguf, *names)            llama's separate tensors declared as one fused tensor

Dims are hyperparameter names in ggml's order: (n_cols, n_rows) for a matrix, (n,) for a vector,
(n_cols, n_rows, n_mat) for a stack of matrices (a mixture's experts: quants.StackedMatrix);
each is an HParams field or property (n_embd, q_dim, kv_dim, n_ff, head_dim...) or a key the
family declared (hp.extra). engine/hparams.py walks the keys, engine/weights.py the tensors: no
family is named there, so a new family is its module, not an edit of the loaders.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from ..gguf import ModelLoadError

KeyValue = int | float | str | tuple[int | float | bool, ...]  # a tuple: a per-layer array


class KeyValues(dict[str, Any]):
    """The keys read so far, by Key.name; a family's `finish` derives and checks on them."""

    def __init__(self, arch: str, path: str) -> None:
        super().__init__()
        self.arch, self.path = arch, path

    def refuse(self, problem: str) -> NoReturn:
        """The load error naming the file: a value the engine cannot honour."""
        raise ModelLoadError(self.path, problem)


@dataclass(frozen=True)
class Key:
    """One GGUF metadata key, `{arch}.<gguf>`. default None: the key is required; a callable
    computes the default from the keys declared before it (head_dim from n_embd / n_head).
    kind tuple: a per-layer array kept whole (gemma4's sliding_window_pattern), a single value
    as a tuple of one (the family's finish broadcasts it); the other kinds take an array only
    when all its values are one."""
    name: str
    gguf: str
    default: KeyValue | Callable[[Mapping[str, Any]], KeyValue] | None = None
    kind: type[int] | type[float] | type[str] | type[tuple[Any, ...]] = int  # tuple: a per-layer
    #                                     array kept whole (numbers; a bool array as bools)


@dataclass(frozen=True)
class Tensor:
    """One tensor of a layer: blk.{i}.<gguf>, shaped `dims`, served as the layer's `name`."""
    name: str
    gguf: str               # e.g. "attn_q.weight"
    dims: tuple[str, ...]   # ggml order: (n_cols, n_rows) a matrix, (n,) a float32 vector,
    #                         (n_cols, n_rows, n_mat) a StackedMatrix
    required: bool = True   # optional: the layer field stays None when the file lacks it
    floats: bool = False    # a float32 array of any rank, not a matrix for the kernels
    #                         (gpt-oss's per-expert biases, [n_expert, n])


@dataclass(frozen=True)
class Fused:
    """One matrix whose row ranges, top to bottom, are separate layer fields (views, no copy):
    phi3's attn_qkv holds [q; k; v] and its ffn_up [gate; up]."""
    gguf: str
    cols: str
    parts: tuple[tuple[str, str], ...]  # (layer field, its rows) top to bottom
    required: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.parts)


Declared = Tensor | Fused


def fuse(tensors: tuple[Declared, ...], gguf: str, *names: str) -> tuple[Declared, ...]:
    """`tensors` with the matrices `names` (same columns) declared as one Fused `gguf` instead,
    where the first of them stood."""
    chosen = {t.name: t for t in tensors if isinstance(t, Tensor) and t.name in names}
    if set(chosen) != set(names) or len({t.dims[0] for t in chosen.values()}) != 1:
        raise TypeError(f"cannot fuse {names} into {gguf}: not matrices of the same columns")
    first = chosen[names[0]]
    fused = Fused(gguf, first.dims[0], tuple((n, chosen[n].dims[1]) for n in names), first.required)
    out: list[Declared] = []
    for t in tensors:
        if t is first:
            out.append(fused)
        elif not (isinstance(t, Tensor) and t.name in names):
            out.append(t)
    return tuple(out)


def declared_names(tensors: tuple[Declared, ...]) -> dict[str, bool]:
    """Every layer field the declaration fills -> whether it is required."""
    out: dict[str, bool] = {}
    for t in tensors:
        for name in (t.names if isinstance(t, Fused) else (t.name,)):
            if name in out:
                raise TypeError(f"layer field {name} is declared twice")
            out[name] = t.required
    return out

"""`n_ctx: 0`, llama-cpp-python's (and llama.cpp's) "the model's own context": the context the
file says the model was trained for, kept only when a load of it fits `memory_budget`.

The loader resolves it once the entry is valid, so every later reader of `n_ctx` (KV sizing,
max_tokens defaults, /props) sees the number; a model file replaced by one with another trained
context is judged again on reload like any changed file (engine/servable.py remembers both the
judgement and the estimate for the file's identity).
"""
from __future__ import annotations

from gateway.config.problems import Loc, Problems
from gateway.config.schema import ModelEntry
from gateway.units import format_size


class _Prefixed(Problems):
    """Adds to `into`, each message after `prefix`."""

    def __init__(self, into: Problems, prefix: str) -> None:
        super().__init__()
        self.into, self.prefix = into, prefix

    def add(self, loc: Loc, message: str, *, settle: bool = False) -> None:
        self.into.add(loc, self.prefix + message, settle=settle)


def resolve_trained_context(entry: ModelEntry, loc: Loc, memory_budget: int | None,
                            problems: Problems, whose: str = "") -> ModelEntry:
    """`entry` with n_ctx 0 replaced by its model's trained context; a problem at `loc` (where
    the 0 was given; `whose` names the entry when that is `defaults`) when the file cannot
    tell it or a load would not fit memory_budget."""
    if entry.n_ctx != 0:
        return entry
    problems = _Prefixed(problems, f"for {whose}: " if whose else "")
    from engine import LoraSpec, estimate_memory
    from engine.gguf import ModelLoadError
    from engine.servable import remembered, trained_context, why_not_servable
    from engine.vision import projector_memory

    if why_not_servable(entry.model) is not None:
        return entry  # the model path's own problem is reported already
    n_ctx = trained_context(entry.model)
    if n_ctx <= 0:
        problems.add(loc, f"0 means the model's trained context, but {entry.model.name} gives "
                          "none; give a size such as 4096")
        return entry
    if memory_budget is not None:
        try:
            images = entry.mmproj is not None
            lora = [LoraSpec(a.path, a.scale) for a in entry.lora]  # their merged copies count
            need = remembered(entry.model, f"memory n_ctx={n_ctx} n_slots={entry.n_parallel} "
                                           f"images={images} lora={[str(a.path) for a in lora]} "
                                           f"kv={entry.type_k}/{entry.type_v}",
                              lambda: estimate_memory(entry.model, n_ctx, entry.n_parallel,
                                                      images, lora, *entry.kv_cache_types))
            # the projector's weights, as the registry counts them (fleet/registry/slots.py)
            need += projector_memory(entry.mmproj) if entry.mmproj is not None else 0
        except (ModelLoadError, OSError) as e:
            why = e.problem if isinstance(e, ModelLoadError) else e.strerror
            problems.add(loc, f"cannot size the model's trained context: {why}")
            return entry
        if need > memory_budget:
            problems.add(loc, f"0 means the model's trained context, {n_ctx} tokens: with "
                              f"n_parallel {entry.n_parallel} a load needs {format_size(need)} "
                              f"(weights + KV cache), over memory_budget "
                              f"{format_size(memory_budget)}; give a smaller n_ctx (or a larger "
                              "memory_budget)")
            return entry
    return entry.model_copy(update={"n_ctx": n_ctx})

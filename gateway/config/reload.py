"""What a config reload must do about each setting: every schema field says when it applies.

    LIVE     the running server applies a change at once (aliases, sampling defaults, limits,
             keys, registry policy)
    RELOAD   it shapes a loaded model or the scheduler around it (the file, context, threads,
             template): a change drains the loaded instance and loads the entry again on its
             next request
    RESTART  only a restart applies it (where the server listens)

A field carries its mark in its annotation, `n_ctx: Annotated[int, RELOAD] = 4096`. A field that
holds a section (a model of its own, or a list of them) has no mark: its fields do. `INTERNAL`
marks what the loader fills in that is not a key of the file (where the config came from, its
warnings). The registry's "stays warm" test (`settings_key`) and the reload record's
`restart_needed` derive from the marks, so a new key says once, where it is declared, what
changing it costs; a test checks that every field has a mark.
"""
from __future__ import annotations

import enum
import functools
from collections.abc import Iterator
from typing import Any, get_args

from pydantic import BaseModel
from pydantic.fields import FieldInfo


class Applies(enum.Enum):
    """When a changed value takes effect."""

    LIVE = "live"
    RELOAD = "reload"
    RESTART = "restart"


LIVE, RELOAD, RESTART = Applies.LIVE, Applies.RELOAD, Applies.RESTART


class _Internal(enum.Enum):
    INTERNAL = "internal"


INTERNAL = _Internal.INTERNAL  # set by the loader; not a key of the file


def applies(info: FieldInfo) -> Applies | None:
    return next((m for m in info.metadata if isinstance(m, Applies)), None)


def is_internal(info: FieldInfo) -> bool:
    return INTERNAL in info.metadata


def sections_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The models a field's type holds: `RegistrySettings`, `list[ModelEntry]` -> the model."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from sections_in(arg)


@functools.cache
def file_keys(cls: type[BaseModel]) -> tuple[str, ...]:
    """The keys a file may give for `cls`, in declaration order."""
    return tuple(name for name, info in cls.model_fields.items() if not is_internal(info))


@functools.cache
def marked(cls: type[BaseModel], when: Applies) -> tuple[str, ...]:
    return tuple(name for name, info in cls.model_fields.items() if applies(info) is when)


def unmarked(cls: type[BaseModel]) -> list[str]:
    """Fields of `cls` and of every section below it that say neither when they apply nor that
    they are internal (a test keeps this empty), as `Class.field`."""
    found: list[str] = []
    for name, info in cls.model_fields.items():
        sections = list(sections_in(info.annotation))
        if sections:
            for section in sections:
                found += unmarked(section)
        elif applies(info) is None and not is_internal(info):
            found.append(f"{cls.__name__}.{name}")
    return found


def settings_key(model: BaseModel) -> tuple[tuple[str, Any], ...]:
    """The RELOAD values of `model`: while they stay equal, what was loaded for it stays."""
    return tuple((name, getattr(model, name)) for name in marked(type(model), RELOAD))


def restart_needed(old: BaseModel, new: BaseModel, prefix: str = "") -> list[str]:
    """The RESTART settings that differ, said as `port (8080 -> 8081)`; sections included."""
    changes = [f"{prefix}{name} ({getattr(old, name)!r} -> {getattr(new, name)!r})"
               for name in marked(type(old), RESTART) if getattr(old, name) != getattr(new, name)]
    for name, info in type(old).model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            changes += restart_needed(getattr(old, name), getattr(new, name), f"{prefix}{name}.")
    return changes

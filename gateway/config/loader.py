"""`load_config(path)`: a file in, a complete and valid `Config` out, or every problem at once.

Reading happens in four steps, each collecting problems instead of stopping at the first:
  parse (formats.py, remembering the line of every key) -> expand ${VAR} / ${VAR:-default}
  (env.py) -> prepare (sort keys into ours / llama-cpp-python's / unknown, merge `defaults`,
  resolve paths, read key and chat template files) -> validate each part with the schema
  (schema.py), then the checks across entries.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.config.context import resolve_trained_context
from gateway.config.env import expand_env
from gateway.config.formats import FORMATS, ParseError, format_of, parse
from gateway.config.llama_cpp import (
    API_KEY,
    CLIP_MODEL_PATH,
    DRAFT_KEYS,
    DRAFT_MODEL,
    DRAFT_MODEL_N,
    DRAFT_MODEL_N_DEFAULT,
    DRAFT_MODEL_NGRAM_MAX,
    LLAMA_CPP_MODEL_KEYS,
    LLAMA_CPP_SERVER_KEYS,
    LORA_PATH,
    MODEL_ALIAS,
    UNUSED,
    server_key_note,
)
from gateway.config.lora import check_adapters, lora_adapters
from gateway.config.problems import ConfigError, Loc, Problems, pydantic_message, render, unknown_key
from gateway.config.reload import file_keys, sections_in
from gateway.config.schema import (
    ENTRY_KEYS,
    PER_MODEL_ONLY,
    SCHEMA_KEY,
    TOP_KEYS,
    AuthSettings,
    Config,
    CorsSettings,
    EntrySettings,
    LimitSettings,
    ModelEntry,
    RegistrySettings,
    ResponsesSettings,
    ServerSettings,
    check_across_entries,
)
from gateway.config.secrets import is_secret_loc, mask_secrets, secret_values
from gateway.config.upstream import MEMBER_TAGS, UpstreamEntry, prepare_upstream

log = logging.getLogger("modelyard.config")

# An entry's index and where each of its aliases came from, for the checks across entries.
_Aliases = tuple[int, list[tuple[str, Loc]]]


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a YAML (.yaml/.yml), TOML (.toml) or JSON (.json) config file."""
    path = Path(path)
    shown = str(path)
    fmt = format_of(path)
    if fmt is None:
        raise ConfigError(shown, [f"{shown}: unsupported config format {path.suffix or '(none)'!r}"
                                  f"; use {_suffixes()}"])
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(shown, [f"{shown}: config file not found"]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(shown, [f"{shown}: cannot read the config file: {e}"]) from None

    try:
        parsed = parse(fmt, text)
    except ParseError as e:
        where = f"{shown}:{e.line}" if e.line else shown
        raise ConfigError(shown, [f"{where}: {e}"]) from None
    problems = Problems()
    for loc, message in parsed.duplicates:
        problems.add(loc, message)

    config = _build(parsed.data, path.resolve().parent, problems, source=path.resolve())
    secrets = secret_values(expand_env(parsed.data, (), Problems()))
    if problems.items or config is None:
        raise ConfigError(shown, mask_secrets(render(problems.items, parsed.lines, shown), secrets))
    warnings = mask_secrets(render(problems.warnings, parsed.lines, shown), secrets)
    for message in warnings:
        log.warning("%s", message)
    return config.model_copy(update={"warnings": warnings})


def _suffixes() -> str:
    *rest, last = FORMATS
    return f"{', '.join(rest)} or {last}"


def _build(data: Any, base_dir: Path, problems: Problems, source: Path) -> Config | None:
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        problems.add((), f"the top level must be a mapping of keys ({', '.join(TOP_KEYS)}); "
                         f"got {got}")
        return None
    data = expand_env(data, (), problems)

    for key in data:
        if key in (API_KEY, SCHEMA_KEY):  # llama-cpp-python's key: see _auth_section
            continue
        if key in LLAMA_CPP_SERVER_KEYS:
            problems.warn((key,), server_key_note(key))
        elif key not in TOP_KEYS:
            problems.add((key,), unknown_key(key, TOP_KEYS))

    server = _validate(ServerSettings, {k: data[k] for k in ServerSettings.model_fields
                                        if k in data}, (), problems)
    registry = _validate(RegistrySettings, _section(data, "registry"), ("registry",), problems)
    auth = _validate(AuthSettings, _auth_section(data, base_dir, problems), ("auth",), problems)
    if auth is not None:
        _distinct_keys(auth, problems)
    cors = _validate(CorsSettings, _section(data, "cors"), ("cors",), problems)
    limits = _validate(LimitSettings, _section(data, "limits"), ("limits",), problems)
    responses = _validate(ResponsesSettings, _section(data, "responses"), ("responses",),
                          problems)
    defaults = _prepare_defaults(_section(data, "defaults"), base_dir, problems)

    raw_models = data.get("models")
    entries: list[ModelEntry | None] = []
    upstreams: list[UpstreamEntry | None] = []
    seen: list[_Aliases] = []
    if not isinstance(raw_models, list) or not raw_models:
        problems.add(("models",), "required: a list with at least one model "
                                  "(each at least `model: path/to/file.gguf` or `upstream:`)")
    else:
        for i, raw in enumerate(raw_models):
            if isinstance(raw, dict) and "upstream" in raw:  # gateway/config/upstream.py
                fields, alias_locs = prepare_upstream(
                    raw, ("models", i), problems,
                    lambda item, key, loc: _secret(item, key, base_dir, loc, problems))
                seen.append((i, alias_locs))
                upstreams.append(_validate(UpstreamEntry, fields, ("models", i), problems))
                continue
            prepared = _prepare_entry(raw, defaults, base_dir, ("models", i), problems)
            if prepared is None:
                entries.append(None)
                continue
            entry_fields, alias_locs = prepared
            seen.append((i, alias_locs))
            entry = _validate(ModelEntry, entry_fields, ("models", i), problems)
            if entry is not None and entry.n_ctx == 0:  # gateway/config/context.py
                own = isinstance(raw, dict) and "n_ctx" in raw
                entry = resolve_trained_context(
                    entry, ("models", i, "n_ctx") if own else ("defaults", "n_ctx"),
                    registry.memory_budget if registry else None, problems,
                    whose="" if own else f"models.{i} ({entry.model.name})")
            entries.append(entry)

    default_model = data.get("default_model")
    all_prepared = len(seen) == len(entries) + len(upstreams) > 0
    check_across_entries(
        seen, default_model if isinstance(default_model, str) and all_prepared else None, problems)
    if (problems.items or server is None or registry is None or auth is None or cors is None
            or limits is None or responses is None or None in entries or None in upstreams):
        return None
    try:
        return Config(**server.model_dump(), registry=registry, auth=auth, cors=cors,
                      limits=limits, responses=responses,
                      models=[e for e in entries if e is not None],
                      upstreams=[e for e in upstreams if e is not None], source=source)
    except ValidationError as e:  # a check above missed something; still report, never crash
        for err in e.errors():
            problems.add(tuple(err["loc"]), pydantic_message(
                err, TOP_KEYS, secret=is_secret_loc(tuple(err["loc"]))))
        return None


def _secret(raw: dict[str, Any], key: str, base_dir: Path, loc: Loc, problems: Problems) -> None:
    """`key` given inline (often `${ENV}`) or as `key_file` (its first line): into raw[key]."""
    file_key = f"{key}_file"
    if file_key not in raw:
        return
    if key in raw:
        problems.add(loc + (file_key,), f"give {key} or {file_key}, not both")
        return
    value = raw.pop(file_key)
    if not isinstance(value, str) or not value.strip():
        problems.add(loc + (file_key,), "must be the path of a file holding the key")
        return
    path = (base_dir / Path(value).expanduser()).resolve()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        problems.add(loc + (file_key,), f"cannot read the key file {path}: "
                                        f"{getattr(e, 'strerror', None) or e}")
        return
    secret = lines[0].strip() if lines else ""
    if not secret:
        problems.add(loc + (file_key,), f"the key file {path} is empty")
        return
    raw[key] = secret


def _auth_section(data: dict[str, Any], base_dir: Path, problems: Problems) -> Any:
    """`auth:` with key files read, and llama-cpp-python's top-level `api_key` as one more key
    (that also guards the admin endpoints unless auth.admin_key is set)."""
    raw = _section(data, "auth")
    if not isinstance(raw, dict):
        return raw
    raw = dict(raw)
    _secret(raw, "admin_key", base_dir, ("auth",), problems)
    keys = raw.get("keys")
    if isinstance(keys, list):
        raw["keys"] = []
        for i, item in enumerate(keys):
            if isinstance(item, dict):
                item = dict(item)
                _secret(item, "key", base_dir, ("auth", "keys", i), problems)
            raw["keys"].append(item)
    api_key = data.get(API_KEY)
    if isinstance(api_key, str) and api_key:
        raw["keys"] = [*raw.get("keys", []), {"name": API_KEY, "key": api_key}]
        raw.setdefault("admin_key", api_key)
    elif api_key is not None:
        problems.add((API_KEY,), "must be a non-empty string")
    for i, item in enumerate(raw.get("keys") or []):
        if isinstance(item, dict) and isinstance(item.get("key"), str) and not item["key"].strip():
            problems.add(("auth", "keys", i, "key"), "must not be empty")
    return raw


def _distinct_keys(auth: AuthSettings, problems: Problems) -> None:
    """Two client keys with one value: the first would win silently, its limits and models
    applied to the other's clients. Named by both names, never by the value."""
    first: dict[str, tuple[int, str]] = {}
    for i, key in enumerate(auth.keys):
        value = key.key.get_secret_value()
        if value in first:
            j, name = first[value]
            problems.add(("auth", "keys", i, "key"),
                         f"key {key.name!r} has the same value as key {name!r} "
                         f"(auth.keys.{j}); each key must be distinct")
        else:
            first[value] = (i, key.name)


def _section(data: dict[str, Any], key: str) -> Any:
    """A mapping section; `registry:` with every key commented out reads as empty."""
    value = data.get(key)
    return {} if value is None else value


def _entry_setting(key: str, value: Any, fields: dict[str, Any], extra: dict[str, Any],
                   base_dir: Path, loc: Loc, problems: Problems) -> None:
    """A key that `defaults` and a `models` entry share: the chat template, one of our settings,
    a llama-cpp-python key (kept in `extra`, with a warning) or an unknown key (an error)."""
    if key == "chat_template":
        fields.update(_chat_template(value, base_dir, loc + (key,), problems))
    elif key in ("prompt_cache_dir", "slot_save_path") and isinstance(value, str) and value:
        fields[key] = _resolved(base_dir, value)  # a folder relative to the config's
    elif key in ENTRY_KEYS:
        fields[key] = value
    elif key in DRAFT_KEYS:  # llama-cpp-python's prompt lookup: `draft` once all keys are read
        extra[key] = value
    elif key in LLAMA_CPP_MODEL_KEYS:
        problems.warn(loc + (key,), UNUSED)
        extra[key] = value
    else:
        problems.add(loc + (key,), unknown_key(key, ENTRY_KEYS))


def _prepare_defaults(raw: Any, base_dir: Path, problems: Problems) -> dict[str, Any]:
    """The `defaults` keys that are valid, ready to merge under every entry."""
    loc: Loc = ("defaults",)
    if not isinstance(raw, dict):
        problems.add(loc, "must be a mapping of model keys (n_ctx, n_threads, ...)")
        return {}
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        if key in PER_MODEL_ONLY:
            problems.add(loc + (key,), "belongs in each entry of `models`, not in defaults")
        else:
            _entry_setting(key, value, fields, extra, base_dir, loc, problems)
    _llama_cpp_draft(fields, extra, loc, problems)
    # Check the values once here, so a bad default is reported once, not once per model.
    try:
        EntrySettings.model_validate(fields)
    except ValidationError as e:
        for err in e.errors():
            problems.add(loc + tuple(err["loc"]), pydantic_message(err, ENTRY_KEYS))
            fields.pop(str(err["loc"][0]), None)
    if extra:
        fields["extra"] = extra
    return fields


def _prepare_entry(raw: Any, defaults: dict[str, Any], base_dir: Path, loc: Loc,
                   problems: Problems) -> tuple[dict[str, Any], list[tuple[str, Loc]]] | None:
    """Turn one `models` item into ModelEntry fields; also return where each alias came from."""
    if not isinstance(raw, dict):
        problems.add(loc, "must be a mapping with at least `model: path/to/file.gguf`")
        return None
    fields = {k: v for k, v in defaults.items() if k != "extra"}
    extra = dict(defaults.get("extra", {}))
    alias_locs: list[tuple[str, Loc]] = []
    mmproj_key = "mmproj"
    adapters: list[tuple[dict[str, Any], Loc]] = []

    for key, value in raw.items():
        if key == "model":
            fields["model"] = _model_path(value, base_dir, loc + (key,), problems)
        elif key == MODEL_ALIAS:  # llama-cpp-python's single alias comes first
            if isinstance(value, str):
                alias_locs.insert(0, (value, loc + (key,)))
            elif value is not None:
                problems.add(loc + (key,), "must be a string")
        elif key == "aliases":
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list):
                problems.add(loc + (key,), "must be a list of names")
                continue
            for j, name in enumerate(names):
                if isinstance(name, str) and name.strip():
                    alias_locs.append((name, loc + (key, j)))
                else:
                    problems.add(loc + (key, j),
                                 f"an alias must be a non-empty string, got {name!r}")
        elif key in ("mmproj", CLIP_MODEL_PATH):  # llama-cpp-python's name for the same file
            if "mmproj" in raw and CLIP_MODEL_PATH in raw:
                problems.add(loc + (key,), "give `mmproj` or `clip_model_path`, not both")
            fields["mmproj"] = _mmproj_path(value, base_dir, loc + (key,), problems)
            mmproj_key = key
        elif key in ("lora", LORA_PATH):  # llama-cpp-python's lora_path: one adapter, scale 1
            if "lora" in raw and LORA_PATH in raw:
                problems.add(loc + (key,), "give `lora` or `lora_path`, not both")
            adapters += lora_adapters(key, value, base_dir, loc + (key,), problems)
        else:
            _entry_setting(key, value, fields, extra, base_dir, loc, problems)

    _llama_cpp_draft(fields, extra, loc, problems, given=raw)
    _draft_model(fields, base_dir, loc + ("draft", "model"), problems)
    if isinstance(fields.get("mmproj"), Path) and isinstance(fields.get("model"), Path):
        _check_pair(fields["model"], fields["mmproj"], loc + (mmproj_key,), problems)
    if adapters and isinstance(fields.get("model"), Path):
        check_adapters(fields["model"], adapters, problems)
    fields["lora"] = [a for a, _ in adapters]
    if "model" not in raw:
        problems.add(loc + ("model",), "required: the path of a GGUF file")
        return None
    if not alias_locs and "aliases" not in raw and isinstance(raw["model"], str):
        # llama-cpp-python serves an entry without an alias under its `model` string.
        alias_locs = [(raw["model"], loc + ("model",))]
    # Listing a name twice is reported by check_across_entries; pydantic gets each once.
    fields["aliases"] = list(dict.fromkeys(a for a, _ in alias_locs))
    fields["extra"] = extra
    return fields, alias_locs


def _llama_cpp_draft(fields: dict[str, Any], extra: dict[str, Any], loc: Loc, problems: Problems,
                     given: dict[str, Any] | None = None) -> None:
    """llama-cpp-python's `draft_model` (any value: its prompt-lookup decoding) and
    `draft_model_num_pred_tokens` as our `draft`; both in one place is an error."""
    n = extra.pop(DRAFT_MODEL_N, None)
    if extra.pop(DRAFT_MODEL, None) is None:  # (its own dumps hold null and the default n)
        return
    if given is not None and "draft" in given:
        problems.add(loc + (DRAFT_MODEL,), "give `draft` or `draft_model`, not both")
        return
    fields["draft"] = {"lookup": "ngram", "ngram_max": DRAFT_MODEL_NGRAM_MAX,
                       "n_draft": DRAFT_MODEL_N_DEFAULT if n is None else n}


def _draft_model(fields: dict[str, Any], base_dir: Path, loc: Loc, problems: Problems) -> None:
    """A `draft.model` path: relative to the config's folder, a file, of the model's vocabulary."""
    from engine.draft_model import why_not_a_draft
    from engine.gguf import ModelLoadError

    draft = fields.get("draft")
    if not isinstance(draft, dict) or not isinstance(draft.get("model"), str):
        return
    path = (base_dir / Path(draft["model"]).expanduser()).resolve()
    fields["draft"] = {**draft, "model": path}
    if not path.is_file():
        problems.add(loc, f"draft model file not found: {path}")
        return
    model = fields.get("model")
    if isinstance(model, Path) and model.is_file():
        try:
            reason = why_not_a_draft(path, model)
        except (OSError, ModelLoadError) as e:  # an unreadable header: engine.gguf says why
            reason = str(e)
        if reason is not None:
            problems.add(loc, f"{path.name} cannot draft for {model.name}: {reason}")


def _model_path(value: Any, base_dir: Path, loc: Loc, problems: Problems) -> Any:
    if not isinstance(value, str) or not value.strip():
        problems.add(loc, "must be the path of a GGUF file (a string)")
        return value
    path = _resolved(base_dir, value)
    from engine.servable import why_not_servable  # the judgement scan and serve share

    reason = why_not_servable(path)  # its stat is the one a good file costs
    if reason is not None:
        problems.add(loc, f"cannot serve {path}: {reason}" if path.is_file() else
                          f"model file not found: {path}")
    return path


def _resolved(base_dir: Path, value: str) -> Path:
    """`value` (~ expanded) relative to the config's folder, symlinks resolved: os.path's
    realpath directly, as Path.resolve calls it, without its per-part parsing (10,000 entries)."""
    return Path(os.path.realpath(os.path.join(base_dir, os.path.expanduser(value))))


def _mmproj_path(value: Any, base_dir: Path, loc: Loc, problems: Problems) -> Any:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        problems.add(loc, "must be the path of an mmproj GGUF file (a string)")
        return value
    path = (base_dir / Path(value).expanduser()).resolve()
    if not path.is_file():
        problems.add(loc, f"mmproj file not found: {path}")
    return path


def _check_pair(model: Path, mmproj: Path, loc: Loc, problems: Problems) -> None:
    """The projector's header against the model's (engine/servable.py, shared with scan)."""
    from engine.servable import why_not_a_pair, why_not_servable

    if mmproj.is_file() and model.is_file() and why_not_servable(model) is None:
        reason = why_not_a_pair(model, mmproj)
        if reason is not None:
            problems.add(loc, f"cannot give {model.name} images with {mmproj}: {reason}")


def _chat_template(value: Any, base_dir: Path, loc: Loc, problems: Problems) -> dict[str, Any]:
    """`chat_template` is inline template text, or else the path of a file holding it."""
    if value is None:
        return {"chat_template": None, "chat_template_path": None}
    if not isinstance(value, str) or not value.strip():
        problems.add(loc, "must be template text or the path of a template file")
        return {}
    if "{{" in value or "{%" in value or "\n" in value:
        text, path = value, None
    else:
        path = (base_dir / Path(value).expanduser()).resolve()
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            problems.add(loc, f"chat template file not found: {path} (inline templates must "
                              "contain '{{' or '{%')")
            return {}
        except (OSError, UnicodeDecodeError) as e:
            problems.add(loc, f"cannot read chat template file {path}: {e}")
            return {}
    from engine.chat import ChatTemplate, ChatTemplateError

    try:
        ChatTemplate(text)  # compile now: a broken template is a config error, not a 500 later
    except ChatTemplateError as e:
        problems.add(loc, f"{e}" + (f" (in {path})" if path else ""))
        return {}
    return {"chat_template": text, "chat_template_path": path}


M = TypeVar("M", bound=BaseModel)


def _validate(cls: type[M], data: Any, loc: Loc, problems: Problems) -> M | None:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        for err in e.errors():
            where = tuple(p for p in err["loc"] if p not in MEMBER_TAGS)  # a union's tags
            problems.add(loc + where, pydantic_message(err, file_keys(_model_at(cls, where)),
                                                       secret=is_secret_loc(loc + where)))
        return None


def _model_at(cls: type[BaseModel], where: Loc) -> type[BaseModel]:
    """The (nested) model an error's location points into: its keys are the ones to suggest."""
    for part in where[:-1]:
        info = cls.model_fields.get(part) if isinstance(part, str) else None
        nested = next(sections_in(info.annotation), None) if info is not None else None
        cls = nested or cls
    return cls

"""The config file: one pydantic schema, read from YAML, TOML or JSON; every check lives here.

`load_config(path)` either returns a complete, valid `Config` or raises `ConfigError` listing every
problem in the file at once, as `file:line: key.path: message` (the line when the format gives
it: YAML always, TOML and JSON for syntax errors). Nothing past this module sees a raw dict.

Reading happens in four steps, each collecting problems instead of stopping at the first:
  parse (format-specific, remembering the line of every key) -> expand ${VAR} / ${VAR:-default}
  -> prepare (sort keys into ours / llama-cpp-python's / unknown, merge `defaults`, resolve paths,
  read chat template files) -> validate each part with pydantic, then the checks across entries.

Configs written for llama-cpp-python's `--config_file` load unchanged: its server and model keys
that modelyard does not use yet are accepted with a warning (kept in `Config.warnings`, and in
`ModelEntry.extra`), and an entry without aliases answers to its `model` string, as there.
"""
from __future__ import annotations

import difflib
import json
import logging
import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, SecretStr,
                      ValidationError, field_validator, model_validator)

from gateway.units import parse_duration, parse_size

log = logging.getLogger("modelyard.config")

GiB = 1024**3

Duration = Annotated[float, BeforeValidator(parse_duration)]  # seconds
Size = Annotated[int, BeforeValidator(parse_size)]            # bytes

Loc = tuple[str | int, ...]  # a key path: ("models", 1, "aliases")


class ConfigError(Exception):
    """The config file is invalid; `errors` lists every problem, one line each."""

    def __init__(self, source: str, errors: list[str]):
        self.source = source
        self.errors = errors
        count = f"{len(errors)} problem" + ("s" if len(errors) != 1 else "")
        super().__init__(f"invalid config {source} ({count}):\n" + "\n".join(f"  {e}" for e in errors))


class ModelNotFoundError(LookupError):
    """No configured model answers to `alias` (the API turns it into 404 model_not_found)."""

    def __init__(self, alias: str, available: Iterable[str]):
        self.alias = alias
        self.available = list(available)
        super().__init__(f"model {alias!r} does not exist; available: {', '.join(self.available)}")


# ---------------------------------------------------------------------------------------------
# Schema

class RegistrySettings(BaseModel):
    """How many models stay loaded, and for how long."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_loaded_models: int = Field(2, ge=1)
    memory_budget: Size = 4 * GiB          # weights + KV cache of every loaded model
    idle_timeout: Duration = 600.0         # 0 = never unload for idleness
    load_timeout: Duration = Field(120.0, gt=0)  # the longest a request waits for a model


class LimitSettings(BaseModel):
    """What one request may cost before it is refused (gateway/limits.py enforces them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body: Size = Field(32 * 1024 * 1024, ge=1)  # a larger request body gets 413
    body_timeout: Duration = Field(30.0, gt=0)      # reading one body; slower clients get 408
    template_timeout: Duration = Field(2.0, gt=0)   # rendering one chat template; then 400
    max_prompt: Size = Field(64 * 1024 * 1024, ge=1)  # prompt text before tokenizing; then 413


class _EntrySettings(BaseModel):
    """The per-model keys that may also be given once under `defaults`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_ctx: int = 4096
    n_threads: int = 2
    n_parallel: int = Field(4, ge=1)       # requests batched together (scheduler)
    max_queue: int = Field(64, ge=0)       # requests waiting beyond n_parallel before 503
    idle_timeout: Duration | None = None   # None = registry.idle_timeout; 0 = never
    chat_template: str | None = None       # template text; None = the GGUF's own
    chat_template_path: Path | None = None  # where chat_template was read from, for watching
    chat_format: str | None = None         # a built-in template by name (engine/chat_formats.py)
    pinned: bool = False                   # never evicted, loaded at start-up
    # Sampling defaults for requests that leave a field out (gateway/defaults.py); None = the
    # GGUF's general.sampling.* value, else llama.cpp's. Applied live on reload.
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    max_tokens: int | None = Field(None, ge=1)  # None: chat 1024 (<= n_ctx/2), completions 16
    seed: int | None = None                # requests without a seed use it (llama.cpp --seed)

    @field_validator("n_ctx")
    @classmethod
    def _positive_context(cls, v: int) -> int:
        if v == 0:
            raise ValueError("0 (llama-cpp-python's 'the model's own context size') is not "
                             "supported yet; give a size such as 4096")
        if v < 1:
            raise ValueError("must be at least 1")
        return v

    @field_validator("chat_format")
    @classmethod
    def _known_format(cls, v: str | None) -> str | None:
        from engine.chat_formats import FORMAT_NAMES, builtin_name

        if v is not None and builtin_name(v) is None:
            close = difflib.get_close_matches(v.strip().lower(), FORMAT_NAMES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown chat format {v!r}{hint} (known: {', '.join(FORMAT_NAMES)})")
        return v

    @field_validator("n_threads")
    @classmethod
    def _threads(cls, v: int) -> int:
        # after pydantic's int parsing, so -1 also works from "${THREADS:--1}"
        if v == -1:  # llama-cpp-python reads -1 as "every core"
            return os.cpu_count() or 1
        if v < 1:
            raise ValueError("must be at least 1 (or -1 for every core)")
        return v


class ModelEntry(_EntrySettings):
    """One servable model: a GGUF file, the names it answers to, and how to run it."""

    model: Path                            # absolute
    aliases: list[str] = Field(min_length=1)
    extra: dict[str, Any] = Field(default_factory=dict)  # llama-cpp-python keys, not used yet

    @field_validator("model")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v if v.is_absolute() else (Path.cwd() / v).resolve()

    @field_validator("aliases")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for alias in v:
            if not alias.strip():
                raise ValueError("an alias must not be empty")
        if len(set(v)) != len(v):
            raise ValueError(f"an alias is listed twice: {v}")
        return v

    def settings_key(self) -> tuple[object, ...]:
        """What must stay equal for a loaded model to stay warm across a config reload.

        Aliases, pinned and idle_timeout are registry policy and apply to a loaded model live;
        everything that shapes the loaded object (or the scheduler wrapped around it) is here.
        """
        return (str(self.model), self.n_ctx, self.n_threads, self.n_parallel, self.max_queue,
                self.chat_template, self.chat_format)

    @property
    def name(self) -> str:
        """The first alias: how logs and errors refer to the entry."""
        return self.aliases[0]


class ApiKey(BaseModel):
    """One client key of `auth.keys`. The key's value is a secret: never logged or shown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)        # how logs and metrics name the key
    key: SecretStr                         # from `key` (e.g. ${ENV}) or the file `key_file`
    models: list[str] | None = None        # aliases it may use; None = every model
    max_concurrent: int | None = Field(None, ge=1)      # requests in flight at once
    requests_per_minute: int | None = Field(None, ge=1)


class AuthSettings(BaseModel):
    """`auth:` API keys for the API and a separate admin key (gateway/auth.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: list[ApiKey] = Field(default_factory=list)
    admin_key: SecretStr | None = None     # for /admin/* and the router API (/models/load...)
    public: list[str] = Field(default_factory=lambda: ["/health", "/metrics"])

    @property
    def enabled(self) -> bool:
        return bool(self.keys) or self.admin_key is not None


class CorsSettings(BaseModel):
    """`cors:` which browser origins may call the API (none by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_origins: list[str] = Field(default_factory=list)  # ["*"] for any origin


class _ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)  # 0 = any free port
    default_model: str | None = None       # alias used when a request names no model
    shutdown_timeout: Duration = Field(60.0, ge=0)  # SIGTERM: how long running requests may finish


class Config(_ServerSettings):
    """A complete, checked configuration."""

    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    cors: CorsSettings = Field(default_factory=CorsSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    models: list[ModelEntry] = Field(min_length=1)
    source: Path | None = None             # the file this came from; None = built in code
    warnings: list[str] = Field(default_factory=list)  # accepted-but-unused keys

    _by_alias: dict[str, ModelEntry] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        problems = _Problems()
        _check_across_entries(
            [(i, [(a, ("models", i, "aliases")) for a in e.aliases], str(e.model))
             for i, e in enumerate(self.models)],
            self.default_model, problems)
        if problems.items:
            raise ValueError("; ".join(f"{_dotted(loc)}: {msg}" for loc, msg in problems.items))
        return self

    def model_post_init(self, context: Any, /) -> None:
        self._by_alias = {a: e for e in self.models for a in e.aliases}

    def resolve(self, alias: str | None) -> ModelEntry:
        """The entry serving `alias`; None means default_model, or else the first entry."""
        if alias is None:
            if self.default_model is None:
                return self.models[0]
            alias = self.default_model
        try:
            return self._by_alias[alias]
        except KeyError:
            raise ModelNotFoundError(alias, self.aliases()) from None

    def aliases(self) -> list[str]:
        return [a for e in self.models for a in e.aliases]


def default_config() -> Config:
    """Used without a config file: serve the default model (downloaded once) as `smollm2`."""
    from engine.default_model import DEFAULT_ALIAS, default_model_path

    entry = ModelEntry(model=default_model_path(), aliases=[DEFAULT_ALIAS])
    return Config(default_model=DEFAULT_ALIAS, models=[entry])


# ---------------------------------------------------------------------------------------------
# Keys

_TOP_KEYS = ("host", "port", "default_model", "shutdown_timeout", "registry", "limits", "auth",
             "cors", "defaults", "models")
_ENTRY_KEYS = ("model", "aliases", "model_alias", "n_ctx", "n_threads", "n_parallel",
               "max_queue", "idle_timeout", "chat_template", "chat_format", "pinned",
               "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty",
               "frequency_penalty", "max_tokens", "seed")
_PER_MODEL_ONLY = ("model", "aliases", "model_alias")

# llama-cpp-python's ServerSettings and ModelSettings keys that modelyard does not use (yet).
LLAMA_CPP_SERVER_KEYS = frozenset({
    "ssl_keyfile", "ssl_certfile", "interrupt_requests", "disable_ping_events",
    "root_path",
})
LLAMA_CPP_MODEL_KEYS = frozenset({
    "n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "vocab_only", "use_mmap",
    "use_mlock", "kv_overrides", "rpc_servers", "n_batch", "n_ubatch", "n_threads_batch",
    "rope_scaling_type", "rope_freq_base", "rope_freq_scale", "yarn_ext_factor",
    "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx", "mul_mat_q",
    "logits_all", "embedding", "offload_kqv", "flash_attn", "last_n_tokens_size", "lora_base",
    "lora_path", "numa", "clip_model_path", "cache", "cache_type", "cache_size",
    "hf_tokenizer_config_path", "hf_pretrained_model_name_or_path", "hf_model_repo_id",
    "draft_model", "draft_model_num_pred_tokens", "type_k", "type_v", "verbose",
})
_SERVER_KEY_NOTES = {
    "ssl_keyfile": "TLS is not served yet: put a reverse proxy in front for HTTPS",
    "ssl_certfile": "TLS is not served yet: put a reverse proxy in front for HTTPS",
}


# ---------------------------------------------------------------------------------------------
# Loading

class _ParseError(Exception):
    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.line = line


class _Problems:
    """Problems and warnings found so far, each with the key path it belongs to."""

    def __init__(self) -> None:
        self.items: list[tuple[Loc, str]] = []
        self.warnings: list[tuple[Loc, str]] = []
        self.settled: set[Loc] = set()  # reported at the source: later complaints are noise

    def add(self, loc: Loc, message: str, *, settle: bool = False) -> None:
        if not any(loc[:n] in self.settled for n in range(len(loc) + 1)):
            self.items.append((loc, message))
        if settle:
            self.settled.add(loc)

    def warn(self, loc: Loc, message: str) -> None:
        self.warnings.append((loc, message))


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a YAML (.yaml/.yml), TOML (.toml) or JSON (.json) config file."""
    path = Path(path)
    shown = str(path)
    readers = {".yaml": _read_yaml, ".yml": _read_yaml, ".toml": _read_toml, ".json": _read_json}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise ConfigError(shown, [f"{shown}: unsupported config format {path.suffix or '(none)'!r}"
                                  "; use .yaml, .yml, .toml or .json"])
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(shown, [f"{shown}: config file not found"]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(shown, [f"{shown}: cannot read the config file: {e}"]) from None

    problems = _Problems()
    try:
        data, lines = reader(text, problems)
    except _ParseError as e:
        where = f"{shown}:{e.line}" if e.line else shown
        raise ConfigError(shown, [f"{where}: {e.message}"]) from None

    config = _build(data, path.resolve().parent, problems, source=path.resolve())
    if problems.items or config is None:
        raise ConfigError(shown, _render(problems.items, lines, shown))
    warnings = _render(problems.warnings, lines, shown)
    for message in warnings:
        log.warning("%s", message)
    return config.model_copy(update={"warnings": warnings})


# -- parsing, format by format; each returns (data, {key path: line}) ------------------------

def _read_yaml(text: str, problems: _Problems) -> tuple[Any, dict[Loc, int]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        message = ", ".join(str(p) for p in (e.context, e.problem) if p)
        raise _ParseError(f"invalid YAML: {message}", mark.line + 1 if mark else None) from None
    except yaml.YAMLError as e:
        raise _ParseError(f"invalid YAML: {e}") from None
    finally:
        loader.dispose()
    lines: dict[Loc, int] = {}
    if node is not None:
        _index_yaml(node, (), lines, problems)
    return data, lines


def _index_yaml(node: yaml.Node, loc: Loc, lines: dict[Loc, int], problems: _Problems) -> None:
    """Record the line of every key and item; report duplicate keys (PyYAML keeps the last)."""
    if loc:  # the document itself has no useful line
        lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key, line = key_node.value, key_node.start_mark.line + 1
            if key in first_line:
                problems.add(loc + (key,), f"duplicate key: given on line {first_line[key]} "
                                           f"and again on line {line}")
                continue
            first_line[key] = line
            lines[loc + (key,)] = line
            _index_yaml(value_node, loc + (key,), lines, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_yaml(item, loc + (i,), lines, problems)


def _read_toml(text: str, problems: _Problems) -> tuple[Any, dict[Loc, int]]:
    try:
        return tomllib.loads(text), {}
    except tomllib.TOMLDecodeError as e:
        message = str(e)
        at = re.search(r"\s*\(at line (\d+), column \d+\)$", message)
        if at:
            raise _ParseError(f"invalid TOML: {message[:at.start()]}", int(at.group(1))) from None
        raise _ParseError(f"invalid TOML: {message}") from None


def _read_json(text: str, problems: _Problems) -> tuple[Any, dict[Loc, int]]:
    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                problems.add((), f"duplicate key {key!r} in a JSON object")
            seen[key] = value
        return seen

    try:
        return json.loads(text, object_pairs_hook=unique_keys), {}
    except json.JSONDecodeError as e:
        raise _ParseError(f"invalid JSON: {e.msg} (column {e.colno})", e.lineno) from None


# -- ${VAR} expansion --------------------------------------------------------------------------

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _expand_env(value: Any, loc: Loc, problems: _Problems) -> Any:
    """Expand ${VAR} and ${VAR:-default} in every string value; `$${` writes a literal `${`.
    A default may itself hold references: ${A:-${B:-x}} is A, else B, else x."""
    if isinstance(value, dict):
        return {k: _expand_env(v, loc + (k,), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, loc + (i,), problems) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value
    text, _ = _expand_text(value, 0, loc, problems, inside=False)
    return text


def _expand_text(text: str, at: int, loc: Loc, problems: _Problems,
                 inside: bool) -> tuple[str, int]:
    """Expand from `at` to the end (or, `inside` a default, to its closing brace); returns the
    text and where it stopped (just past that brace)."""
    out: list[str] = []
    while at < len(text):
        if text.startswith("$${", at):
            out.append("${")
            at += 3
        elif text.startswith("${", at) and (name := _ENV_NAME.match(text, at + 2)):
            end = name.end()
            default: str | None = None
            inner = _Problems()  # the default's own problems count only if it is used
            if text.startswith(":-", end):
                default, end = _expand_text(text, end + 2, loc, inner, inside=True)
            elif text.startswith("}", end):
                end += 1
            else:  # not a reference after all: keep it as written
                out.append(text[at:end])
                at = end
                continue
            if not os.environ.get(name.group(0)):
                problems.items += inner.items
                problems.settled |= inner.settled
            out.append(_lookup(name.group(0), default, loc, problems))
            at = end
        elif inside and text[at] == "}":
            return "".join(out), at + 1
        else:
            out.append(text[at])
            at += 1
    return "".join(out), at


def _lookup(name: str, default: str | None, loc: Loc, problems: _Problems) -> str:
    found = os.environ.get(name)
    if found:  # like the shell's ${VAR:-default}: an empty variable takes the default too
        return found
    if default is not None:
        return default
    if found is not None:
        return found
    problems.add(loc, f"environment variable {name} is not set "
                      f"(write ${{{name}:-default}} to give a fallback)", settle=True)
    return ""


# -- preparing and validating -----------------------------------------------------------------

def _build(data: Any, base_dir: Path, problems: _Problems, source: Path) -> Config | None:
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        problems.add((), f"the top level must be a mapping of keys ({', '.join(_TOP_KEYS)}); "
                         f"got {got}")
        return None
    data = _expand_env(data, (), problems)

    for key in data:
        if key == "api_key":  # llama-cpp-python's single key: enforced (see _auth_section)
            continue
        if key in LLAMA_CPP_SERVER_KEYS:
            note = _SERVER_KEY_NOTES.get(key, "not used by modelyard yet")
            problems.warn((key,), f"accepted for llama-cpp-python compatibility; {note}")
        elif key not in _TOP_KEYS:
            problems.add((key,), _unknown_key(key, _TOP_KEYS))

    server = _validate(_ServerSettings, {k: data[k] for k in _ServerSettings.model_fields
                                         if k in data}, (), problems)
    registry = _validate(RegistrySettings, _section(data, "registry"), ("registry",), problems)
    auth = _validate(AuthSettings, _auth_section(data, base_dir, problems), ("auth",), problems)
    cors = _validate(CorsSettings, _section(data, "cors"), ("cors",), problems)
    limits = _validate(LimitSettings, _section(data, "limits"), ("limits",), problems)
    defaults = _prepare_defaults(_section(data, "defaults"), base_dir, problems)

    raw_models = data.get("models")
    entries: list[ModelEntry | None] = []
    seen: list[tuple[int, list[tuple[str, Loc]], str | None]] = []
    if not isinstance(raw_models, list) or not raw_models:
        problems.add(("models",), "required: a list with at least one model "
                                  "(each at least `model: path/to/file.gguf`)")
    else:
        for i, raw in enumerate(raw_models):
            prepared = _prepare_entry(raw, defaults, base_dir, ("models", i), problems)
            if prepared is None:
                entries.append(None)
                continue
            entry_fields, alias_locs = prepared
            model = entry_fields.get("model")
            seen.append((i, alias_locs, str(model) if isinstance(model, Path) else None))
            entries.append(_validate(ModelEntry, entry_fields, ("models", i), problems))

    default_model = data.get("default_model")
    all_prepared = len(seen) == len(entries) > 0
    _check_across_entries(
        seen, default_model if isinstance(default_model, str) and all_prepared else None, problems)
    if (problems.items or server is None or registry is None or auth is None or cors is None
            or limits is None or None in entries):
        return None
    try:
        return Config(**server.model_dump(), registry=registry, auth=auth, cors=cors,
                      limits=limits,
                      models=[e for e in entries if e is not None], source=source)
    except ValidationError as e:  # a check above missed something; still report, never crash
        for err in e.errors():
            problems.add(tuple(err["loc"]), _message(err, _TOP_KEYS))
        return None


def _secret(raw: dict[str, Any], key: str, base_dir: Path, loc: Loc, problems: _Problems) -> None:
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


def _auth_section(data: dict[str, Any], base_dir: Path, problems: _Problems) -> Any:
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
    api_key = data.get("api_key")
    if isinstance(api_key, str) and api_key:
        raw["keys"] = [*raw.get("keys", []), {"name": "api_key", "key": api_key}]
        raw.setdefault("admin_key", api_key)
    elif api_key is not None:
        problems.add(("api_key",), "must be a non-empty string")
    for i, item in enumerate(raw.get("keys") or []):
        if isinstance(item, dict) and isinstance(item.get("key"), str) and not item["key"].strip():
            problems.add(("auth", "keys", i, "key"), "must not be empty")
    return raw


def _section(data: dict[str, Any], key: str) -> Any:
    """A mapping section; `registry:` with every key commented out reads as empty."""
    value = data.get(key)
    return {} if value is None else value


def _entry_setting(key: str, value: Any, fields: dict[str, Any], extra: dict[str, Any],
                   base_dir: Path, loc: Loc, problems: _Problems) -> None:
    """A key that `defaults` and a `models` entry share: the chat template, one of our settings,
    a llama-cpp-python key (kept in `extra`, with a warning) or an unknown key (an error)."""
    if key == "chat_template":
        fields.update(_chat_template(value, base_dir, loc + (key,), problems))
    elif key in _ENTRY_KEYS:
        fields[key] = value
    elif key in LLAMA_CPP_MODEL_KEYS:
        problems.warn(loc + (key,), "accepted for llama-cpp-python compatibility; "
                                    "not used by modelyard yet")
        extra[key] = value
    else:
        problems.add(loc + (key,), _unknown_key(key, _ENTRY_KEYS))


def _prepare_defaults(raw: Any, base_dir: Path, problems: _Problems) -> dict[str, Any]:
    """The `defaults` keys that are valid, ready to merge under every entry."""
    loc: Loc = ("defaults",)
    if not isinstance(raw, dict):
        problems.add(loc, "must be a mapping of model keys (n_ctx, n_threads, ...)")
        return {}
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _PER_MODEL_ONLY:
            problems.add(loc + (key,), "belongs in each entry of `models`, not in defaults")
        else:
            _entry_setting(key, value, fields, extra, base_dir, loc, problems)
    # Check the values once here, so a bad default is reported once, not once per model.
    try:
        _EntrySettings.model_validate(fields)
    except ValidationError as e:
        for err in e.errors():
            problems.add(loc + tuple(err["loc"]), _message(err, _ENTRY_KEYS))
            fields.pop(str(err["loc"][0]), None)
    if extra:
        fields["extra"] = extra
    return fields


def _prepare_entry(raw: Any, defaults: dict[str, Any], base_dir: Path, loc: Loc,
                   problems: _Problems) -> tuple[dict[str, Any], list[tuple[str, Loc]]] | None:
    """Turn one `models` item into ModelEntry fields; also return where each alias came from."""
    if not isinstance(raw, dict):
        problems.add(loc, "must be a mapping with at least `model: path/to/file.gguf`")
        return None
    fields = {k: v for k, v in defaults.items() if k != "extra"}
    extra = dict(defaults.get("extra", {}))
    alias_locs: list[tuple[str, Loc]] = []

    for key, value in raw.items():
        if key == "model":
            fields["model"] = _model_path(value, base_dir, loc + (key,), problems)
        elif key == "model_alias":  # llama-cpp-python's single alias comes first
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
                    problems.add(loc + (key, j), f"an alias must be a non-empty string, got {name!r}")
        else:
            _entry_setting(key, value, fields, extra, base_dir, loc, problems)

    if "model" not in raw:
        problems.add(loc + ("model",), "required: the path of a GGUF file")
        return None
    if not alias_locs and "aliases" not in raw and isinstance(raw["model"], str):
        # llama-cpp-python serves an entry without an alias under its `model` string.
        alias_locs = [(raw["model"], loc + ("model",))]
    # Listing a name twice is reported by _check_across_entries; pydantic gets each once.
    fields["aliases"] = list(dict.fromkeys(a for a, _ in alias_locs))
    fields["extra"] = extra
    return fields, alias_locs


def _model_path(value: Any, base_dir: Path, loc: Loc, problems: _Problems) -> Any:
    if not isinstance(value, str) or not value.strip():
        problems.add(loc, "must be the path of a GGUF file (a string)")
        return value
    path = (base_dir / Path(value).expanduser()).resolve()
    if not path.is_file():
        problems.add(loc, f"model file not found: {path}")
        return path
    from engine.servable import why_not_servable  # the judgement scan and serve share

    reason = why_not_servable(path)
    if reason is not None:
        problems.add(loc, f"cannot serve {path}: {reason}")
    return path


def _chat_template(value: Any, base_dir: Path, loc: Loc, problems: _Problems) -> dict[str, Any]:
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


def _check_across_entries(entries: list[tuple[int, list[tuple[str, Loc]], str | None]],
                          default_model: str | None, problems: _Problems) -> None:
    """Aliases unique across all entries; default_model exists. Several entries may share one
    model file (with different settings: llama-cpp-python's docs serve gpt-3.5-turbo and gpt-4
    from one file with different n_ctx); the registry keys its models by entry."""
    owner: dict[str, int] = {}
    for i, alias_locs, _model in entries:
        for alias, loc in alias_locs:
            if alias not in owner:
                owner[alias] = i
            elif owner[alias] == i:
                problems.add(loc, f"duplicate alias {alias!r}: listed twice in this entry")
            else:
                problems.add(loc, f"duplicate alias {alias!r}: models.{owner[alias]} already "
                                  "answers to it")
    if default_model is not None and owner and default_model not in owner:
        problems.add(("default_model",), f"no model answers to {default_model!r}; aliases: "
                                         f"{', '.join(owner)}")


M = TypeVar("M", bound=BaseModel)


def _validate(cls: type[M], data: Any, loc: Loc, problems: _Problems) -> M | None:
    known = tuple(cls.model_fields)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        for err in e.errors():
            problems.add(loc + tuple(err["loc"]), _message(err, known))
        return None


def _message(err: Any, known: Iterable[str]) -> str:
    """pydantic's error, said the way a config file's author needs it."""
    kind = err["type"]
    if kind == "extra_forbidden":
        return _unknown_key(str(err["loc"][-1]), known)
    if kind == "missing":
        return "required"
    if kind in ("model_type", "dict_type"):
        return "must be a mapping of keys"
    message: str = err["msg"]
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    shown = repr(err.get("input"))
    return f"{message} (got {shown if len(shown) <= 60 else shown[:57] + '...'})"


def _unknown_key(key: str, known: Iterable[str]) -> str:
    public = [k for k in known if k not in ("chat_template_path", "extra")]
    close = difflib.get_close_matches(str(key), public, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(public)})"
    return "unknown key" + hint


def _dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc)


def _render(items: list[tuple[Loc, str]], lines: dict[Loc, int], shown: str) -> list[str]:
    """`file:line: key.path: message`, in file order where lines are known."""
    def line_of(loc: Loc) -> int | None:
        while True:
            if loc in lines:
                return lines[loc]
            if not loc:
                return None
            loc = loc[:-1]

    rendered = []
    for loc, message in items:
        line = line_of(loc)
        where = f"{shown}:{line}" if line else shown
        rendered.append((line is None, line or 0, f"{where}: {_dotted(loc)}: {message}" if loc
                         else f"{where}: {message}"))
    return [text for *_, text in sorted(rendered, key=lambda r: r[:2])]

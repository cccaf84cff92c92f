"""The config's pydantic schema: what a complete, checked configuration holds.

Each field says when a change to it applies on reload (`LIVE`, `RELOAD`, `RESTART`, see
gateway/config/reload.py), and the key lists the loader checks files against derive from these
models (`TOP_KEYS`, `ENTRY_KEYS`), as does the JSON Schema of the file (json_schema.py).

Adding a key: declare the field here with its mark and a description; the loader, the reload
diff and the JSON Schema follow. Then `modelyard config-schema -o examples/config.schema.json`
and `modelyard config-schema --markdown -o docs/configuration/reference.md` (a test fails until
each copy is current); more than a line's worth goes in docs/configuration/index.md.
"""
from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)

from gateway.config.aliases import is_glob
from gateway.config.llama_cpp import CLIP_MODEL_PATH, LORA_PATH, MODEL_ALIAS, ROPE_SCALING_BY_NUMBER
from gateway.config.problems import Loc, Problems, dotted
from gateway.config.reload import INTERNAL, LIVE, RELOAD, RESTART, file_keys, settings_key
from gateway.config.upstream import UpstreamEntry, check_pool_members
from gateway.units import parse_duration, parse_listen, parse_size

GiB = 1024**3

Duration = Annotated[float, BeforeValidator(parse_duration)]  # seconds
Size = Annotated[int, BeforeValidator(parse_size)]            # bytes

_SAMPLING = ("the sampling default of requests that leave it out; default: the GGUF's "
             "general.sampling.* value, else llama.cpp's")


class ModelNotFoundError(LookupError):
    """No configured model answers to `alias` (the API turns it into 404 model_not_found)."""

    def __init__(self, alias: str, available: Iterable[str]):
        self.alias = alias
        self.available = list(available)
        super().__init__(f"model {alias!r} does not exist; available: {', '.join(self.available)}")


class RegistrySettings(BaseModel):
    """How many models stay loaded, and for how long."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_loaded_models: Annotated[int, LIVE] = Field(
        2, ge=1, description="models loaded at once; one more evicts the least recently used")
    memory_budget: Annotated[Size, LIVE] = Field(
        4 * GiB, description="weights + KV cache of every loaded model (bytes, or 4GiB)")
    idle_timeout: Annotated[Duration, LIVE] = Field(
        600.0, description="unload a model after this long unused (seconds, or 10m); 0 = never")
    load_timeout: Annotated[Duration, LIVE] = Field(
        120.0, gt=0, description="the longest a request waits for its model to become ready")


class LimitSettings(BaseModel):
    """What one request may cost before it is refused (gateway/http/limits.py enforces them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body: Annotated[Size, LIVE] = Field(
        32 * 1024 * 1024, ge=1, description="largest request body; a larger one gets 413")
    body_timeout: Annotated[Duration, LIVE] = Field(
        30.0, gt=0, description="the longest one request body may take to arrive; then 408")
    template_timeout: Annotated[Duration, LIVE] = Field(
        2.0, gt=0, description="the longest a chat template may render; then 400")
    max_prompt: Annotated[Size, LIVE] = Field(
        64 * 1024 * 1024, ge=1, description="most characters of prompt text; then 413")
    # Image URLs (gateway/generation/images.py): data: URLs always; http(s) only when switched on
    remote_images: Annotated[bool, LIVE] = Field(
        False, description="fetch http(s) image URLs of requests; off: only data: URLs (else 400)")
    remote_image_max_bytes: Annotated[Size, LIVE] = Field(
        10 * 1024 * 1024, ge=1, description="largest image a remote URL may send; then 400")
    remote_image_timeout: Annotated[Duration, LIVE] = Field(
        10.0, gt=0, description="the longest fetching one remote image may take; then 400")
    remote_image_hosts: Annotated[list[str], LIVE] = Field(
        default_factory=list, description="the hosts remote image URLs may name; empty: any")


class ResponsesSettings(BaseModel):
    """The store behind /v1/responses' previous_response_id (gateway/api/response_store.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store_entries: Annotated[int, LIVE] = Field(
        256, ge=0, description="responses kept for previous_response_id; 0: stateless (a 400)")
    store_bytes: Annotated[Size, LIVE] = Field(
        64 * 1024 * 1024, ge=0, description="most bytes of conversation kept; oldest go first")
    store_ttl: Annotated[Duration, LIVE] = Field(
        3600.0, gt=0, description="how long a stored response can be continued")


class DraftSettings(BaseModel):
    """Speculative decoding (engine/draft.py): what proposes the tokens the model checks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lookup: Annotated[Literal["ngram"] | None, RELOAD] = Field(
        None, description="ngram: prompt lookup, drafts copied from the prompt and the text "
                          "so far")
    model: Annotated[Path | None, RELOAD] = Field(  # absolute once loaded
        None, description="a small GGUF of the same vocabulary that drafts greedily (relative "
                          "to the config file's folder)")
    p_min: Annotated[float, RELOAD] = Field(
        0.0, ge=0.0, le=1.0, description="a draft model stops drafting where its top "
                                         "probability is below this")
    n_draft: Annotated[int, RELOAD] = Field(8, ge=1, le=64, description="most tokens drafted per step")
    ngram_min: Annotated[int, RELOAD] = Field(1, ge=1, le=16, description="shortest suffix looked up")
    ngram_max: Annotated[int, RELOAD] = Field(
        3, ge=1, le=16, description="longest suffix looked up (tried first)")

    @model_validator(mode="after")
    def _ngram_range(self) -> DraftSettings:
        if (self.lookup is None) == (self.model is None):
            raise ValueError("give one of `lookup: ngram` (prompt lookup) or `model: PATH`")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) is above ngram_max ({self.ngram_max})")
        return self


class EntrySettings(BaseModel):
    """The per-model keys that may also be given once under `defaults`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_ctx: Annotated[int, RELOAD] = Field(
        4096, description="context size in tokens (the KV cache is sized for it); 0 = the "
                          "model's trained context, if it fits memory_budget")
    n_threads: Annotated[int, RELOAD] = Field(
        2, description="threads for this model's computation; -1 = every core")
    n_parallel: Annotated[int, RELOAD] = Field(
        4, ge=1, description="requests served together (batched) by this model")
    max_queue: Annotated[int, RELOAD] = Field(
        64, ge=0, description="requests waiting beyond n_parallel; more get 503")
    idle_timeout: Annotated[Duration | None, LIVE] = Field(
        None, description="this model's idle timeout; 0 = never; default: registry.idle_timeout")
    chat_template: Annotated[str | None, RELOAD] = Field(
        None, description="a Jinja chat template: inline text, or the path of a template file; "
                          "default: the GGUF's own")
    # where chat_template was read from, for watching
    chat_template_path: Annotated[Path | None, INTERNAL] = None
    chat_format: Annotated[str | None, RELOAD] = Field(
        None, description="a built-in chat template by name: chatml, llama-3, gemma, ... "
                          "(engine/chat_formats.py)")
    draft: Annotated[DraftSettings | None, RELOAD] = Field(
        None, description="speculative decoding: {lookup: ngram, n_draft, ngram_min, ngram_max} "
                          "(llama-cpp-python's draft_model: prompt-lookup-decoding); greedy "
                          "output is unchanged, sampled output keeps its distribution")
    pinned: Annotated[bool, LIVE] = Field(
        False, description="load at start-up; never evicted or unloaded for idleness")
    # Rope over the file's own values, as llama.cpp's context parameters (engine/rope_settings.py);
    # each default is llama.cpp's "not set": the file's value
    rope_freq_base: Annotated[float, RELOAD] = Field(
        0.0, ge=0, allow_inf_nan=False, description="rope base frequency; 0 = the file's")
    rope_freq_scale: Annotated[float, RELOAD] = Field(
        0.0, ge=0, allow_inf_nan=False,
        description="rope frequency scale, 1 / the context's stretch (0.25: 4x); 0 = the file's")
    rope_scaling_type: Annotated[Literal["none", "linear", "yarn", -1, 0, 1, 2] | None, RELOAD] = (
        Field(None, description="none, linear or yarn (llama.cpp's 0, 1, 2; -1 or null = the "
                                "file's); none ignores rope_freq_scale"))
    yarn_ext_factor: Annotated[float, RELOAD] = Field(
        -1.0, allow_inf_nan=False,
        description="YaRN's extrapolation mix; negative = 1 under yarn scaling, else 0")
    yarn_attn_factor: Annotated[float, RELOAD] = Field(
        -1.0, allow_inf_nan=False, description="rope's cos/sin factor, read only while "
                                               "yarn_ext_factor is 0; negative = the file's")
    yarn_beta_fast: Annotated[float, RELOAD] = Field(
        -1.0, allow_inf_nan=False, description="YaRN ramp's fast end (turns); negative = the "
                                               "file's, else 32")
    yarn_beta_slow: Annotated[float, RELOAD] = Field(
        -1.0, allow_inf_nan=False, description="YaRN ramp's slow end (turns); negative = the "
                                               "file's, else 1")
    yarn_orig_ctx: Annotated[int, RELOAD] = Field(
        0, ge=0, description="the context YaRN's ramp counts turns in; 0 = the file's "
                             "original context, else its trained context")
    flash_attn: Annotated[bool, RELOAD] = Field(
        True, description="follow llama.cpp's flash-attention numerics; false: its plain "
                          "attention path (llama-cpp-python's key)")
    type_k: Annotated[str | int | None, RELOAD] = Field(
        "f16", description="KV cache key type: f16, q8_0 or q4_0 (llama.cpp's -ctk), or its "
                           "ggml number (1, 8, 2: llama-cpp-python's); q8_0 halves the KV "
                           "memory; a quantized cache needs flash_attn and type_v quantized too")
    type_v: Annotated[str | int | None, RELOAD] = Field(
        "f16", description="KV cache value type, as type_k (llama.cpp's -ctv)")
    # The prompt cache beyond the slots (engine/prompt_cache/; docs/configuration/caching.md)
    prompt_cache: Annotated[Size | None, RELOAD] = Field(
        None, description="bytes of KV prefixes kept beyond the slots, shared across "
                                "conversations and counted in memory_budget (2GiB); 0 = none; "
                                "default: cache_size when cache is true, else 0")
    prompt_cache_disk: Annotated[Size | None, RELOAD] = Field(
        None, description="bytes of prompt-cache blocks kept on disk when the model "
                                "unloads or the server stops, read back on its next load; "
                                "default: cache_size when cache_type is disk, else 0")
    prompt_cache_dir: Annotated[Path | None, RELOAD] = Field(
        None, description="folder of the disk blocks (relative to the config's folder); "
                          "default: $MODELYARD_CACHE/prompt-cache")
    cache: Annotated[bool, RELOAD] = Field(
        False, description="llama-cpp-python's: keep a prompt cache of cache_size "
                           "(prompt_cache)")
    cache_type: Annotated[Literal["ram", "disk"], RELOAD] = Field(
        "ram", description="llama-cpp-python's: disk also keeps the cache on disk across "
                           "unloads and restarts (prompt_cache_disk)")
    cache_size: Annotated[Size, RELOAD] = Field(
        2 * GiB, description="llama-cpp-python's: the prompt cache's bytes when cache is true")
    slot_save_path: Annotated[Path | None, LIVE] = Field(
        None, description="the folder of POST /slots/{id}?action=save|restore files "
                          "(llama-server's --slot-save-path); unset: those actions are refused")
    # Sampling defaults for requests that leave a field out (gateway/generation/defaults.py); None = the
    # GGUF's general.sampling.* value, else llama.cpp's.
    temperature: Annotated[float | None, LIVE] = Field(None, ge=0.0, le=2.0, description=_SAMPLING)
    top_p: Annotated[float | None, LIVE] = Field(None, ge=0.0, le=1.0, description=_SAMPLING)
    top_k: Annotated[int | None, LIVE] = Field(None, ge=0, description=_SAMPLING)
    min_p: Annotated[float | None, LIVE] = Field(None, ge=0.0, le=1.0, description=_SAMPLING)
    repeat_penalty: Annotated[float | None, LIVE] = Field(None, gt=0.0, description=_SAMPLING)
    presence_penalty: Annotated[float | None, LIVE] = Field(
        None, ge=-2.0, le=2.0, description=_SAMPLING)
    frequency_penalty: Annotated[float | None, LIVE] = Field(
        None, ge=-2.0, le=2.0, description=_SAMPLING)
    max_tokens: Annotated[int | None, LIVE] = Field(
        None, ge=1, description="the default budget of requests without one; default: chat 1024 "
                                "(at most n_ctx / 2), completions 16")
    seed: Annotated[int | None, LIVE] = Field(
        None, description="the seed of requests that bring none (llama-server's --seed)")
    # Reasoning defaults for requests that leave them out (gateway/generation/reasoning.py)
    chat_template_kwargs: Annotated[dict[str, Any] | None, LIVE] = Field(
        None, description="names the chat template reads, under a request's own "
                          "(llama-server's --chat-template-kwargs), e.g. {enable_thinking: false}")
    reasoning_format: Annotated[Literal["none", "auto", "deepseek", "deepseek-legacy"] | None,
                                LIVE] = Field(
        None, description="where a reply's <think> block goes: none = content, auto/deepseek "
                          "= reasoning_content, deepseek-legacy = both; default auto")
    reasoning_budget: Annotated[int | None, LIVE] = Field(
        None, ge=-1, description="thinking tokens before the block is closed; 0 = no thinking, "
                                 "-1 = unlimited (the default)")
    reasoning_effort: Annotated[Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None,
                                LIVE] = Field(
        None, description="the reasoning_effort of requests without one; none = no thinking")
    reasoning_field: Annotated[bool, LIVE] = Field(
        False, description="chat replies carry the reasoning as `reasoning` beside "
                           "`reasoning_content` (for clients that read that name)")

    @field_validator("n_ctx")
    @classmethod
    def _positive_context(cls, v: int) -> int:
        if v < 0:
            raise ValueError("must be at least 1 (or 0: the model's trained context)")
        return v

    @field_validator("type_k", "type_v", mode="before")
    @classmethod
    def _kv_type(cls, v: object) -> str:
        from engine.kv_types import kv_type

        if v is None:  # llama-cpp-python's config writes null for its default, f16
            return "f16"
        if not isinstance(v, (str, int)):
            raise ValueError(f"a KV cache type is a name or a ggml type number, got {v!r}")
        return kv_type(v).name  # ValueError names the supported types

    @property
    def prompt_cache_bytes(self) -> int:
        """RAM of the prompt-cache pool: prompt_cache, else llama-cpp-python's cache_size."""
        if self.prompt_cache is not None:
            return self.prompt_cache
        return self.cache_size if self.cache else 0

    @property
    def prompt_cache_disk_bytes(self) -> int:
        """Disk of the prompt cache: prompt_cache_disk, else cache_size for cache_type disk."""
        if self.prompt_cache_disk is not None:
            return self.prompt_cache_disk
        return self.cache_size if self.cache and self.cache_type == "disk" else 0

    @property
    def kv_cache_types(self) -> tuple[str, str]:
        """(type_k, type_v) by llama.cpp's names (the validator normalises numbers and null)."""
        return str(self.type_k), str(self.type_v)

    @model_validator(mode="after")
    def _kv_types_served(self) -> EntrySettings:
        quantized = [t != "f16" for t in (self.type_k, self.type_v)]
        if any(quantized) and not all(quantized):
            raise ValueError(f"type_k ({self.type_k}) and type_v ({self.type_v}) must both be "
                             "quantized or both f16")
        if any(quantized) and not self.flash_attn:
            raise ValueError("a quantized KV cache (type_k/type_v) requires flash_attn: true, "
                             "as llama.cpp's does")
        return self

    @field_validator("rope_scaling_type")
    @classmethod
    def _scaling_name(cls, v: str | int | None) -> str | int | None:
        # llama-cpp-python writes llama.cpp's enum (-1 unspecified, 0 none, 1 linear, 2 yarn)
        return ROPE_SCALING_BY_NUMBER.get(v) if isinstance(v, int) else v

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


class LoraAdapter(BaseModel):
    """One LoRA adapter of an entry (engine/lora.py): llama.cpp's --lora-scaled FILE SCALE."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: Annotated[Path, RELOAD] = Field(
        description="a GGUF LoRA adapter file, relative to the config's folder")
    scale: Annotated[float, RELOAD] = Field(
        1.0, allow_inf_nan=False, description="the user scale; the delta is scale * alpha / rank * B A")


class ModelEntry(EntrySettings):
    """One servable model: a GGUF file, the names it answers to, and how to run it."""

    model: Annotated[Path, RELOAD] = Field(  # absolute once loaded
        description="path of a GGUF file, relative to the config file's folder")
    aliases: Annotated[list[str], LIVE] = Field(
        min_length=1, description="the names clients use in \"model\"; unique across entries; "
                                  "a glob (\"claude-*\") answers every name it matches, an "
                                  "exact alias of any entry winning over it")
    mmproj: Annotated[Path | None, RELOAD] = Field(  # absolute once loaded
        None, description="a vision projector GGUF (llama.cpp's mmproj; llama-cpp-python's "
                          "clip_model_path) that lets this model take images")
    pooling: Annotated[Literal["mean", "cls", "last", "none", "rank"] | None, RELOAD] = Field(
        None, description="how an embedding model pools a text: mean, cls, last (token), none "
                          "(per-token vectors) or rank (a reranker's classifier); default: the "
                          "GGUF's <arch>.pooling_type, else mean. Setting it makes a decoder "
                          "an embedding (or, with rank, a rerank) model")
    lora: Annotated[tuple[LoraAdapter, ...], RELOAD] = Field(
        (), description="LoRA adapter GGUFs merged into the weights at load, "
                                          "each {path, scale} (llama-cpp-python's lora_path: one, "
                                          "scale 1)")
    # llama-cpp-python keys, not used yet
    extra: Annotated[dict[str, Any], INTERNAL] = Field(default_factory=dict)

    @field_validator("model", "mmproj")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        return v if v is None or v.is_absolute() else (Path.cwd() / v).resolve()

    @field_validator("aliases")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for alias in v:
            if not alias.strip():
                raise ValueError("an alias must not be empty")
        if len(set(v)) != len(v):
            raise ValueError(f"an alias is listed twice: {v}")
        return v

    def settings_key(self) -> tuple[tuple[str, Any], ...]:
        """What must stay equal for a loaded model to stay warm across a config reload: the
        RELOAD fields. The LIVE ones (aliases, pinning, idle timeout, sampling defaults) apply
        to a loaded model as they are."""
        return settings_key(self)

    @property
    def name(self) -> str:
        """The first alias: how logs and errors refer to the entry."""
        return self.aliases[0]


class ApiKey(BaseModel):
    """One client key of `auth.keys`. The key's value is a secret: never logged or shown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, LIVE] = Field(
        min_length=1, description="how logs and metrics name the key")
    key: Annotated[SecretStr, LIVE] = Field(  # from `key` (e.g. ${ENV}) or the file `key_file`
        description="the key clients send (often ${ENV}); or give key_file")
    models: Annotated[list[str] | None, LIVE] = Field(
        None, description="the aliases it may use; default: every model")
    max_concurrent: Annotated[int | None, LIVE] = Field(
        None, ge=1, description="its requests in flight at once")
    requests_per_minute: Annotated[int | None, LIVE] = Field(
        None, ge=1, description="its requests per minute")


class AuthSettings(BaseModel):
    """`auth:` API keys for the API and a separate admin key (gateway/http/auth.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: list[ApiKey] = Field(default_factory=list, description="the client keys of the API")
    admin_key: Annotated[SecretStr | None, LIVE] = Field(
        None, description="the key of /admin/* and the router API (/models/load, ...); "
                          "or give admin_key_file")
    public: Annotated[list[str], LIVE] = Field(
        default_factory=lambda: ["/health", "/metrics"], description="paths open without a key")
    # set by `serve` without a config on a non-loopback address (the container's models-dir
    # mode): no key can guard the admin routes there, so they answer 403 to everyone
    admin_closed: Annotated[bool, INTERNAL] = False

    @property
    def enabled(self) -> bool:
        return bool(self.keys) or self.admin_key is not None


class CorsSettings(BaseModel):
    """`cors:` which browser origins may call the API (none by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_origins: Annotated[list[str], LIVE] = Field(
        default_factory=list, description="browser origins that may call the API; [\"*\"]: any")


ApiName = Literal["anthropic"]  # the APIs that may name a default model of their own


class ServerSettings(BaseModel):
    """The top-level keys that are not sections."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: Annotated[str, RESTART] = Field(
        "127.0.0.1", description="the address to listen on; 0.0.0.0: every interface")
    port: Annotated[int, RESTART] = Field(
        8080, ge=0, le=65535, description="the port to listen on; 0: any free port")
    default_model: Annotated[str | None, LIVE] = Field(
        None, description="the alias a request without \"model\" gets; default: the first entry")
    default_models: Annotated[dict[ApiName, str], LIVE] = Field(
        default_factory=dict,
        description="per API, the alias its requests get when they name no model or one no "
                    "entry answers to (anthropic: whatever Claude Code asks for)")
    shutdown_timeout: Annotated[Duration, LIVE] = Field(
        60.0, ge=0, description="on SIGTERM/SIGINT, how long running requests may go on")
    ollama_address: Annotated[str | None, RESTART] = Field(
        None, description="a second address the same server answers on, for clients wired to "
                          "Ollama's port: \"127.0.0.1:11434\" (a port alone: on `host`); "
                          "off by default")

    @field_validator("ollama_address")
    @classmethod
    def _an_address(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen(value, "127.0.0.1")
        return value

    def ollama_bind(self) -> tuple[str, int] | None:
        """Where the second listener binds, if one is configured."""
        return None if self.ollama_address is None else parse_listen(self.ollama_address,
                                                                     self.host)


class Config(ServerSettings):
    """A complete, checked configuration."""

    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    cors: CorsSettings = Field(default_factory=CorsSettings)
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    models: list[ModelEntry] = Field(default_factory=list, description="the models to serve")
    # entries with `upstream:` (gateway/config/upstream.py); the loader takes them from `models`
    upstreams: Annotated[list[UpstreamEntry], INTERNAL] = Field(default_factory=list)
    # the file this came from; None = built in code
    source: Annotated[Path | None, INTERNAL] = None
    warnings: Annotated[list[str], INTERNAL] = Field(default_factory=list)  # accepted, unused keys

    _by_alias: dict[str, ModelEntry] = PrivateAttr(default_factory=dict)
    _globs: list[tuple[str, ModelEntry]] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        problems = Problems()
        if not self.models and not self.upstreams:
            problems.add(("models",), "at least one entry (a model file or an upstream)")
        entries: list[tuple[int, list[tuple[str, Loc]]]] = [
            (i, [(a, ("models", i, "aliases")) for a in e.aliases])
            for i, e in enumerate(self.models)]
        entries += [(len(self.models) + i, [(a, ("upstreams", i, "aliases")) for a in e.aliases])
                    for i, e in enumerate(self.upstreams)]
        check_across_entries(entries, self.default_model, problems)
        local = set(self._local_aliases())
        for api, alias in self.default_models.items():
            if alias not in local:
                problems.add(("default_models", api), f"no model file answers to {alias!r}; "
                                                      f"aliases: {', '.join(sorted(local))}")
        check_pool_members(set(self._local_aliases()), self.upstreams, problems)
        if problems.items:
            raise ValueError("; ".join(f"{dotted(loc)}: {msg}" for loc, msg in problems.items))
        return self

    def model_post_init(self, context: Any, /) -> None:
        self._by_alias = {a: e for e in self.models for a in e.aliases}
        self._globs = [(a, e) for e in self.models for a in e.aliases if is_glob(a)]

    def _match(self, alias: str) -> tuple[str, ModelEntry] | None:
        """The configured alias `alias` answers to and its entry: the alias itself, else the
        first glob alias (in file order) that matches it. An exact alias always wins."""
        entry = self._by_alias.get(alias)
        if entry is not None:
            return alias, entry
        return next(((g, e) for g, e in self._globs if fnmatch.fnmatchcase(alias, g)), None)

    def resolve(self, alias: str | None) -> ModelEntry:
        """The local entry serving `alias`; None means the default alias (default_alias())."""
        if alias is None:
            alias = self.default_alias()
        found = self._match(alias)
        if found is None:
            raise ModelNotFoundError(alias, self.aliases())
        return found[1]

    def configured_alias(self, alias: str) -> str:
        """The alias as the config names it: the glob a name matched (`claude-*` for
        `claude-sonnet-4-6`), so logs and metric labels stay a bounded set."""
        found = self._match(alias)
        return alias if found is None else found[0]

    def alias_for(self, api: ApiName, alias: str | None) -> str | None:
        """The alias a request of `api` naming `alias` is served by: `alias` itself, or the
        API's default model (default_models) when it names none or one nobody serves."""
        default = self.default_models.get(api)
        if default is None or (alias is not None and self.aliases_include(alias)):
            return alias
        return default

    def aliases_include(self, alias: str) -> bool:
        """Whether any entry (a model file, by glob too, or an upstream) answers to `alias`."""
        return self.is_local(alias) or any(alias in e.aliases for e in self.upstreams)

    def default_alias(self) -> str:
        """What a request naming no model gets: default_model, or else the first entry's."""
        if self.default_model is not None:
            return self.default_model
        return self.models[0].name if self.models else self.upstreams[0].name

    def is_local(self, alias: str, exact: bool = False) -> bool:
        """Whether a model file answers to `alias`; with `exact`, by that very alias (not by
        a glob, which an upstream's exact alias goes before)."""
        return alias in self._by_alias if exact else self._match(alias) is not None

    def aliases(self) -> list[str]:
        """Every configured alias: local entries first, then upstream entries."""
        return self._local_aliases() + [a for e in self.upstreams for a in e.aliases]

    def _local_aliases(self) -> list[str]:
        return [a for e in self.models for a in e.aliases]


def default_config() -> Config:
    """Used without a config file: serve the default model (downloaded once) as `smollm2`."""
    from engine.default_model import DEFAULT_ALIAS, default_model_path

    entry = ModelEntry(model=default_model_path(), aliases=[DEFAULT_ALIAS])
    return Config(default_model=DEFAULT_ALIAS, models=[entry])


def check_across_entries(entries: list[tuple[int, list[tuple[str, Loc]]]],
                         default_model: str | None, problems: Problems) -> None:
    """Aliases unique across all entries (each given as its index and where each alias came
    from); default_model exists. Several entries may share one model file (with different
    settings: llama-cpp-python's docs serve gpt-3.5-turbo and gpt-4 from one file with
    different n_ctx); the registry keys its models by entry."""
    owner: dict[str, int] = {}
    for i, alias_locs in entries:
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


# The keys a file may hold. `defaults` is merged under each entry, so it is no field of Config.
SCHEMA_KEY = "$schema"  # a JSON file may name its JSON Schema for editors; ignored
TOP_KEYS = (*(k for k in file_keys(Config) if k != "models"), "defaults", "models")
PER_MODEL_ONLY = (*(k for k in file_keys(ModelEntry) if k not in EntrySettings.model_fields),
                  MODEL_ALIAS, CLIP_MODEL_PATH, LORA_PATH)
ENTRY_KEYS = (*PER_MODEL_ONLY, *file_keys(EntrySettings))

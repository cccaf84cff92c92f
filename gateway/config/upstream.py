"""The config schema of upstream entries: aliases served by other OpenAI-compatible servers.

An entry of `models:` has either `model:` (a local GGUF, gateway/config/schema.py) or
`upstream:`, one server or a list of them (a pool), which may also name local entries:

    - aliases: [chat]
      balance: least_busy              # or round_robin
      upstream:
        - url: http://gpu-1:8000/v1    # the base URL an OpenAI client would use
          api_key_file: /run/secrets/gpu   # or api_key: ${GPU_KEY}
          model: meta-llama/Llama-3.1-8B-Instruct   # the name sent upstream (default: the alias)
          headers: {X-Team: search}
          timeout: 120s                # for the first byte, and between bytes
          max_concurrent: 16
        - local: smollm2               # a local entry's alias: one more member of the pool
      probe: {interval: 5s}            # GET {url}/models (or `path`) every 5 s

    - upstream: {url: http://modelyard-2:8080, discover: true}   # its aliases, listed here

Every field is LIVE (gateway/config/reload.py): a reload applies it at once; a server whose
settings changed is a new backend, and requests running on the old one finish there. The loader
(gateway/config/loader.py) reads these entries from `models:` with `prepare_upstream` below.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    field_validator,
    model_validator,
)

from gateway.config.aliases import is_glob
from gateway.config.problems import Loc, Problems
from gateway.config.reload import LIVE
from gateway.units import parse_duration

Duration = Annotated[float, BeforeValidator(parse_duration)]  # seconds

Balance = Literal["least_busy", "round_robin"]


class ProbeSettings(BaseModel):
    """The active health check of a pool's upstream servers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval: Annotated[Duration, LIVE] = Field(5.0, ge=0)  # 0 = none: `cooldown` brings back
    path: Annotated[str | None, LIVE] = None   # None = {url}/models; else a server path (/health)
    timeout: Annotated[Duration, LIVE] = Field(2.0, gt=0)
    cooldown: Annotated[Duration, LIVE] = Field(10.0, ge=0)  # without a probe: time out after errors

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"must start with '/', got {v!r}")
        return v


class UpstreamServer(BaseModel):
    """One OpenAI-compatible server. `api_key` is a secret: never logged, shown or echoed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, LIVE]
    api_key: Annotated[SecretStr | None, LIVE] = None
    model: Annotated[str | None, LIVE] = None  # the name sent upstream; None = the alias asked
    headers: Annotated[dict[str, str], LIVE] = Field(default_factory=dict)
    timeout: Annotated[Duration, LIVE] = Field(600.0, gt=0)  # for the first byte, and between bytes
    connect_timeout: Annotated[Duration, LIVE] = Field(5.0, gt=0)
    max_concurrent: Annotated[int | None, LIVE] = Field(None, ge=1)  # requests in flight at once
    discover: Annotated[bool, LIVE] = False    # list the aliases it serves (a modelyard upstream)
    name: Annotated[str | None, LIVE] = None   # how errors, /admin and /metrics name it

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http:// or https:// URL, got {v!r}")
        if parts.username or parts.password:
            raise ValueError("must not hold credentials; give api_key (or api_key_file)")
        path = parts.path.rstrip("/") or "/v1"  # a bare server: its OpenAI API is under /v1
        return f"{parts.scheme}://{parts.netloc}{path}"

    @field_validator("headers")
    @classmethod
    def _own_headers(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if key.lower() in ("host", "content-length", "transfer-encoding"):
                raise ValueError(f"header {key!r} is set by the HTTP client")
        return v

    @property
    def label(self) -> str:
        """The configured name, else host:port and path: safe to show (no key, no query)."""
        if self.name:
            return self.name
        parts = urlsplit(self.url)
        return f"{parts.netloc}{parts.path}"

    @property
    def server_root(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    def identity(self) -> tuple[object, ...]:
        """What must stay equal for a reload to keep this server's health and connections."""
        key = None if self.api_key is None else self.api_key.get_secret_value()
        return (self.url, key, self.model, tuple(sorted(self.headers.items())), self.timeout,
                self.connect_timeout, self.max_concurrent, self.discover, self.label)


class LocalMember(BaseModel):
    """A local entry (by one of its aliases) as a member of a pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    local: Annotated[str, LIVE] = Field(min_length=1)


def _member_kind(v: object) -> str:
    if isinstance(v, dict):
        return "local" if "local" in v else "server"
    return "local" if isinstance(v, LocalMember) else "server"


# a tagged union, so a mistake in a server is reported against the server's keys only
MEMBER_TAGS = ("server", "local")  # in pydantic's error locations; the loader drops them
Member = Annotated[Annotated[UpstreamServer, Tag("server")] | Annotated[LocalMember, Tag("local")],
                   Discriminator(_member_kind)]


class UpstreamEntry(BaseModel):
    """Aliases served by a pool of upstream servers (and local entries)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    aliases: Annotated[list[str], LIVE] = Field(default_factory=list)  # empty: what discover finds
    upstream: list[Member] = Field(min_length=1)  # sections: their fields carry the marks
    balance: Annotated[Balance, LIVE] = "least_busy"
    probe: ProbeSettings = Field(default_factory=ProbeSettings)

    @field_validator("upstream", mode="before")
    @classmethod
    def _one_or_many(cls, v: object) -> object:
        return [v] if isinstance(v, dict) else v

    @field_validator("aliases")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        if any(not a.strip() for a in v):
            raise ValueError("an alias must not be empty")
        if len(set(v)) != len(v):
            raise ValueError(f"an alias is listed twice: {v}")
        if any(is_glob(a) for a in v):
            raise ValueError("only model files answer to glob aliases")
        return v

    @model_validator(mode="after")
    def _complete(self) -> UpstreamEntry:
        if not self.aliases and not any(isinstance(m, UpstreamServer) and m.discover
                                        for m in self.upstream):
            raise ValueError("needs aliases (or a server with `discover: true`)")
        labels = [m.label for m in self.servers()]
        if len(set(labels)) != len(labels):
            raise ValueError(f"two servers share a name ({', '.join(labels)}); give each a "
                             "`name`")
        return self

    def servers(self) -> list[UpstreamServer]:
        return [m for m in self.upstream if isinstance(m, UpstreamServer)]

    def locals(self) -> list[str]:
        return [m.local for m in self.upstream if isinstance(m, LocalMember)]

    @property
    def name(self) -> str:
        """The first alias, or the first server's name: how logs and rows refer to the entry."""
        return self.aliases[0] if self.aliases else self.servers()[0].label


# ---------------------------------------------------------------------------------------------
# Reading entries from the file

SecretReader = Callable[[dict[str, Any], str, Loc], None]  # key_file -> key, in place


def prepare_upstream(raw: dict[str, Any], loc: Loc, problems: Problems,
                     read_secret: SecretReader) -> tuple[dict[str, Any], list[tuple[str, Loc]]]:
    """One `models` item with `upstream:`: UpstreamEntry fields with each server's
    api_key_file read, and where each alias came from (for the checks across entries)."""
    fields = {k: v for k, v in raw.items() if k not in ("aliases", "model_alias", "model")}
    if "model" in raw:
        problems.add(loc + ("model",), "give `model` (a local GGUF) or `upstream`, not both; "
                                       "the name sent upstream goes under upstream.model")
    servers = raw["upstream"]
    if isinstance(servers, (dict, list)):
        many = isinstance(servers, list)
        items = [dict(s) if isinstance(s, dict) else s for s in (servers if many else [servers])]
        for j, item in enumerate(items):
            if isinstance(item, dict):
                read_secret(item, "api_key", loc + ("upstream",) + ((j,) if many else ()))
        fields["upstream"] = items
    alias_locs: list[tuple[str, Loc]] = []
    if isinstance(raw.get("model_alias"), str):
        alias_locs.append((raw["model_alias"], loc + ("model_alias",)))
    names = raw.get("aliases", [])
    for j, name in enumerate([names] if isinstance(names, str) else
                             names if isinstance(names, list) else []):
        if isinstance(name, str) and is_glob(name):
            problems.add(loc + ("aliases", j), f"{name!r} is a glob: only model files answer to "
                                               "globs; an upstream's aliases are sent as named")
        elif isinstance(name, str) and name.strip():
            alias_locs.append((name, loc + ("aliases", j)))
        else:
            problems.add(loc + ("aliases", j), f"an alias must be a non-empty string, got {name!r}")
    fields["aliases"] = list(dict.fromkeys(a for a, _ in alias_locs))
    return fields, alias_locs


def check_pool_members(local_aliases: set[str], entries: list[UpstreamEntry],
                       problems: Problems) -> None:
    """A pool's `local:` members name local entries (not upstream ones: one hop only)."""
    for i, entry in enumerate(entries):
        for name in entry.locals():
            if name not in local_aliases:
                problems.add(("upstreams", i, "upstream"),
                             f"local: {name!r} is not the alias of a local model entry")

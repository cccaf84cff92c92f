"""The config file: one pydantic schema, read from YAML, TOML or JSON; every check lives here.

`load_config(path)` either returns a complete, valid `Config` or raises `ConfigError` listing every
problem in the file at once, as `file:line: key.path: message` (the line when the format gives
it: YAML always, TOML and JSON for syntax errors). Nothing past this package sees a raw dict.

Configs written for llama-cpp-python's `--config_file` load unchanged: its server and model keys
that modelyard does not use yet are accepted with a warning (kept in `Config.warnings`, and in
`ModelEntry.extra`), and an entry without aliases answers to its `model` string, as there.

One concern a module:
    schema.py       the pydantic models: what a checked config holds; the file's key lists
    reload.py       when a change to each field applies (live, reload the model, restart)
    loader.py       load_config: parse -> expand ${VAR} -> prepare -> validate, every problem
    formats.py      YAML / TOML / JSON by suffix, with the line of every key (scan uses it too)
    env.py          ${VAR} and ${VAR:-default}
    llama_cpp.py    the keys of llama-cpp-python's --config_file
    problems.py     collecting problems and saying them as file:line: key.path: message
"""
from __future__ import annotations

from gateway.config.loader import load_config
from gateway.config.problems import ConfigError
from gateway.config.reload import restart_needed
from gateway.config.schema import (
           ApiKey,
           AuthSettings,
           Config,
           CorsSettings,
           LimitSettings,
           ModelEntry,
           ModelNotFoundError,
           RegistrySettings,
           ResponsesSettings,
           default_config,
)

__all__ = ["ApiKey", "AuthSettings", "Config", "ConfigError", "CorsSettings", "LimitSettings",
           "ModelEntry", "ModelNotFoundError", "RegistrySettings", "ResponsesSettings", "default_config",
           "load_config", "restart_needed"]

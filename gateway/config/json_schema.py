"""The JSON Schema of the config file, made from the schema's models, for editors to check with.

A file is not the checked `Config` itself, so pydantic's schema of the models is widened by what
the loader accepts around them:
  - durations and sizes as text (`10m`, `4GiB`), and any number or flag as a `${VAR}` reference
  - `defaults` (any entry key but the per-model ones) and the keys read from files
    (`auth.admin_key_file`, `auth.keys[].key_file`)
  - llama-cpp-python's `--config_file` keys: `model_alias`, `api_key`, an entry without aliases,
    and the keys modelyard accepts without using them yet (marked `deprecated`, so editors
    show them struck through, as the loader warns about them)
  - `$schema`, naming this schema (for JSON files, which have no comments to name it in)
and narrowed by what the file never holds (INTERNAL fields). Each key's description says what
changing it costs where that is more than nothing (reload.py's marks). `modelyard
config-schema` writes it; examples/config.schema.json is a copy that a test keeps current.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from gateway.config import llama_cpp
from gateway.config.env import ENV_NAME
from gateway.config.reload import RELOAD, RESTART, Applies, applies, is_internal, sections_in
from gateway.config.schema import PER_MODEL_ONLY, SCHEMA_KEY, Config
from gateway.units import DURATION_UNITS, NUMBER, SIZE_UNITS, parse_duration, parse_size

# Draft 7: what the YAML language server and most editors read. pydantic's `$defs` and the
# `deprecated` annotation (2019-09) are understood by them too.
DIALECT = "http://json-schema.org/draft-07/schema#"
# A string holding a ${VAR} reference: its value is only known when the file is loaded.
ENV_REFERENCE = rf"\$\{{{ENV_NAME.pattern}(\}}|:-)"


def _amount(units: Iterable[str]) -> str:
    """A pattern for `number unit` as gateway/units reads it (a unit in any case)."""
    def any_case(unit: str) -> str:
        return "".join(f"[{c.lower()}{c.upper()}]" for c in unit)
    names = "|".join(any_case(u) for u in sorted(units, key=len, reverse=True))
    return rf"^\s*({NUMBER})\s*({names})?\s*$"


# The values the file may also give as text: `10m`, `4GiB` (see gateway/units.py).
_AS_TEXT: dict[object, str] = {parse_duration: _amount(DURATION_UNITS),
                               parse_size: _amount(SIZE_UNITS)}


class _FileSchema(GenerateJsonSchema):
    """pydantic's generator, with the values a file may write in place of a number or a flag."""

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        return _or_env(super().int_schema(schema))

    def float_schema(self, schema: core_schema.FloatSchema) -> JsonSchemaValue:
        return _or_env(super().float_schema(schema))

    def bool_schema(self, schema: core_schema.BoolSchema) -> JsonSchemaValue:
        return _or_env(super().bool_schema(schema))

    def function_before_schema(
            self, schema: core_schema.BeforeValidatorFunctionSchema) -> JsonSchemaValue:
        inner = super().function_before_schema(schema)
        pattern = _AS_TEXT.get(schema["function"]["function"])
        if pattern is None:
            return inner
        branches = inner["anyOf"] if list(inner) == ["anyOf"] else [inner]
        return {"anyOf": [*branches, {"type": "string", "pattern": pattern}]}


def _deprecated(note: str) -> dict[str, Any]:
    """Accepted, any value, and struck through: `deprecationMessage` is what VS Code shows."""
    return {"deprecated": True, "deprecationMessage": note, "description": note}


def _or_env(schema: JsonSchemaValue) -> JsonSchemaValue:
    return {"anyOf": [schema, {"type": "string", "pattern": ENV_REFERENCE}]}


def config_schema() -> dict[str, Any]:
    """The JSON Schema (draft 7) a config file validates against."""
    schema = Config.model_json_schema(schema_generator=_FileSchema)
    defs: dict[str, Any] = schema["$defs"]
    _adapt(Config, schema, defs)
    _drop_titles(schema)

    unused = _deprecated(llama_cpp.UNUSED)
    entry = defs["ModelEntry"]
    entry["properties"][llama_cpp.MODEL_ALIAS] = {
        "type": ["string", "null"],
        "description": "llama-cpp-python's one alias: the first of `aliases`"}
    entry["properties"][llama_cpp.CLIP_MODEL_PATH] = {
        **entry["properties"]["mmproj"], "description": "llama-cpp-python's name for `mmproj`"}
    entry["properties"][llama_cpp.LORA_PATH] = {
        "type": ["string", "null"],
        "description": "llama-cpp-python's one LoRA adapter: `lora: [{path: ..., scale: 1}]`"}
    aliases = entry["properties"]["aliases"]
    about = aliases.pop("description")
    entry["properties"]["aliases"] = {"anyOf": [aliases, {"type": "string"}],
                                      "description": f"{about}: a list, or one name; without "
                                                     "any, the `model` string as written"}
    entry["required"] = ["model"]
    entry["properties"].update(dict.fromkeys(sorted(llama_cpp.LLAMA_CPP_MODEL_KEYS), unused))
    entry["properties"][llama_cpp.DRAFT_MODEL] = {
        "type": ["string", "null"], "description": "llama-cpp-python's speculative decoding: any "
        "value is its prompt lookup, `draft: {lookup: ngram, ngram_max: 2}`"}
    entry["properties"][llama_cpp.DRAFT_MODEL_N] = {
        "type": "integer", "minimum": 1, "maximum": 64,
        "description": "llama-cpp-python's drafted tokens per step: `draft.n_draft` (default 10)"}
    defaults = copy.deepcopy(entry)
    defaults["properties"] = {k: v for k, v in entry["properties"].items()
                              if k not in PER_MODEL_ONLY}
    defaults.pop("required")
    defaults["description"] = "model keys merged into every entry of `models`"
    defs["Defaults"] = defaults

    props = schema["properties"]
    _upstream_entries(schema, defs)
    props["defaults"] = {"$ref": "#/$defs/Defaults"}
    props[SCHEMA_KEY] = {"type": "string",
                         "description": "this schema, for editors (modelyard ignores the key)"}
    props[llama_cpp.API_KEY] = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "null"}],
                      "description": "llama-cpp-python's one API key: a client key named "
                                     "api_key that also guards the admin endpoints"}
    props.update({key: _deprecated(llama_cpp.server_key_note(key))
                  for key in sorted(llama_cpp.LLAMA_CPP_SERVER_KEYS)})

    for where, key in ((defs["AuthSettings"], "admin_key"), (defs["ApiKey"], "key")):
        where["properties"][f"{key}_file"] = {
            "type": "string", "description": f"a file whose first line is the {key}"}
        where["not"] = {"required": [key, f"{key}_file"]}  # one or the other
    api_key = defs["ApiKey"]
    api_key["required"] = ["name"]
    api_key["anyOf"] = [{"required": ["key"]}, {"required": ["key_file"]}]

    about = ("A modelyard config file (docs/configuration/index.md); "
             "llama-cpp-python's --config_file form validates too.")
    rest = {k: v for k, v in schema.items() if k not in ("title", "description", "$defs")}
    return {"$schema": DIALECT, "title": "modelyard config", "description": about, **rest,
            "$defs": defs}


def _upstream_entries(schema: dict[str, Any], defs: dict[str, Any]) -> None:
    """An item of `models` is a model entry or an upstream entry (gateway/config/upstream.py:
    `upstream:` one server or a list, aliases as for models, api_key from a file too)."""
    models = schema["properties"]["models"]
    models["items"] = {"anyOf": [{"$ref": "#/$defs/ModelEntry"},
                                 {"$ref": "#/$defs/UpstreamEntry"}]}
    models["minItems"] = 1
    schema["required"] = [*schema.get("required", []), "models"]
    entry = defs["UpstreamEntry"]["properties"]
    entry[llama_cpp.MODEL_ALIAS] = {"type": "string", "description": "one alias: the first of `aliases`"}
    entry["aliases"] = {"anyOf": [entry["aliases"], {"type": "string"}]}
    entry["upstream"] = {"anyOf": [entry["upstream"], {"$ref": "#/$defs/UpstreamServer"}],
                         "description": "one server, or a list of servers and local entries"}
    server = defs["UpstreamServer"]
    server["properties"]["api_key_file"] = {
        "type": "string", "description": "a file whose first line is the api_key"}
    server["not"] = {"required": ["api_key", "api_key_file"]}


def schema_text() -> str:
    """config_schema() as `modelyard config-schema` writes it (and examples/ holds it)."""
    return json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"


_ON_RELOAD: dict[Applies | None, str] = {
    RELOAD: "Changing it reloads the model (running requests finish first).",
    RESTART: "Changing it takes a restart."}


def _adapt(cls: type[BaseModel], schema: dict[str, Any], defs: dict[str, Any]) -> None:
    """For `cls` and every section below it: drop the INTERNAL fields, and say in the
    description of the others what a change to them costs, if more than nothing."""
    props = schema["properties"]
    for name, info in cls.model_fields.items():
        if is_internal(info):
            props.pop(name, None)
            if name in schema.get("required", ()):
                schema["required"].remove(name)
            continue
        note = _ON_RELOAD.get(applies(info))
        if note is not None:
            described = props[name].get("description")
            props[name]["description"] = f"{described}. {note}" if described else note
        for section in sections_in(info.annotation):
            _adapt(section, defs[section.__name__], defs)


def _drop_titles(schema: Any) -> None:
    """pydantic titles every property from its name ("N Ctx"): noise in an editor's hover."""
    if isinstance(schema, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            for value in props.values():
                if isinstance(value, dict):
                    value.pop("title", None)
        for value in schema.values():
            _drop_titles(value)
    elif isinstance(schema, list):
        for value in schema:
            _drop_titles(value)

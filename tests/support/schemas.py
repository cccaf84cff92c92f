"""JSON Schemas for structured-output tests and benchmarks: nesting, arrays, enums, numbers,
anyOf, patterns and formats, each bounded so a constrained reply stays short."""
from __future__ import annotations

from typing import Any

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"person": {"type": "object", "properties": {
        "first": {"type": "string", "maxLength": 20}, "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": False}},
        "required": ["first", "address"], "additionalProperties": False}},
     "required": ["person"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                               "minItems": 2, "maxItems": 4}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "size": {"enum": [1, 2, 3]}},
     "required": ["color", "size"], "additionalProperties": False},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0.5, "maximum": 99.5},
                                      "qty": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9}},
     "required": ["price", "qty"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
                                      "subtitle": {"type": "string", "maxLength": 30},
                                      "pages": {"type": "integer", "minimum": 1, "maximum": 999}},
     "required": ["title"], "additionalProperties": False},
    {"type": "object", "properties": {"result": {"anyOf": [
        {"type": "object", "properties": {"ok": {"const": True}, "value": {"type": "integer"}},
         "required": ["ok", "value"], "additionalProperties": False},
        {"type": "object",
         "properties": {"ok": {"const": False}, "error": {"type": "string", "maxLength": 30}},
         "required": ["ok", "error"], "additionalProperties": False}]}},
     "required": ["result"], "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                                      "email": {"type": "string", "format": "email", "maxLength": 40}},
     "required": ["code", "email"], "additionalProperties": False},
    {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                      "id": {"type": "string", "format": "uuid"}},
     "required": ["day", "id"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9},
        "minItems": 2, "maxItems": 2}},
        "flag": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 20}},
     "required": ["matrix", "flag", "note"], "additionalProperties": False},
]

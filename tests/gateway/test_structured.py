"""Request fields -> grammar: schema checks and the closing of open objects (no model needed)."""
from __future__ import annotations

import pytest

from gateway.errors import APIError
from gateway.generation.structured import _check_schema, closed


def test_objects_that_list_properties_are_closed_everywhere_unless_they_say_otherwise():
    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "b": {"type": "array", "items": {"type": "object", "properties": {}}},
        "c": {"anyOf": [{"type": "object", "properties": {"y": {}}}, {"type": "null"}]},
        "d": {"type": "object", "properties": {}, "additionalProperties": True},
        "e": {"type": "object"}}}
    out = closed(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["b"]["items"]["additionalProperties"] is False
    assert out["properties"]["c"]["anyOf"][0]["additionalProperties"] is False
    assert out["properties"]["d"]["additionalProperties"] is True   # said so: kept
    assert "additionalProperties" not in out["properties"]["e"]     # no list: any object
    assert "additionalProperties" not in schema                     # the request is untouched


@pytest.mark.parametrize("schema,where", [
    ({"properties": {"a": {"items": {"type": "string", "pattern": "(?<=x)"}}}},
     "/properties/a/items/pattern"),
    ({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"q": {"$ref": "#/nope"}}}]},
     "/anyOf/1/properties/q/$ref"),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}},
     "/properties/n/minimum"),
])
def test_a_schema_error_names_where_it_is(schema, where):
    with pytest.raises(APIError) as info:
        _check_schema(schema, "json_schema")
    assert info.value.status == 400
    assert where in info.value.message and info.value.param == "json_schema"


def test_a_valid_schema_passes():
    _check_schema({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}},
                  "json_schema")


def test_an_integer_without_bounds_ends_within_the_safe_range():
    from engine.constraint import TokenizerAdapter, json_schema_grammar
    from gateway.generation.structured import SAFE_INTEGER
    from tests.support.fake_vocab import ByteVocabulary

    schema = {"type": "object", "properties": {"n": {"type": "integer"},
                                              "m": {"type": ["integer", "null"], "minimum": 0}},
              "required": ["n", "m"]}
    out = closed(schema)
    assert (out["properties"]["n"]["minimum"], out["properties"]["n"]["maximum"]) == \
        (-SAFE_INTEGER, SAFE_INTEGER)
    assert out["properties"]["m"]["minimum"] == 0 and out["properties"]["m"]["maximum"] == SAFE_INTEGER
    assert "maximum" not in schema["properties"]["n"]  # the request is untouched

    vocab = ByteVocabulary([])
    adapter = TokenizerAdapter(vocab)

    def accepts(text: str) -> bool:
        c = adapter.compile(json_schema_grammar(out))
        return all(c.consume(b) for b in text.encode()) and bool(c.allowed()[vocab.eos_id])

    assert accepts(f'{{"n": {SAFE_INTEGER}, "m": null}}')
    assert accepts(f'{{"n": {-SAFE_INTEGER}, "m": 7}}')
    assert not accepts(f'{{"n": {SAFE_INTEGER + 1}, "m": 7}}')
    c = adapter.compile(json_schema_grammar(out))
    assert all(c.consume(b) for b in b'{"n": 1111111111111111')  # 16 digits: past 2**53
    assert not any(c.consume(b) for b in b"1")                  # no 17th digit

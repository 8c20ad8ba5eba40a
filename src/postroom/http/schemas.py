"""The JSON Schemas the routes declare, and the one check that holds requests to them.

Each route of the table (``postroom.http.app``) declares its body and query schemas; the
OpenAPI document publishes them and ``check`` refuses a request that breaks one before its
handler runs, naming the field (``InvalidInput``). Only the keywords used here are
understood (``type``, ``properties``, ``required``, ``additionalProperties`` (``false``, or
the schema of every other property), ``maxProperties``, ``items``, ``maxItems``,
``minItems``, ``enum``, ``minimum``, ``maximum``, ``minLength``, ``maxLength``);
the store still checks every limit of its own (UTF-8 bytes, depth, sizes) on what it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from postroom import InvalidInput

__all__ = ["Schema", "array", "boolean", "check", "integer", "mapping", "nullable", "number",
           "obj", "text"]

Schema = dict[str, Any]

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float), "null": (type(None),),
}


def text(max_length: int = 128, **more: Any) -> Schema:
    """A non-empty string."""
    return {"type": "string", "minLength": 1, "maxLength": max_length, **more}


def integer(low: int, high: int, **more: Any) -> Schema:
    """An integer in ``low..high``."""
    return {"type": "integer", "minimum": low, "maximum": high, **more}


def number(**more: Any) -> Schema:
    """A finite number."""
    return {"type": "number", **more}


def boolean(**more: Any) -> Schema:
    """``true`` or ``false``."""
    return {"type": "boolean", **more}


def array(items: Schema, *, max_items: int, min_items: int = 0, **more: Any) -> Schema:
    """A list of ``items``."""
    return {"type": "array", "items": items, "minItems": min_items, "maxItems": max_items,
            **more}


def obj(properties: Mapping[str, Schema], *, required: tuple[str, ...] = (),
        closed: bool = True, **more: Any) -> Schema:
    """An object with ``properties`` (``closed``: no others)."""
    schema: Schema = {"type": "object", "properties": dict(properties)}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return {**schema, **more}


def mapping(values: Schema, *, max_properties: int) -> Schema:
    """An object of at most ``max_properties`` names of the caller's choosing (queue names,
    say), each holding a ``values``."""
    return {"type": "object", "additionalProperties": values, "maxProperties": max_properties}


def nullable(schema: Schema) -> Schema:
    """``schema`` or ``null``."""
    return {**schema, "type": [schema["type"], "null"]}


def _is(value: object, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[kind])


def check(value: object, schema: Schema, field: str) -> None:
    """Refuse ``value`` if it breaks ``schema``: ``InvalidInput`` naming ``field`` (dotted,
    ``items[3].queue``)."""
    kinds = schema.get("type")
    if kinds is not None:
        allowed = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, kind) for kind in allowed):
            raise InvalidInput(field, f"must be {' or '.join(allowed)}, got "
                                      f"{type(value).__name__}")
    if "enum" in schema and value not in schema["enum"]:
        raise InvalidInput(field, f"must be one of {', '.join(map(str, schema['enum']))}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise InvalidInput(field, "must not be empty")
        if len(value) > schema.get("maxLength", len(value)):
            raise InvalidInput(field, f"must have at most {schema['maxLength']} characters")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise InvalidInput(field, f"must be at least {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise InvalidInput(field, f"must be at most {schema['maximum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            raise InvalidInput(field, f"must have at least {schema['minItems']} items")
        if len(value) > schema.get("maxItems", len(value)):
            raise InvalidInput(field, f"must have at most {schema['maxItems']} items")
        if "items" in schema:
            for index, item in enumerate(value):
                check(item, schema["items"], f"{field}[{index}]")
    if isinstance(value, dict):
        if len(value) > schema.get("maxProperties", len(value)):
            raise InvalidInput(field, f"must have at most {schema['maxProperties']} names")
        properties: Mapping[str, Schema] = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                raise InvalidInput(f"{field}.{name}" if field else name, "is required")
        others = schema.get("additionalProperties", True)
        for name, item in value.items():
            inner = f"{field}.{name}" if field else str(name)
            if name in properties:
                check(item, properties[name], inner)
            elif others is False:
                raise InvalidInput(inner, "is not a field of this request")
            elif isinstance(others, dict):
                check(item, others, inner)

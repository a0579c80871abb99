"""Frozen dataclasses to JSON and back, for the agent protocol and the state file (stdlib only).

Decoding rebuilds nested dataclasses from their type hints and ignores fields the
class does not declare: a newer launcher (or agent) may add fields, and an older
one must still read what it knows. A field the class needs but the data lacks
raises DecodeError.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from typing import Any, TypeVar, overload

T = TypeVar("T")


class DecodeError(ValueError):
    """The data does not fit the type (a field missing, a wrong kind of value)."""


def to_data(value: Any) -> Any:
    """Dataclasses (nested, in lists, tuples and dicts) as plain JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_data(item) for item in value]
    if isinstance(value, dict):
        return {str(key): to_data(item) for key, item in value.items()}
    return value


def encode(value: Any) -> str:
    return json.dumps(to_data(value), separators=(",", ":"))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@overload
def from_data(kind: type[T], data: Any) -> T: ...
@overload
def from_data(kind: Any, data: Any) -> Any: ...


def from_data(kind: Any, data: Any) -> Any:
    """`data` (parsed JSON) as a value of `kind`: a dataclass, a container of them, or a plain type."""
    origin = typing.get_origin(kind)
    if kind is Any or kind is None or kind is type(None):
        return data
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if data is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return from_data(option, data)
            except DecodeError:
                continue
        raise DecodeError(f"{data!r} fits none of {kind}")
    if origin in (list, tuple):
        if not isinstance(data, list):
            raise DecodeError(f"expected a list, got {type(data).__name__}")
        args = typing.get_args(kind)
        item = args[0] if args else Any
        items = [from_data(item, entry) for entry in data]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(data, dict):
            raise DecodeError(f"expected an object, got {type(data).__name__}")
        value_kind = (typing.get_args(kind) or (str, Any))[1]
        return {key: from_data(value_kind, entry) for key, entry in data.items()}
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        if not isinstance(data, dict):
            raise DecodeError(f"{kind.__name__}: expected an object, got {type(data).__name__}")
        hints = _hints(kind)
        values = {}
        for field in dataclasses.fields(kind):
            if field.name in data:
                values[field.name] = from_data(hints[field.name], data[field.name])
            elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise DecodeError(f"{kind.__name__}: field {field.name!r} is missing")
        return kind(**values)
    if kind is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if isinstance(kind, type) and not isinstance(data, kind):
        raise DecodeError(f"expected {kind.__name__}, got {type(data).__name__}")
    return data


def decode(kind: type[T], text: str) -> T:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc}") from None
    return from_data(kind, data)

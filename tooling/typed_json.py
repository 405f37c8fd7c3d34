"""JSON read into frozen dataclasses by their annotations: each field a key of the same name, its
type checked (``bool``, ``int``, ``float``, ``str``, ``X | None``, ``Mapping[str, X]``,
``tuple[X, ...]``, a nested dataclass, a union of dataclasses told apart by a tag key), and the first
key missing or of the wrong kind named by its path.

Values are kept as the JSON has them: an ``int`` where a ``float`` is declared stays an ``int``.
Keys the dataclasses do not declare are ignored; a field with a default may be absent, and an empty
object where ``None`` is allowed counts as absent.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


class ShapeError(ValueError):
    """JSON that does not hold what its dataclass declares: the key's path and what was expected."""


def read(cls: type[T], value: object, where: str = "") -> T:
    """``value`` as the dataclass ``cls`` (``where``: the path of ``value``, for messages)."""
    if not isinstance(value, Mapping):
        raise ShapeError(f"{where or 'the document'}: expected an object, found {value!r}")
    hints = get_type_hints(cls)
    given: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # every cls read here is a dataclass
        at = f"{where}.{f.name}" if where else f.name
        if f.name in value:
            given[f.name] = _value(hints[f.name], value[f.name], at)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ShapeError(f"{at}: missing")
    return cls(**given)


def _union(options: tuple[object, ...], value: object, where: str) -> object:
    """One of ``options``: None, the dataclass whose ``TAG`` key the object holds, or the one other type."""
    rest = [o for o in options if o is not types.NoneType]
    if types.NoneType in options and (value is None or (value == {} and dataclasses.is_dataclass(rest[0]))):
        return None
    tags = {o: tag for o in rest if isinstance(tag := getattr(o, "TAG", None), str)}
    for option, tag in tags.items():
        if isinstance(option, type) and isinstance(value, Mapping) and tag in value:
            return read(option, value, where)
    (only,) = [o for o in rest if o not in tags]
    return _value(only, value, where)


#: the plain types a field may have, and the Python types that stand for each in the JSON
_PLAIN: Mapping[object, tuple[type, ...]] = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


def _value(kind: object, value: object, where: str) -> object:
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        return _union(get_args(kind), value, where)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return read(kind, value, where)
    if origin is Mapping:
        if not isinstance(value, Mapping):
            raise ShapeError(f"{where}: expected an object, found {value!r}")
        inner = get_args(kind)[1]
        return {str(k): _value(inner, v, f"{where}.{k}") for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, list):
            raise ShapeError(f"{where}: expected a list, found {value!r}")
        return tuple(_value(get_args(kind)[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    allowed = _PLAIN[kind]
    if not isinstance(value, allowed) or (kind is not bool and isinstance(value, bool)):
        raise ShapeError(f"{where}: expected {getattr(kind, '__name__', kind)}, found {value!r}")
    return value

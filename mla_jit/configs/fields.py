"""Checks shared by the config dataclasses: a config built from a `--config` spec or by hand is
validated when constructed, with one line naming the field and the values it accepts."""
from __future__ import annotations

from ..errors import InvalidArgumentError


def _describe(values) -> str:
    if isinstance(values, range) and values.step == 1:
        return f"an integer in {values.start}..{values.stop - 1}"
    return "one of " + ", ".join(map(str, values))


def check_fields(cfg, **allowed) -> None:
    """Raise InvalidArgumentError (a ValueError) for the first field whose value is not allowed.
    `allowed` maps a field to a tuple of values (all of one type) or to a range of ints."""
    for name, values in allowed.items():
        value = getattr(cfg, name)
        if value not in values or type(value) is not type(values[0]):
            raise InvalidArgumentError(f"{type(cfg).__name__}.{name}", _describe(values), repr(value))

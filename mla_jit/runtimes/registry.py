"""The registry of kernel families (filled when mla_jit.runtimes is imported)."""
from __future__ import annotations

from typing import TypeVar

_FAMILIES: dict[str, object] = {}
F = TypeVar("F")


def register(cls: type[F]) -> type[F]:
    """Class decorator: instantiate the family once and register it under its name."""
    _FAMILIES[cls.name] = cls()
    return cls


def get(name: str):
    family = _FAMILIES.get(name)
    if family is None:
        family = families()[name]
    return family


def families() -> dict[str, object]:
    from .. import runtimes  # noqa: F401  (importing the package registers every family)
    return dict(_FAMILIES)


def reset_all() -> None:
    """Reset every family's in-process state (see KernelFamily.reset)."""
    for family in families().values():
        family.reset()

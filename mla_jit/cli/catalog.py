"""What the registry, the presets and the arch module offer, for --help and validation."""
from __future__ import annotations

import textwrap




def families() -> dict:
    from ..runtimes import registry
    return registry.families()


def ops() -> dict[str, list]:
    """op -> the families serving it, in registry order."""
    out: dict[str, list] = {}
    for family in families().values():
        for op in family.ops:
            out.setdefault(op, []).append(family)
    return out


def default_ops() -> list[str]:
    return [op for op, fams in ops().items() if any(f.default_prewarm for f in fams)]


def example_ops() -> list[str]:
    return [op for op, fams in ops().items() if not any(f.default_prewarm for f in fams)]


def preset_names() -> list[str]:
    from .. import presets
    groups = [f"{g} (= {', '.join(members)})" for g, members in presets.PRESET_GROUPS.items()]
    return [*groups, *presets.PRESETS]


def arch_names() -> tuple[str, ...]:
    from ..jit.arch import SUPPORTED_ARCHS
    return SUPPORTED_ARCHS


def catalog() -> str:
    """The ops, families, presets and archs, generated from their modules (for --help)."""
    items = [
        ("ops", f"{', '.join(default_ops())} (built by default); {', '.join(example_ops())} "
                "(examples: built only when named with --op)"),
        ("families (--config FAMILY:field=value,...)", ", ".join(families())),
        ("presets", ", ".join(preset_names())),
        ("archs", f"{', '.join(arch_names())}; TUNING@TARGET builds a family for a newer GPU "
                  "(e.g. sm_80@sm_90a)"),
    ]
    return "\n".join(textwrap.fill(text, 100, initial_indent=f"{name}: ", subsequent_indent="    ")
                     for name, text in items)

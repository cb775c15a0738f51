"""Model presets for `mla-jit prewarm --preset`: the MLA shapes real deployments run."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    name: str
    num_heads_q: int      # query heads per GPU (after tensor parallelism)
    num_heads_kv: int
    head_dim: int         # d of q and k (latent + rope)
    head_dim_v: int
    page_size: int = 64
    prefill_head_dim: int = 192     # MHA-mode prefill: q/k = nope 128 + rope 64
    prefill_head_dim_v: int = 128
    indexer_heads: int = 0          # DeepSeek V3.2's lightning indexer (0: the model has none)
    indexer_head_dim: int = 128


def _deepseek_v3(tp: int) -> Preset:
    return Preset(f"deepseek-v3-tp{tp}", 128 // tp, 1, 576, 512)


def _deepseek_v32(tp: int) -> Preset:
    # V3.2 (and GLM-5's DSA stack): V3's attention plus the 64-head indexer, split like the heads.
    return Preset(f"deepseek-v3.2-tp{tp}", 128 // tp, 1, 576, 512, indexer_heads=64 // tp)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    *(_deepseek_v3(tp) for tp in (1, 2, 4, 8)),
    *(_deepseek_v32(tp) for tp in (1, 2, 4, 8)),
    Preset("deepseek-v2-lite", 16, 1, 576, 512),
]}

# Group names expand to several presets.
PRESET_GROUPS: dict[str, tuple[str, ...]] = {
    "deepseek-v3": tuple(f"deepseek-v3-tp{tp}" for tp in (1, 2, 4, 8)),
    "deepseek-v3.2": tuple(f"deepseek-v3.2-tp{tp}" for tp in (1, 2, 4, 8)),
}


def resolve(names: list[str] | None) -> list[Preset]:
    """Presets named (groups expanded); all of them when `names` is empty."""
    from .errors import MlaJitError
    if not names:
        return list(PRESETS.values())
    out: list[Preset] = []
    for name in names:
        for member in PRESET_GROUPS.get(name, (name,)):
            if member not in PRESETS:
                raise MlaJitError(f"unknown preset {name!r}; known: "
                                  f"{', '.join([*PRESET_GROUPS, *PRESETS])}")
            if PRESETS[member] not in out:
                out.append(PRESETS[member])
    return out

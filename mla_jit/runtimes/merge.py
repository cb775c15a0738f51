"""The attention-state merge family (merge_attn_states): render and prewarm; no torch here."""
from __future__ import annotations

import struct
from typing import Any, Iterable

from ..configs.merge import MergeConfig, merge_config
from ..dtypes import cpp_type
from ..jit.arch import Arch, ArchPair
from ..presets import Preset
from .base import KernelFamily
from .registry import register

# C layout of prefill/merge_states.cuh's MergeParams (6 pointers, 12 strides, 2 ints).
MERGE_PARAMS = struct.Struct("<6Q12q2i")
assert MERGE_PARAMS.size == 152


@register
class MergeStatesFamily(KernelFamily[MergeConfig]):
    name = "merge_states"
    template = "merge_states.cu.j2"
    config_type = MergeConfig
    ops = ("merge_attn_states",)
    tunings = ("sm_90a", "sm_80", "sm_86", "sm_89")
    ENTRY = "mla_jit_merge_states"

    def entry_points(self, cfg: MergeConfig) -> tuple[str, ...]:
        return (self.ENTRY,)

    def render_context(self, cfg: MergeConfig, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.ENTRY, "dtype": cpp_type(cfg.dtype), "head_dim": cfg.head_dim,
                "num_threads": cfg.num_threads}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[MergeConfig]:
        # Chunked prefill merges v = 128 (MHA-mode prefill) and split decode merges dv = 512 states.
        return [merge_config(dtype, d, arch) for dtype in ("bf16", "fp16") for d in (128, 512)]

"""The varlen attention prefill family (flash_attn_varlen_func): render and prewarm; no torch here."""
from __future__ import annotations

import struct
from typing import Any, Iterable

from ..configs.prefill import PrefillConfig, Sm80PrefillConfig, prefill_config, sm80_prefill_config
from ..dtypes import cpp_type
from ..jit.arch import Arch, ArchPair
from ..presets import Preset
from .base import KernelFamily
from .registry import register

# C layout of prefill/common.cuh's PrefillParams (q, k, v and their strides; out, lse, cu_seqlens;
# out strides; 5 ints, 2 floats, 1 int; the tile counter).
PREFILL_PARAMS = struct.Struct("<3Q6q4Q2q5i2fiQ")
assert PREFILL_PARAMS.size == 160


@register
class PrefillSm90Family(KernelFamily[PrefillConfig]):
    name = "prefill_sm90"
    template = "prefill_sm90.cu.j2"
    config_type = PrefillConfig
    ops = ("flash_attn_varlen_func",)
    tunings = ("sm_90a",)
    ENTRY = "mla_jit_prefill_fwd"

    def entry_points(self, cfg: PrefillConfig) -> tuple[str, ...]:
        return (self.ENTRY,)

    def render_context(self, cfg: PrefillConfig, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.ENTRY, "dtype": cpp_type(cfg.dtype), "head_dim": cfg.head_dim,
                "head_dim_v": cfg.head_dim_v, "block_m": cfg.block_m, "block_n": cfg.block_n,
                "num_stages": cfg.num_stages, "causal": "true" if cfg.causal else "false"}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[PrefillConfig]:
        # The kernel does not depend on the head count: one per dtype and causality serves every
        # preset's prefill head dims (new tokens are causal, context chunks are not).
        dims = dict.fromkeys((p.prefill_head_dim, p.prefill_head_dim_v) for p in presets)
        return [prefill_config(dtype, d, dv, causal, arch) for d, dv in dims for dtype in ("bf16", "fp16")
                for causal in (True, False)]


@register
class PrefillSm80Family(KernelFamily[Sm80PrefillConfig]):
    """mma.sync + ldmatrix + cp.async kernel for GPUs without TMA/wgmma (sm_80, sm_86, sm_89), picked by
    the detected arch; v head dim 128 native."""
    name = "prefill_sm80"
    template = "prefill_sm80.cu.j2"
    config_type = Sm80PrefillConfig
    ops = ("flash_attn_varlen_func",)
    tunings = ("sm_80", "sm_86", "sm_89")
    ENTRY = "mla_jit_prefill_fwd"

    def entry_points(self, cfg: Sm80PrefillConfig) -> tuple[str, ...]:
        return (self.ENTRY,)

    def render_context(self, cfg: Sm80PrefillConfig, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.ENTRY, "tuning": arch.tuning.name, "dtype": cpp_type(cfg.dtype),
                "head_dim": cfg.head_dim, "head_dim_v": cfg.head_dim_v, "block_m": cfg.block_m,
                "block_n": cfg.block_n, "num_stages": cfg.num_stages, "causal": "true" if cfg.causal else "false",
                "q_aliases_kv": "true" if cfg.q_aliases_kv else "false"}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[Sm80PrefillConfig]:
        dims = dict.fromkeys((p.prefill_head_dim, p.prefill_head_dim_v) for p in presets)
        return [sm80_prefill_config(dtype, d, dv, causal, arch) for d, dv in dims for dtype in ("bf16", "fp16")
                for causal in (True, False)]

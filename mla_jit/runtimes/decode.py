"""Dense paged MLA decode on sm90: scheduler metadata, split-KV main kernel, combine."""
from __future__ import annotations

import struct
from typing import Any, Iterable

from ..configs.decode import (BLOCK_M, CLUSTER_ENV, S_HALVES_MIN_ROWS, SCHEDULE_ENV, SCHEDULES, SPARSE_KV,
                              SUPPORTED_HEAD_DIMS,
                              DecodeConfig, MetadataConfig, cluster_m_for, decode_config, metadata_config,
                              out_dtype_of)
from ..configs.decode_sm80 import Sm80DecodeConfig, sm80_decode_config
from ..configs.sparse import (BF16_ROWS, FP8_RECORDS, PREFILL_HEAD_DIMS, SparseNarrowConfig, SparseWsConfig, family_of,
                              head_tile_pairs, sparse_config)
from ..dtypes import cpp_type
from ..jit import env
from ..jit.arch import Arch, ArchPair
from ..presets import Preset
from .base import KernelFamily
from .registry import register

# C layouts of decode/common.cuh's parameter structs (little endian, natural alignment).
DECODE_PARAMS = struct.Struct("<9Q4q8i2f2iQ2Q2Qq2iQ")  # DecodeParams, 216 bytes
METADATA_PARAMS = struct.Struct("<3Q6i")               # MetadataParams, 48 bytes
assert DECODE_PARAMS.size == 216 and METADATA_PARAMS.size == 48


@register
class MlaMetadataFamily(KernelFamily[MetadataConfig]):
    name = "mla_metadata"
    template = "mla_metadata.cu.j2"
    config_type = MetadataConfig
    # (flash_mla_sparse_fwd: the sparse prefill schedules its tokens with it too)
    ops = ("get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd")
    tunings = ("sm_90a", "sm_80", "sm_86", "sm_89")
    ENTRY = "mla_jit_mla_metadata"

    def entry_points(self, cfg: MetadataConfig) -> tuple[str, ...]:
        return (self.ENTRY,)

    def render_context(self, cfg: MetadataConfig, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.ENTRY, "block_n": cfg.block_n}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[MetadataConfig]:
        return [metadata_config()]


# (q dtype, cache dtype where it differs) the decode families prewarm: DeepSeek V3 servers run a bf16
# cache, or an FP8 (e4m3) one with e4m3 q (vLLM, SGLang) or with bf16 q (the accurate path).
_PREWARM_DTYPES = (("bf16", None), ("e4m3", None), ("bf16", "e4m3"))


def _preset_shapes(presets: list[Preset]) -> list[Preset]:
    return [p for p in presets if (p.head_dim, p.head_dim_v) in SUPPORTED_HEAD_DIMS]


def _cluster_sizes(preset: Preset, choice: str) -> list[int]:
    """Cluster sizes the sm90 kernels of `preset` run with at s_q 1 to 4 (always 1 among them: the
    fallback where not every cluster is resident)."""
    rows = (s_q * preset.num_heads_q // preset.num_heads_kv for s_q in (1, 2, 3, 4))
    return sorted({1, *(cluster_m_for(-(-r // BLOCK_M), choice) for r in rows)})


def _compact_choices(preset: Preset) -> list[int | None]:
    """decode_config's rows argument for the kernels a preset may take at s_q 1 to 4: None (64-row
    tiles), the first rows of at most 32 a KV head (compact rows) and the first of S_HALVES_MIN_ROWS
    or more (e4m3's S by token halves), where some s_q has them."""
    rows = [s_q * preset.num_heads_q // preset.num_heads_kv for s_q in (1, 2, 3, 4)]
    small = [r for r in rows if r <= BLOCK_M // 2]
    large = [r for r in rows if r >= S_HALVES_MIN_ROWS]
    return [None, *small[:1], *large[:1]]


@register
class MlaDecodeSm90Family(KernelFamily[DecodeConfig]):
    name = "mla_decode_sm90"
    template = "mla_decode_sm90.cu.j2"
    config_type = DecodeConfig
    ops = ("flash_mla_with_kvcache",)
    tunings = ("sm_90a",)
    SPLITKV = "mla_jit_decode_splitkv"
    COMBINE = "mla_jit_decode_combine"

    def entry_points(self, cfg: DecodeConfig) -> tuple[str, ...]:
        return (self.SPLITKV,) if cfg.fused_combine else (self.SPLITKV, self.COMBINE)

    def render_context(self, cfg: DecodeConfig, arch: ArchPair) -> dict[str, Any]:
        return {"splitkv_entry": self.SPLITKV, "combine_entry": "" if cfg.fused_combine else self.COMBINE,
                "fused_combine": "true" if cfg.fused_combine else "false", "cluster_m": cfg.cluster_m,
                "dtype": cpp_type(cfg.dtype), "out_dtype": cpp_type(out_dtype_of(cfg.dtype)),
                "kv_fp8": "true" if cfg.kv_dtype == "e4m3" else "false",
                "head_dim": cfg.head_dim, "head_dim_v": cfg.head_dim_v,
                "page_size": cfg.page_size, "block_m": cfg.block_m, "block_n": cfg.block_n,
                "num_stages": cfg.num_stages, "schedule": cfg.schedule,
                "compact_rows": "true" if cfg.compact_rows else "false", "chunks_per_load": cfg.chunks_per_load,
                "s_halves": "true" if cfg.s_halves else "false"}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[DecodeConfig]:
        # auto: which of the two a call takes depends on its batch and lengths; warm both.
        chosen = env.choice(SCHEDULE_ENV.name)
        schedules = SCHEDULES if chosen == "auto" else (chosen,)
        # Clustered kernels where a preset's row tiles (s_q 1 to 4) share KV; the unclustered one too
        # (a GPU that cannot keep every cluster resident falls back to it).
        cluster = env.choice(CLUSTER_ENV.name)
        # Compact rows (unclustered) where a preset's s_q 1 .. 4 has at most 32 rows a KV head; e4m3's S by
        # token halves where it has S_HALVES_MIN_ROWS or more.
        configs = (decode_config(dtype, p.head_dim, p.head_dim_v, p.page_size, arch, schedule, cluster_m, kv_dtype,
                                 rows)
                   for dtype, kv_dtype in _PREWARM_DTYPES
                   for p in _preset_shapes(presets) for schedule in schedules
                   for cluster_m in _cluster_sizes(p, cluster)
                   for rows in _compact_choices(p) if rows is None or rows > BLOCK_M // 2 or cluster_m == 1)
        return list(dict.fromkeys(configs))


@register
class MlaDecodeSm80Family(KernelFamily[Sm80DecodeConfig]):
    """mma.sync + cp.async split-KV kernel for GPUs without TMA/wgmma (sm_80, sm_86, sm_89), picked
    by the detected arch. Verified on Hopper with MLA_JIT_ARCH forcing each tuning (no Ampere/Ada
    GPU was at hand)."""
    name = "mla_decode_sm80"
    template = "mla_decode_sm80.cu.j2"
    config_type = Sm80DecodeConfig
    ops = ("flash_mla_with_kvcache",)
    tunings = ("sm_80", "sm_86", "sm_89")
    SPLITKV = "mla_jit_decode_sm80_splitkv"
    COMBINE = "mla_jit_decode_combine"

    def entry_points(self, cfg: Sm80DecodeConfig) -> tuple[str, ...]:
        return (self.SPLITKV, self.COMBINE)

    def render_context(self, cfg: Sm80DecodeConfig, arch: ArchPair) -> dict[str, Any]:
        cache_dtype = "e4m3" if cfg.kv_fp8 else cfg.dtype
        return {"splitkv_entry": self.SPLITKV, "combine_entry": self.COMBINE, "dtype": cpp_type(cfg.mma_dtype),
                "q_dtype": cpp_type(cfg.dtype), "out_dtype": cpp_type(out_dtype_of(cfg.dtype)),
                "cache_dtype": cpp_type(cache_dtype), "kv_fp8": (2 if cfg.fp8_cvt else 1) if cfg.kv_fp8 else 0,
                "fp8_k_stages": cfg.fp8_k_stages,
                "head_dim": cfg.head_dim, "head_dim_v": cfg.head_dim_v, "page_size": cfg.page_size,
                "block_m": cfg.block_m, "block_n": cfg.block_n, "num_stages": cfg.num_stages,
                "num_warps": cfg.num_warps, "smem_limit": cfg.smem_limit,
                "sparse": "true" if cfg.sparse else "false", "sparse_kv": SPARSE_KV[cfg.sparse],
                # sm_8x's ptxas spills the combine kernel without a 4-blocks hint, sm_90a's with it
                "combine_min_blocks": 4 if arch.target.major < 9 else 1}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[Sm80DecodeConfig]:
        configs = (sm80_decode_config(dtype, p.head_dim, p.head_dim_v, p.page_size,
                                      s_q * p.num_heads_q // p.num_heads_kv, arch, kv_dtype)
                   for dtype, kv_dtype in _PREWARM_DTYPES
                   for p in _preset_shapes(presets) for s_q in (1, 2))
        return list(dict.fromkeys(configs))


@register
class MlaSparseDecodeFamily(MlaDecodeSm80Family):
    """The sparse (DSA) decode and prefill (configs/sparse.py) below Hopper: the mma.sync split-KV
    kernel with SPARSE_KV (FP8 records, or the prefill's bf16 rows)."""
    name = "mla_sparse_decode"
    ops = ("flash_mla_with_kvcache", "flash_mla_sparse_fwd")
    tunings = ("sm_80", "sm_86", "sm_89")

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[Sm80DecodeConfig]:
        return [c for c in _sparse_prewarm(arch, presets) if family_of(c) == self.name]


def _sparse_prewarm(arch: Arch, presets: list[Preset]) -> list:
    """The sparse kernels of the presets' models with DeepSeek sparse attention (an indexer: V3.2,
    GLM-5): the FP8 records at their cache's page size (decode, and prefill over the cache), and the
    prefill's bf16 rows."""
    sparse = [p for p in presets if p.indexer_heads and p.head_dim in PREFILL_HEAD_DIMS]
    pairs = head_tile_pairs(env.choice(CLUSTER_ENV.name))   # (as the plans choose)
    configs = [sparse_config(FP8_RECORDS, 576, p.page_size, arch, p.num_heads_q, pairs) for p in sparse
               if p.head_dim == 576]
    configs += [sparse_config(BF16_ROWS, p.head_dim, 64, arch, p.num_heads_q) for p in sparse]
    return list(dict.fromkeys(configs))


class _SparseSm90Family(KernelFamily):
    """What the sm_90a sparse families share: the split-KV and combine entries, the ops they serve,
    their prewarm list (the sparse presets' kernels that map to the family); a subclass names its
    template's own fields (kernel_fields)."""
    ops = ("flash_mla_with_kvcache", "flash_mla_sparse_fwd")
    tunings = ("sm_90a",)
    SPLITKV = "mla_jit_sparse_splitkv"
    COMBINE = "mla_jit_decode_combine"

    def kernel_fields(self, cfg) -> dict[str, Any]:
        raise NotImplementedError

    def entry_points(self, cfg) -> tuple[str, ...]:
        return (self.SPLITKV, self.COMBINE)

    def render_context(self, cfg, arch: ArchPair) -> dict[str, Any]:
        return {"splitkv_entry": self.SPLITKV, "combine_entry": self.COMBINE, **self.kernel_fields(cfg)}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable:
        return [c for c in _sparse_prewarm(arch, presets) if family_of(c) == self.name]


@register
class MlaSparseSm90Family(_SparseSm90Family):
    """The sparse (DSA) attention's wgmma kernel on sm_90a (configs/sparse.py SparseWsConfig):
    the dense decode's warp-specialized split-KV kernel with the P V warpgroups gathering the tiles."""
    name = "mla_sparse_sm90"
    template = "mla_sparse_sm90.cu.j2"
    config_type = SparseWsConfig

    def kernel_fields(self, cfg: SparseWsConfig) -> dict[str, Any]:
        return {"head_dim": cfg.head_dim, "num_stages": cfg.num_stages, "sparse_kv": cfg.sparse_kv,
                "page_size": cfg.page_size, "cluster_m": cfg.cluster_m}


@register
class MlaSparseNarrowSm90Family(_SparseSm90Family):
    """The sparse (DSA) attention over FP8 records on sm_90a for few heads (configs/sparse.py
    SparseNarrowConfig): swapped wgmma operands, heads as N."""
    name = "mla_sparse_narrow_sm90"
    template = "mla_sparse_narrow_sm90.cu.j2"
    config_type = SparseNarrowConfig

    def kernel_fields(self, cfg: SparseNarrowConfig) -> dict[str, Any]:
        return {"heads": cfg.heads, "slots": cfg.slots, "page_size": cfg.page_size,
                "min_blocks": cfg.resident_ctas}

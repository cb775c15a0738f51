"""The DeepSeek V3.2 indexer families (fp8_mqa_logits, fp8_paged_mqa_logits, their metadata):
render and prewarm; no torch here."""
from __future__ import annotations

import struct
from typing import Any, Iterable

from ..configs.indexer import (INDEXER_MAX_NEXT_N, SM80_TUNINGS, IndexerMetadataConfig, LogitsConfig,
                               LogitsSm80Config, PagedConfig, PagedSm80Config, logits_config, logits_sm80_config,
                               paged_config, paged_sm80_config)
from ..jit.arch import Arch, ArchPair
from ..presets import Preset
from .base import KernelFamily
from .registry import register

# C layouts of indexer/common.cuh's parameter structs.
LOGITS_PARAMS = struct.Struct("<3Qq8i")      # LogitsParams, 64 bytes
PAGED_PARAMS = struct.Struct("<4Q2q6i")      # PagedParams, 72 bytes
METADATA_PARAMS = struct.Struct("<2Q4i")     # MetadataParams, 32 bytes
# The mma.sync kernels' (indexer/mma_sm80.cuh): the struct above, then the pointers TMA would read.
LOGITS_SM80_PARAMS = struct.Struct("<3Qq8i4Qq")     # LogitsSm80Params, 104 bytes
PAGED_SM80_PARAMS = struct.Struct("<4Q2q6i3Q2q2i")  # PagedSm80Params, 120 bytes
assert LOGITS_PARAMS.size == 64 and PAGED_PARAMS.size == 72 and METADATA_PARAMS.size == 32
assert LOGITS_SM80_PARAMS.size == 104 and PAGED_SM80_PARAMS.size == 120


def _indexer_shapes(presets: list[Preset]) -> list[tuple[int, int, int]]:
    return list(dict.fromkeys((p.indexer_heads, p.indexer_head_dim, p.page_size) for p in presets
                              if p.indexer_heads))


@register
class IndexerLogitsSm90Family(KernelFamily[LogitsConfig]):
    name = "indexer_logits_sm90"
    template = "indexer_logits_sm90.cu.j2"
    config_type = LogitsConfig
    ops = ("fp8_mqa_logits",)
    tunings = ("sm_90a",)
    ENTRY = "mla_jit_indexer_logits"

    def entry_points(self, cfg: LogitsConfig) -> tuple[str, ...]:
        return (self.ENTRY,)

    def render_context(self, cfg: LogitsConfig, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.ENTRY, "heads": cfg.heads, "head_dim": cfg.head_dim, "num_stages": cfg.num_stages,
                "linear_on_mma": cfg.linear_on_mma}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[LogitsConfig]:
        return list(dict.fromkeys(logits_config(h, d, arch) for h, d, _ in _indexer_shapes(presets)))


@register
class IndexerPagedSm90Family(KernelFamily[PagedConfig]):
    name = "indexer_paged_sm90"
    template = "indexer_paged_sm90.cu.j2"
    config_type = PagedConfig
    ops = ("fp8_paged_mqa_logits",)
    tunings = ("sm_90a",)
    ENTRY = "mla_jit_indexer_paged"

    def entry_points(self, cfg: PagedConfig) -> tuple[str, ...]:
        return (self.ENTRY,)

    def render_context(self, cfg: PagedConfig, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.ENTRY, "heads": cfg.heads, "head_dim": cfg.head_dim, "next_n": cfg.next_n,
                "page_size": cfg.page_size, "num_stages": cfg.num_stages, "math_warpgroups": cfg.math_warpgroups,
                "load_warps": cfg.load_warps, "linear_on_mma": cfg.linear_on_mma}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[PagedConfig]:
        # Decode with multi-token prediction: next_n 1 .. 4 for each preset's heads.
        return list(dict.fromkeys(paged_config(h, d, n, page, arch) for h, d, page in _indexer_shapes(presets)
                                  for n in range(1, INDEXER_MAX_NEXT_N + 1)))


@register
class IndexerLogitsSm80Family(KernelFamily[LogitsSm80Config]):
    """fp8_mqa_logits with mma.sync + ldmatrix + cp.async (sm_80 / sm_86: e4m3 converted to fp16;
    sm_89: FP8 mma)."""
    name = "indexer_logits_sm80"
    template = "indexer_logits_sm80.cu.j2"
    config_type = LogitsSm80Config
    ops = ("fp8_mqa_logits",)
    tunings = SM80_TUNINGS
    ENTRY = "mla_jit_indexer_logits"

    def entry_points(self, cfg: LogitsSm80Config) -> tuple[str, ...]:
        return (self.ENTRY,)

    def render_context(self, cfg: LogitsSm80Config, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.ENTRY, "tuning": arch.tuning.name, "heads": cfg.heads, "head_dim": cfg.head_dim,
                "num_stages": cfg.num_stages, "fp8_mma": cfg.fp8_mma, "warp_keys": cfg.warp_keys,
                "token_groups": cfg.token_groups}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[LogitsSm80Config]:
        return list(dict.fromkeys(logits_sm80_config(h, d, arch) for h, d, _ in _indexer_shapes(presets)))


@register
class IndexerPagedSm80Family(KernelFamily[PagedSm80Config]):
    """fp8_paged_mqa_logits with mma.sync + ldmatrix + cp.async (as indexer_logits_sm80)."""
    name = "indexer_paged_sm80"
    template = "indexer_paged_sm80.cu.j2"
    config_type = PagedSm80Config
    ops = ("fp8_paged_mqa_logits",)
    tunings = SM80_TUNINGS
    ENTRY = "mla_jit_indexer_paged"

    def entry_points(self, cfg: PagedSm80Config) -> tuple[str, ...]:
        return (self.ENTRY,)

    def render_context(self, cfg: PagedSm80Config, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.ENTRY, "tuning": arch.tuning.name, "heads": cfg.heads, "head_dim": cfg.head_dim,
                "next_n": cfg.next_n, "page_size": cfg.page_size, "num_stages": cfg.num_stages,
                "fp8_mma": cfg.fp8_mma}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[PagedSm80Config]:
        return list(dict.fromkeys(paged_sm80_config(h, d, n, page, arch) for h, d, page in _indexer_shapes(presets)
                                  for n in range(1, INDEXER_MAX_NEXT_N + 1)))


@register
class IndexerMetadataFamily(KernelFamily[IndexerMetadataConfig]):
    name = "indexer_metadata"
    template = "indexer_metadata.cu.j2"
    config_type = IndexerMetadataConfig
    ops = ("get_paged_mqa_logits_metadata",)
    tunings = ("sm_90a", "sm_80", "sm_86", "sm_89")
    ENTRY = "mla_jit_indexer_metadata"

    def entry_points(self, cfg: IndexerMetadataConfig) -> tuple[str, ...]:
        return (self.ENTRY,)

    def render_context(self, cfg: IndexerMetadataConfig, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.ENTRY}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[IndexerMetadataConfig]:
        return [IndexerMetadataConfig()] if _indexer_shapes(presets) else []

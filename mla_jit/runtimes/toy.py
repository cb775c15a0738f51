"""Toy families: the worked example of adding a family (see README, "Adding a kernel family")."""
from __future__ import annotations

from typing import Any, Iterable

from ..configs.toy import TileCopyConfig, WgmmaGemmConfig, tile_copy_config, wgmma_gemm_config
from ..dtypes import cpp_include, cpp_type
from ..jit.arch import Arch, ArchPair
from ..presets import Preset
from .base import KernelFamily
from .registry import register


@register
class TileCopyFamily(KernelFamily[TileCopyConfig]):
    name = "tile_copy"
    template = "tile_copy.cu.j2"
    config_type = TileCopyConfig
    ops = ("tile_copy",)
    tunings = ("sm_90a",)
    default_prewarm = False   # an example: prewarm builds it only with --op tile_copy or --config

    def entry_points(self, cfg: TileCopyConfig) -> tuple[str, ...]:
        return ("mla_jit_tile_copy",)

    def render_context(self, cfg: TileCopyConfig, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.entry_points(cfg)[0], "dtype": cpp_type(cfg.dtype),
                "dtype_include": cpp_include(cfg.dtype), "block_rows": cfg.block_rows,
                "block_cols": cfg.block_cols, "num_threads": cfg.num_threads}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[TileCopyConfig]:
        return [tile_copy_config(d, arch) for d in ("bf16", "fp16", "fp32")]


@register
class WgmmaGemmFamily(KernelFamily[WgmmaGemmConfig]):
    name = "wgmma_gemm"
    template = "wgmma_gemm.cu.j2"
    config_type = WgmmaGemmConfig
    ops = ("wgmma_gemm",)
    tunings = ("sm_90a",)
    default_prewarm = False   # an example: prewarm builds it only with --op wgmma_gemm or --config

    def entry_points(self, cfg: WgmmaGemmConfig) -> tuple[str, ...]:
        return ("mla_jit_wgmma_gemm",)

    def render_context(self, cfg: WgmmaGemmConfig, arch: ArchPair) -> dict[str, Any]:
        return {"entry": self.entry_points(cfg)[0], "dtype": cpp_type(cfg.dtype), "block_m": cfg.block_m,
                "block_n": cfg.block_n, "block_k": cfg.block_k}

    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[WgmmaGemmConfig]:
        return [wgmma_gemm_config(d, arch) for d in ("bf16", "fp16")]

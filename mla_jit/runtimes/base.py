"""A kernel family: config -> rendered source -> binary -> loaded kernel -> prepared launch.

Adding a family means one header, one template, one config function, one subclass of
KernelFamily, and one op. The JIT core (jit/, cache/) does not change.
"""
from __future__ import annotations

import dataclasses
import re
import threading
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, Iterable, TypeVar

from ..errors import KernelNotWarmError, MlaJitError
from ..jit import render
from ..jit.arch import Arch, ArchPair
from ..jit.build import Binary, KernelSource, build
from ..jit.launch import PreparedLaunch
from ..jit.loader import LoadedKernel, get_kernel
from ..presets import Preset

Cfg = TypeVar("Cfg")


def _is_capturing() -> bool:
    import torch
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class KernelFamily(ABC, Generic[Cfg]):
    name: ClassVar[str]                 # registry name, used in kernel names and --config specs
    template: ClassVar[str]             # file under templates/
    config_type: ClassVar[type]         # a frozen dataclass
    ops: ClassVar[tuple[str, ...]]      # public ops served by this family (prewarm --op)
    tunings: ClassVar[tuple[str, ...]]  # tuning archs this family serves

    def __init__(self) -> None:
        self._binaries: dict[tuple[Cfg, ArchPair], Binary] = {}
        self._kernels: dict[tuple[Cfg, ArchPair, str, int], LoadedKernel] = {}
        self._launches: dict[tuple, PreparedLaunch] = {}
        self._lock = threading.Lock()
        # Warm-path memos that ops keep per family: launch plans by shape, TMA descriptors by
        # tensor address. Cleared with everything else by reset().
        self.plans: dict[tuple, Any] = {}
        self.descriptors: dict[tuple, Any] = {}

    def reset(self) -> None:
        """Forget every loaded kernel, launch and plan (tests use this to act as a new process)."""
        with self._lock:
            for memo in (self._binaries, self._kernels, self._launches, self.plans, self.descriptors):
                memo.clear()

    # ---- what a family defines -------------------------------------------------------------
    @abstractmethod
    def render_context(self, cfg: Cfg, arch: ArchPair) -> dict[str, Any]:
        """Template parameters for `cfg` (entry point names included)."""

    @abstractmethod
    def entry_points(self, cfg: Cfg) -> tuple[str, ...]:
        """extern "C" kernel names the rendered source defines."""

    @abstractmethod
    def prewarm_configs(self, arch: Arch, presets: list[Preset]) -> Iterable[Cfg]:
        """Every config the given model presets need on `arch` (for `mla-jit prewarm`)."""

    # ---- shared machinery --------------------------------------------------------------------
    def supports(self, arch: Arch) -> bool:
        return arch.name in self.tunings

    def kernel_name(self, cfg: Cfg) -> str:
        parts = [str(int(v)) if isinstance(v, bool) else str(v) for v in dataclasses.astuple(cfg)]
        return re.sub(r"[^A-Za-z0-9_-]+", "_", "-".join([self.name, *parts]))

    def config_spec(self, cfg: Cfg) -> str:
        fields = ",".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg))
        return f"{self.name}:{fields}"

    def config_from_spec(self, spec: str) -> Cfg:
        """Inverse of config_spec ('family:a=1,b=x' -> Cfg)."""
        _, _, body = spec.partition(":")
        types = {f.name: f.type for f in dataclasses.fields(self.config_type)}
        values: dict[str, Any] = {}
        for item in filter(None, body.split(",")):
            key, _, raw = item.partition("=")
            if key not in types:
                raise MlaJitError(f"--config {spec}: {self.name} has no field {key!r} (fields: {sorted(types)})")
            kind = types[key] if isinstance(types[key], str) else types[key].__name__
            values[key] = (raw in ("True", "true", "1")) if kind == "bool" else int(raw) if kind == "int" else raw
        return self.config_type(**values)

    def prewarm_command(self, cfg: Cfg, arch: ArchPair) -> str:
        arch_text = arch.target.name if arch.tuning == arch.target else f"{arch.tuning.name}@{arch.target.name}"
        return f"mla-jit prewarm --arch {arch_text} --config '{self.config_spec(cfg)}'"

    def source(self, cfg: Cfg, arch: ArchPair) -> KernelSource:
        if not self.supports(arch.tuning):
            raise MlaJitError(f"kernel family {self.name} does not serve {arch.tuning.name}")
        text = render.render(self.template, self.render_context(cfg, arch))
        return KernelSource(self.kernel_name(cfg), text, self.entry_points(cfg), arch,
                            self.prewarm_command(cfg, arch))

    def binary(self, cfg: Cfg, arch: ArchPair) -> Binary:
        hit = self._binaries.get((cfg, arch))
        if hit is None:
            if _is_capturing():
                raise KernelNotWarmError(
                    f"kernel {self.kernel_name(cfg)} is not loaded and a CUDA graph is being captured; "
                    f"run the op once before capture (or prewarm: {self.prewarm_command(cfg, arch)})")
            hit = build(self.source(cfg, arch))
            self._binaries[(cfg, arch)] = hit
        return hit

    def kernel(self, cfg: Cfg, arch: ArchPair, entry: str, device_index: int,
               dynamic_smem: int = 0) -> LoadedKernel:
        memo = (cfg, arch, entry, device_index)
        hit = self._kernels.get(memo)
        if hit is None or hit.max_dynamic_smem < dynamic_smem:
            binary = self.binary(cfg, arch)
            if _is_capturing():
                raise KernelNotWarmError(f"kernel {binary.name} must be loaded on device {device_index} "
                                         "before CUDA graph capture: run the op once outside capture")
            hit = get_kernel(binary, entry, device_index, dynamic_smem)
            self._kernels[memo] = hit
        return hit

    def launcher(self, cfg: Cfg, arch: ArchPair, entry: str, device_index: int, params: tuple,
                 grid: tuple[int, int, int], block: tuple[int, int, int], dynamic_smem: int = 0,
                 cluster: tuple[int, int, int] | None = None, pdl: bool = False) -> PreparedLaunch:
        """A cached PreparedLaunch for one kernel and launch shape."""
        memo = (cfg, arch, entry, device_index, grid, block, dynamic_smem, cluster, pdl)
        hit = self._launches.get(memo)
        if hit is None:
            kernel = self.kernel(cfg, arch, entry, device_index, dynamic_smem)
            with self._lock:
                hit = self._launches.get(memo) or PreparedLaunch(kernel, params, grid, block, dynamic_smem,
                                                                 cluster, pdl)
                self._launches[memo] = hit
        return hit

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

from ..errors import ConfigSpecError, KernelNotWarmError, MlaJitError
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
    # Whether a plain `mla-jit prewarm` builds this family's kernels. Examples (the toy families) set
    # False: they are built only when asked for by --op or --config.
    default_prewarm: ClassVar[bool] = True

    def __init__(self) -> None:
        self._binaries: dict[tuple[Cfg, ArchPair], Binary] = {}
        self._kernels: dict[tuple[Cfg, ArchPair, str, int], LoadedKernel] = {}
        self._launches: dict[tuple, PreparedLaunch] = {}
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget every loaded kernel and launch (tests use this to act as a new process)."""
        with self._lock:
            for memo in (self._binaries, self._kernels, self._launches):
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
        """Inverse of config_spec ('family:a=1,b=x' -> Cfg). Strict: every field without a default
        must be given, ints and bools must parse, and the config's own validation runs; any problem
        raises ConfigSpecError naming the field (and the values it accepts)."""
        family, sep, body = spec.partition(":")
        if not sep or family.strip() != self.name:
            raise ConfigSpecError(f"--config {spec}: expected {self.name}:field=value,...")
        fields = {f.name: f for f in dataclasses.fields(self.config_type)}
        values: dict[str, Any] = {}
        for item in body.split(","):
            if not item.strip():
                continue
            key, eq, raw = (part.strip() for part in item.partition("="))
            if not eq:
                raise ConfigSpecError(f"--config {spec}: {item.strip()!r} is not field=value")
            if key not in fields:
                raise ConfigSpecError(f"--config {spec}: {self.name} has no field {key!r} "
                                      f"(fields: {', '.join(fields)})")
            if key in values:
                raise ConfigSpecError(f"--config {spec}: field {key} given twice")
            values[key] = self._parse_field(spec, key, fields[key].type, raw)
        missing = [name for name, f in fields.items() if name not in values
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ConfigSpecError(f"--config {spec}: missing field{'s' if len(missing) > 1 else ''} "
                                  f"{', '.join(missing)} ({self.name} fields: {', '.join(fields)})")
        try:
            return self.config_type(**values)
        except (ValueError, TypeError) as exc:
            raise ConfigSpecError(f"--config {spec}: {exc}") from None

    @staticmethod
    def _parse_field(spec: str, key: str, annotation: Any, raw: str) -> Any:
        kind = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
        if kind.endswith("| None") and raw == "None":   # an optional field left unset
            return None
        if kind == "bool":
            if raw.lower() in ("true", "1"):
                return True
            if raw.lower() in ("false", "0"):
                return False
            raise ConfigSpecError(f"--config {spec}: {key}: expected true or false, got {raw!r}")
        if kind == "int":
            if not re.fullmatch(r"[+-]?[0-9]+", raw):
                raise ConfigSpecError(f"--config {spec}: {key}: expected an integer, got {raw!r}")
            return int(raw)
        return raw

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

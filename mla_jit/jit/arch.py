"""GPU architecture: detection, parsing, and the override from MLA_JIT_ARCH.

Two architectures matter for a kernel: the *tuning* arch picks the kernel family and its
tile sizes; the *target* arch is what the cubin is compiled for. They differ only when the
override asks for an older family on a newer GPU (e.g. the sm80 family on a Hopper GPU):
machine code runs only within one major version, so the cubin then targets the GPU present.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..errors import UnsupportedArchError
from . import env

_ARCH_RE = re.compile(r"^(?:sm_?|compute_?)?(\d+?)(\d)([a-z]?)$")


@dataclass(frozen=True, order=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""  # "a" for arch-specific features (wgmma, setmaxnreg on sm_90a)

    @property
    def name(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def sm(self) -> int:
        return self.major * 10 + self.minor

    def __str__(self) -> str:
        return self.name

    def can_run_cubin_for(self, target: "Arch") -> bool:
        """Whether a GPU of this arch can execute a cubin compiled for `target`."""
        if target.major != self.major or target.minor > self.minor:
            return False
        return not target.suffix or (target.minor == self.minor)


SUPPORTED_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")


def parse_arch(text: str) -> Arch:
    """Parse 'sm_90a', 'sm90a', '90a', '9.0', 'sm_80' ... into an Arch. sm_90 becomes sm_90a."""
    raw = text.strip().lower().replace(".", "")
    m = _ARCH_RE.match(raw)
    if not m:
        raise UnsupportedArchError(
            f"unsupported architecture {text.strip()!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
    arch = Arch(int(m.group(1)), int(m.group(2)), m.group(3))
    if arch.major == 9 and arch.minor == 0:
        arch = Arch(9, 0, "a")  # our Hopper kernels use wgmma/setmaxnreg: always sm_90a
    if arch.name not in SUPPORTED_ARCHS:
        raise UnsupportedArchError(f"unsupported architecture {arch.name}; supported: {', '.join(SUPPORTED_ARCHS)}")
    return arch


def parse_arch_pair(text: str) -> "ArchPair":
    """'sm_90a' or 'TUNING@TARGET' (e.g. 'sm_80@sm_90a': the sm80 family built to run on Hopper)."""
    tuning_text, sep, target_text = text.partition("@")
    tuning = parse_arch(tuning_text)
    target = parse_arch(target_text) if sep else tuning
    if target.major < tuning.major or (target.major == tuning.major and target.minor < tuning.minor):
        raise UnsupportedArchError(f"architecture {text.strip()}: a {tuning.name} family cannot be built for the "
                                   f"older {target.name} (TUNING@TARGET needs TARGET >= TUNING)")
    return ArchPair(tuning, target)


@functools.lru_cache(maxsize=None)
def device_arch(device_index: int) -> Arch:
    """The arch of a visible CUDA device (cached; capability never changes)."""
    import torch
    major, minor = torch.cuda.get_device_capability(device_index)
    if (major, minor) == (9, 0):
        return Arch(9, 0, "a")
    if major > 9:
        raise UnsupportedArchError(
            f"GPU {device_index} has compute capability {major}.{minor}; mla_jit supports "
            f"{', '.join(SUPPORTED_ARCHS)} (set MLA_JIT_ARCH to pick a family explicitly)")
    return Arch(major, minor, "")


@dataclass(frozen=True)
class ArchPair:
    tuning: Arch
    target: Arch


def resolve_for_device(device_index: int) -> ArchPair:
    """Tuning and target arch for a kernel that will run on `device_index` (MLA_JIT_ARCH read live)."""
    return _resolve_for_device(device_index, env.arch_override())


@functools.lru_cache(maxsize=None)
def _resolve_for_device(device_index: int, override: str) -> ArchPair:
    gpu = device_arch(device_index)
    if not override:
        if gpu.name not in SUPPORTED_ARCHS:
            raise UnsupportedArchError(f"GPU arch {gpu.name} is not supported ({', '.join(SUPPORTED_ARCHS)})")
        return ArchPair(gpu, gpu)
    try:
        tuning = parse_arch(override)
    except UnsupportedArchError as exc:
        raise UnsupportedArchError(f"MLA_JIT_ARCH={override}: {exc}") from None
    if gpu.can_run_cubin_for(tuning):
        return ArchPair(tuning, tuning)
    if tuning.major < gpu.major and gpu.name in SUPPORTED_ARCHS:
        # An older family on a newer GPU: its code uses only older features; build it for this GPU.
        return ArchPair(tuning, gpu)
    raise UnsupportedArchError(
        f"MLA_JIT_ARCH={override} asks for {tuning.name} kernels, which cannot run on GPU "
        f"{device_index} ({gpu.name})")


def resolve_for_build(arch_text: str | None) -> ArchPair:
    """Tuning and target arch for a GPU-free build (prewarm). Default: the override, else sm_90a."""
    text = arch_text or env.arch_override() or "sm_90a"
    arch = parse_arch(text)
    return ArchPair(arch, arch)

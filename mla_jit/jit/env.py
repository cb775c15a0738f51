"""Every environment variable mla_jit reads, with typed accessors.

Values are read live (on each call) so tests and users can change them at run time. This is
the only module that touches os.environ for configuration; the README's table mirrors ENV_VARS.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str
    changes_binary: bool = False


ENV_VARS: dict[str, EnvVar] = {v.name: v for v in [
    EnvVar("MLA_JIT_CACHE_DIR", "~/.cache/mla_jit",
           "Writable cache root (created 0700). Falls back to a private temporary root if unwritable."),
    EnvVar("MLA_JIT_READONLY_CACHE_DIRS", "",
           "Extra read-only cache roots searched after the writable one (os.pathsep-separated)."),
    EnvVar("MLA_JIT_DISABLE_CACHE", "0",
           "1: never read or write the disk cache; compile once per process."),
    EnvVar("MLA_JIT_OFFLINE", "0",
           "1: never compile; a missing kernel raises OfflineCacheMissError with the prewarm command."),
    EnvVar("MLA_JIT_COMPILER", "nvrtc", "Compiler: nvrtc or nvcc.", changes_binary=True),
    EnvVar("MLA_JIT_NVCC", "", "Path of nvcc (default: $CUDA_HOME/bin/nvcc, then PATH)."),
    EnvVar("MLA_JIT_ARCH", "",
           "Architecture override, e.g. sm_90a, sm_89, sm_80: selects that kernel family and target."),
    EnvVar("MLA_JIT_LOG_LEVEL", "WARNING", "Level of the 'mla_jit' logger (DEBUG, INFO, ...)."),
    EnvVar("MLA_JIT_DEBUG", "0",
           "1: keep generated sources and compiler scratch, log every compile command."),
    EnvVar("MLA_JIT_PTXAS_VERBOSE", "0",
           "1: pass -v to ptxas and log its resource report (registers, spills, smem)."),
    EnvVar("MLA_JIT_LINEINFO", "0", "1: compile with -lineinfo (for profilers and sanitizers).",
           changes_binary=True),
    EnvVar("MLA_JIT_TRACE", "0",
           "1: compile kernels with per-CTA timestamps at a few events (bench/trace_decode.py reads them).",
           changes_binary=True),
    EnvVar("MLA_JIT_LOCK_TIMEOUT", "900", "Seconds to wait for another process compiling the same kernel."),
    EnvVar("MLA_JIT_SM90_DECODE_SCHEDULE", "auto",
           "sm90 split-KV schedule: auto (ws for small calls, ws_unfused otherwise), ws (one S/softmax warpgroup, two "
           "P V warpgroups, splits merged in the kernel), ws_unfused (the same with a separate combine "
           "kernel), baseline (the first two-warpgroup kernel, kept for comparison) or seesaw "
           "(experimental: two S/softmax warpgroups taking turns, Q in smem, 2 stages)."),
    EnvVar("MLA_JIT_SM90_CLUSTER", "auto",
           "Row tiles per thread block cluster of the sm90 ws kernels (they multicast each KV tile to "
           "the cluster): auto or 2 (2 where the row tile count is even and every cluster is resident "
           "at once) or 1."),
]}


def _raw(name: str) -> str:
    return os.environ.get(name, ENV_VARS[name].default)


def _flag(name: str) -> bool:
    return _raw(name).strip().lower() in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    return Path(os.path.expanduser(_raw("MLA_JIT_CACHE_DIR")))


def readonly_cache_dirs() -> list[Path]:
    raw = _raw("MLA_JIT_READONLY_CACHE_DIRS")
    return [Path(os.path.expanduser(p)) for p in raw.split(os.pathsep) if p.strip()]


def cache_disabled() -> bool:
    return _flag("MLA_JIT_DISABLE_CACHE")


def offline() -> bool:
    return _flag("MLA_JIT_OFFLINE")


def compiler_name() -> str:
    name = _raw("MLA_JIT_COMPILER").strip().lower()
    if name not in ("nvrtc", "nvcc"):
        from ..errors import MlaJitError
        raise MlaJitError(f"MLA_JIT_COMPILER: expected 'nvrtc' or 'nvcc', got {name!r}")
    return name


def nvcc_path() -> str:
    return _raw("MLA_JIT_NVCC").strip()


def arch_override() -> str:
    return _raw("MLA_JIT_ARCH").strip()


def log_level() -> str:
    return _raw("MLA_JIT_LOG_LEVEL").strip().upper()


def debug() -> bool:
    return _flag("MLA_JIT_DEBUG")


def ptxas_verbose() -> bool:
    return _flag("MLA_JIT_PTXAS_VERBOSE")


def lineinfo() -> bool:
    return _flag("MLA_JIT_LINEINFO")


def trace() -> bool:
    return _flag("MLA_JIT_TRACE")


def lock_timeout() -> float:
    return float(_raw("MLA_JIT_LOCK_TIMEOUT"))


def effective() -> dict[str, str]:
    """Every variable with its effective value (for `mla-jit info`)."""
    return {name: _raw(name) for name in ENV_VARS}


SM90_DECODE_SCHEDULES = ("auto", "ws", "ws_unfused", "baseline", "seesaw")


def _choice(var: str, choices: tuple[str, ...]) -> str:
    name = _raw(var).strip().lower()
    if name not in choices:
        from ..errors import MlaJitError
        raise MlaJitError(f"{var}: expected one of {choices}, got {name!r}")
    return name


def sm90_decode_schedule() -> str:
    return _choice("MLA_JIT_SM90_DECODE_SCHEDULE", SM90_DECODE_SCHEDULES)


SM90_CLUSTER_CHOICES = ("auto", "1", "2")


def sm90_cluster() -> str:
    return _choice("MLA_JIT_SM90_CLUSTER", SM90_CLUSTER_CHOICES)


_PLAN_VARS = ("MLA_JIT_ARCH", "MLA_JIT_SM90_DECODE_SCHEDULE", "MLA_JIT_SM90_CLUSTER")


# os.environ.get costs ~0.8 us for an unset variable (it raises and catches KeyError inside);
# the mapping behind os.environ, with pre-encoded keys, answers in ~0.04 us.
try:
    _ENV_DATA = os.environ._data
    _PLAN_KEYS = tuple(os.environ.encodekey(name) for name in _PLAN_VARS)
except AttributeError:  # pragma: no cover - a Python without os._Environ's internals
    _ENV_DATA, _PLAN_KEYS = os.environ, _PLAN_VARS
_ARCH_KEY, _SCHEDULE_KEY, _CLUSTER_KEY = _PLAN_KEYS


def plan_inputs() -> tuple[object, object, object]:
    """Raw values of the variables that pick a kernel, for ops' warm-path plan keys: no parsing
    here (it is on every call); the parsed accessors above run when a plan is built."""
    get = _ENV_DATA.get
    return get(_ARCH_KEY), get(_SCHEDULE_KEY), get(_CLUSTER_KEY)

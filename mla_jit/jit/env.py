"""The one registry of environment variables mla_jit reads, with typed accessors.

Values are read live (on each call) so tests and users can change them at run time. The core's
variables are declared here; a kernel family declares its own knobs with `declare()` in its config
module, so the registry is complete once `mla_jit.runtimes` is imported. This is the only module
that reads os.environ for configuration; the README's table is checked against ENV_VARS.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ConfigError


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str
    changes_binary: bool = False
    choices: tuple[str, ...] | None = None   # the accepted values (lower case), None for free text
    owner: str = "core"                      # "core" or the declaring module


ENV_VARS: dict[str, EnvVar] = {}


def declare(name: str, default: str, help: str, *, changes_binary: bool = False,
            choices: tuple[str, ...] | None = None, owner: str = "core") -> EnvVar:
    """Register a variable (idempotent for an identical declaration) and return it."""
    var = EnvVar(name, default, help, changes_binary, choices, owner)
    known = ENV_VARS.get(name)
    if known is not None and known != var:
        raise ConfigError(f"environment variable {name} declared twice, differently ({known.owner}, {owner})")
    ENV_VARS[name] = var
    return var


declare("MLA_JIT_CACHE_DIR", "~/.cache/mla_jit",
        "Writable cache root (created 0700). If it is unusable, ops warn once and use one private per-user "
        "root under the system temporary directory; `mla-jit prewarm` fails instead, naming the directory.")
declare("MLA_JIT_READONLY_CACHE_DIRS", "",
        "Extra read-only cache roots searched after the writable one (`os.pathsep`-separated), e.g. a "
        "prewarmed cache baked into an image or on NFS. A missing one is skipped with one warning.")
declare("MLA_JIT_DISABLE_CACHE", "0", "`1`: never read or write the disk cache; compile once per process.",
        choices=("0", "1"))
declare("MLA_JIT_OFFLINE", "0",
        "`1`: ops never compile; a missing kernel raises `OfflineCacheMissError` naming the kernel, the roots "
        "searched and the exact `mla-jit prewarm` command that builds it. `mla-jit prewarm` compiles regardless.",
        choices=("0", "1"))
declare("MLA_JIT_COMPILER", "nvrtc", "`nvrtc` or `nvcc`. Part of the cache key.", changes_binary=True,
        choices=("nvrtc", "nvcc"))
declare("MLA_JIT_NVCC", "",
        "Path of nvcc (default: `$CUDA_HOME/bin/nvcc`, then `PATH`, then `/usr/local/cuda/bin/nvcc`).")
declare("MLA_JIT_ARCH", "",
        "Architecture override (`sm_90a`, `sm_89`, `sm_86`, `sm_80`): selects that kernel family and tuning. "
        "On a newer GPU the cubin still targets the GPU present (an sm_80 cubin cannot run on sm_90).")
declare("MLA_JIT_LOG_LEVEL", "WARNING", "Level of the `mla_jit` logger.")
declare("MLA_JIT_DEBUG", "0", "`1`: log every compile command at DEBUG, keep nvcc's scratch directory.",
        choices=("0", "1"))
declare("MLA_JIT_PTXAS_VERBOSE", "0",
        "`1`: pass `-v` to ptxas and log its resource report (registers, spills, smem).", choices=("0", "1"))
declare("MLA_JIT_LINEINFO", "0", "`1`: compile with `-lineinfo` (profilers, compute-sanitizer). Part of the cache key.",
        changes_binary=True, choices=("0", "1"))
declare("MLA_JIT_TRACE", "0",
        "`1`: compile kernels with the timestamp tables their families define, for the `bench/trace_*.py` "
        "scripts (bench/NOTES.md says what each records). Part of the cache key.", changes_binary=True,
        choices=("0", "1"))
declare("MLA_JIT_LOCK_TIMEOUT", "900",
        "Seconds to wait for another process compiling the same kernel before raising `CacheError`.")


def markdown_table() -> str:
    """The README's table of every declared variable (tests check the README against it)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for var in ENV_VARS.values():
        default = f"`{var.default}`" if var.default else "(empty)"
        rows.append(f"| `{var.name}` | {default} | {var.help} |")
    return "\n".join(rows) + "\n"


def raw(name: str) -> str:
    """The variable's value as set, else its default (the name must be declared)."""
    return os.environ.get(name, ENV_VARS[name].default)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def flag(name: str) -> bool:
    value = raw(name).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw(name)!r}: expected 1 or 0")


def choice(name: str) -> str:
    """A declared variable with choices: its value, lower case, checked against them."""
    var = ENV_VARS[name]
    value = raw(name).strip().lower()
    if var.choices is not None and value not in var.choices:
        raise ConfigError(f"{name}={raw(name)!r}: expected one of {', '.join(var.choices)}")
    return value


def cache_dir() -> Path:
    return Path(os.path.expanduser(raw("MLA_JIT_CACHE_DIR")))


def readonly_cache_dirs() -> list[Path]:
    return [Path(os.path.expanduser(p)) for p in raw("MLA_JIT_READONLY_CACHE_DIRS").split(os.pathsep) if p.strip()]


def cache_disabled() -> bool:
    return flag("MLA_JIT_DISABLE_CACHE")


def offline() -> bool:
    return flag("MLA_JIT_OFFLINE")


def compiler_name() -> str:
    return choice("MLA_JIT_COMPILER")


def nvcc_path() -> str:
    return raw("MLA_JIT_NVCC").strip()


def arch_override() -> str:
    return raw("MLA_JIT_ARCH").strip()


def log_level() -> str:
    return raw("MLA_JIT_LOG_LEVEL").strip().upper()


def debug() -> bool:
    return flag("MLA_JIT_DEBUG")


def ptxas_verbose() -> bool:
    return flag("MLA_JIT_PTXAS_VERBOSE")


def lineinfo() -> bool:
    return flag("MLA_JIT_LINEINFO")


def trace() -> bool:
    return flag("MLA_JIT_TRACE")


def lock_timeout() -> float:
    text = raw("MLA_JIT_LOCK_TIMEOUT")
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also NaN
        raise ConfigError(f"MLA_JIT_LOCK_TIMEOUT={text!r}: expected a number of seconds >= 0")
    return seconds


def effective() -> dict[str, str]:
    """Every declared variable with its effective value (for `mla-jit info`)."""
    return {name: raw(name) for name in ENV_VARS}


def raw_reader(*names: str) -> Callable[[], tuple]:
    """A function returning the raw values of `names` (None where unset), for warm-path plan keys:
    no parsing there (it runs on every call); the parsed accessors run when a plan is built.
    os.environ.get costs ~0.8 us for an unset variable (it raises and catches KeyError inside); the
    mapping behind os.environ, with pre-encoded keys, answers in ~0.04 us."""
    for name in names:
        if name not in ENV_VARS:
            raise ConfigError(f"environment variable {name} is not declared")
    try:
        data = os.environ._data
        keys = tuple(os.environ.encodekey(name) for name in names)
    except AttributeError:  # pragma: no cover - a Python without os._Environ's internals
        data, keys = os.environ, names
    get = data.get
    if len(keys) == 1:
        (a,) = keys
        return lambda: (get(a),)
    if len(keys) == 2:
        a, b = keys
        return lambda: (get(a), get(b))
    if len(keys) == 3:
        a, b, c = keys
        return lambda: (get(a), get(b), get(c))
    return lambda: tuple([get(k) for k in keys])

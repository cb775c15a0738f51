"""Where the headers live: ours (package data), CUTLASS/CuTe, CCCL and the CUDA runtime headers."""
from __future__ import annotations

import functools
import os
from pathlib import Path

from ..errors import MlaJitError

PACKAGE_DIR = Path(__file__).resolve().parent.parent
INCLUDE_DIR = PACKAGE_DIR / "include"
TEMPLATES_DIR = PACKAGE_DIR / "templates"


@functools.lru_cache(maxsize=None)
def cutlass_include_dir() -> Path:
    try:
        import cutlass_library
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise MlaJitError("nvidia-cutlass is not installed: pip install nvidia-cutlass") from exc
    path = Path(cutlass_library.source_path) / "include"
    if not (path / "cute").is_dir():
        raise MlaJitError(f"CUTLASS headers not found under {path}")
    return path


def _cuda_home() -> Path | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value and Path(value).is_dir():
            return Path(value)
    for candidate in ("/usr/local/cuda",):
        if Path(candidate).is_dir():
            return Path(candidate)
    return None


def _pathfinder_header_dir(name: str) -> Path | None:
    try:
        from cuda import pathfinder
        found = pathfinder.find_nvidia_header_directory(name)
    except Exception:  # pathfinder raises on odd layouts; fall back to CUDA_HOME
        return None
    return Path(found) if found else None


@functools.lru_cache(maxsize=None)
def cccl_include_dir() -> Path:
    found = _pathfinder_header_dir("cccl")
    if found is None and (home := _cuda_home()) is not None:
        for candidate in (home / "include" / "cccl", home / "include"):
            if (candidate / "cuda" / "std" / "version").is_file():
                found = candidate
                break
    if found is None:
        raise MlaJitError("CCCL headers (cuda/std/...) not found: pip install nvidia-cuda-cccl")
    return found


@functools.lru_cache(maxsize=None)
def cuda_include_dir() -> Path:
    found = _pathfinder_header_dir("cudart")
    if found is None and (home := _cuda_home()) is not None and (home / "include" / "cuda_runtime_api.h").is_file():
        found = home / "include"
    if found is None:
        raise MlaJitError("CUDA runtime headers not found: pip install nvidia-cuda-runtime")
    return found


@functools.lru_cache(maxsize=1)
def third_party_version_files() -> tuple[tuple[str, Path], ...]:
    """(label, file) of the CUTLASS, CCCL and CUDA runtime header versions: the cache key hashes
    these files (each stands for its whole header tree) under their labels, never their paths."""
    return (("cutlass/version.h", cutlass_include_dir() / "cutlass" / "version.h"),
            ("cuda/std/__cccl/version.h", cccl_include_dir() / "cuda" / "std" / "__cccl" / "version.h"),
            ("cuda_runtime_api.h", cuda_include_dir() / "cuda_runtime_api.h"))


def include_dirs(with_toolkit_headers: bool) -> list[Path]:
    """Include search path. NVRTC needs the CCCL and CUDA runtime headers passed explicitly;
    nvcc brings its own (and rejects CCCL headers of another toolkit release)."""
    dirs = [INCLUDE_DIR, cutlass_include_dir()]
    if with_toolkit_headers:
        cccl = cccl_include_dir()
        dirs += [cccl, cuda_include_dir()]
        if cccl.name == "cccl":  # CUTLASS under NVRTC includes <cccl/cuda/std/...>
            dirs.append(cccl.parent)
    return list(dict.fromkeys(dirs))

"""Content-only cache keys.

key = sha256(rendered source, entry points, digest of every header the source can include,
compiler identity, binary-affecting flags, target and tuning arch, key schema). No filesystem
path enters the key, so a relocated package or a copied cache root still hits.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from ..jit import paths

KEY_SCHEMA = "mla_jit-cache-v1"
_HEADER_SUFFIXES = (".cuh", ".h", ".hpp", ".inl")


def _hash_tree(root: Path, h) -> None:
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _HEADER_SUFFIXES):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")


def _third_party_versions() -> bytes:
    """CUTLASS, CCCL and CUDA runtime header versions: a version file stands for its whole tree."""
    parts = []
    for base, rel in ((paths.cutlass_include_dir(), "cutlass/version.h"),
                      (paths.cccl_include_dir(), "cuda/std/__cccl/version.h"),
                      (paths.cuda_include_dir(), "cuda_runtime_api.h")):
        f = base / rel
        parts.append(rel.encode() + b"=" + (hashlib.sha256(f.read_bytes()).hexdigest().encode() if f.is_file()
                                          else b"missing"))
    return b";".join(parts)


@functools.lru_cache(maxsize=None)
def header_digest(include_dir: Path | None = None) -> str:
    """Digest of our headers (every file, recursively) plus third-party header versions.

    Cached per process: installed headers do not change under a running process.
    """
    h = hashlib.sha256()
    _hash_tree(include_dir or paths.INCLUDE_DIR, h)
    h.update(_third_party_versions())
    return h.hexdigest()


def compute_key(*, source: str, entry_points: tuple[str, ...], compiler_identity: str,
                flags: tuple[str, ...], target_arch: str, tuning_arch: str, headers: str) -> str:
    h = hashlib.sha256()
    for part in (KEY_SCHEMA, source, ",".join(entry_points), compiler_identity, " ".join(flags),
                 target_arch, tuning_arch, headers):
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()[:40]

"""Content-only cache keys.

key = sha256(rendered source, entry points, digest of every header the source can include,
compiler identity, binary-affecting flags, target and tuning arch, key schema). No filesystem
path enters the key, so a relocated package or a copied cache root still hits.

This package knows nothing of the JIT core or of kernel families: the include directory and the
third-party version files are handed in by the caller (jit/build.py).
"""
from __future__ import annotations

import functools
import hashlib
import posixpath
import re
from pathlib import Path
from typing import Iterable

KEY_SCHEMA = "mla_jit-cache-v1"
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


@functools.lru_cache(maxsize=None)
def _own_header(include_dir: Path, rel: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """(sha256, includes as (delimiter, name)) of one of our headers, or None if `rel` is not ours
    (CUTLASS, CCCL)."""
    path = include_dir / rel
    if not path.is_file():
        return None
    text = path.read_text()
    return hashlib.sha256(text.encode()).hexdigest(), tuple(_INCLUDE_RE.findall(text))


def _resolve(include_dir: Path, includer: str | None, delim: str, name: str) -> str:
    """The include-dir-relative path the compiler opens for `#include <delim>name` in `includer`
    (None: the rendered source): a quoted name is looked up next to its includer first."""
    if delim == '"' and includer is not None:
        sibling = posixpath.normpath(posixpath.join(posixpath.dirname(includer), name))
        if (include_dir / sibling).is_file():
            return sibling
    return name


def _reachable_headers(source: str, include_dir: Path) -> list[tuple[str, str]]:
    """(relative path, sha256) of every header of ours that `source` includes, transitively."""
    seen: dict[str, str] = {}
    stack = [_resolve(include_dir, None, d, n) for d, n in _INCLUDE_RE.findall(source)]
    while stack:
        rel = stack.pop()
        if rel in seen:
            continue
        info = _own_header(include_dir, rel)
        if info is None:
            continue
        seen[rel] = info[0]
        stack.extend(_resolve(include_dir, rel, d, n) for d, n in info[1])
    return sorted(seen.items())


ThirdParty = tuple[tuple[str, Path], ...]


@functools.lru_cache(maxsize=None)
def _third_party_digest(files: ThirdParty) -> str:
    """Digest of third-party header versions, given as (label, version file) pairs (e.g. CUTLASS's
    cutlass/version.h): a version file stands for its whole tree."""
    parts = []
    for label, f in files:
        parts.append(label.encode() + b"=" + (hashlib.sha256(f.read_bytes()).hexdigest().encode() if f.is_file()
                                            else b"missing"))
    return hashlib.sha256(b";".join(parts)).hexdigest()


@functools.lru_cache(maxsize=1024)
def _header_digest(source: str, include_dir: Path, third_party: ThirdParty) -> str:
    h = hashlib.sha256()
    for rel, digest in _reachable_headers(source, include_dir):
        h.update(f"{rel}={digest};".encode())
    h.update(_third_party_digest(third_party).encode())
    return h.hexdigest()


def header_digest(source: str, include_dir: Path, third_party: Iterable[tuple[str, Path]] = ()) -> str:
    """Digest of every header under `include_dir` that `source` can include (recursively, by content)
    plus the third-party version files ((label, path) pairs; the label, not the path, enters the
    digest). Header contents and digests are memoized per process: `clear_memo()` forgets them."""
    return _header_digest(source, Path(include_dir), tuple((str(k), Path(v)) for k, v in third_party))


def clear_memo() -> None:
    """Forget header contents and digests computed so far (tests that edit headers call this)."""
    _own_header.cache_clear()
    _third_party_digest.cache_clear()
    _header_digest.cache_clear()


def compute_key(*, source: str, entry_points: tuple[str, ...], compiler_identity: str,
                flags: tuple[str, ...], target_arch: str, tuning_arch: str, headers: str) -> str:
    h = hashlib.sha256()
    for part in (KEY_SCHEMA, source, ",".join(entry_points), compiler_identity, " ".join(flags),
                 target_arch, tuning_arch, headers):
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()[:40]

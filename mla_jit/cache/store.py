"""The on-disk store: `<root>/<arch>/<kernel-name>-<key>/{kernel.cu, kernel.cubin, manifest.json}`.

- Publish is atomic: files are written and fsynced in a staging dir inside the same root, the
  manifest last, then the dir is renamed into place. A reader never sees half an entry, and a
  process killed mid-write leaves only a staging dir that later publishes sweep away.
- Every load checks the manifest and the cubin's sha256; a corrupt, truncated or empty entry
  is reported as a miss (and replaced by the next compile), never trusted.
- One compile per key across processes: `key_lock` is an fcntl lock, released by the kernel
  when its holder dies, so a killed process never leaves a lock that blocks the next one.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import filelock

from ..errors import CacheError
from ..jit import env
from ..log import logger

MANIFEST = "manifest.json"
CUBIN = "kernel.cubin"
SOURCE = "kernel.cu"
_STAGING = ".staging"
_LOCKS = ".locks"
_STALE_STAGING_SECONDS = 3600.0


@dataclass(frozen=True)
class CacheRoot:
    path: Path
    writable: bool


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    root: CacheRoot
    manifest: dict
    cubin: bytes


_fallback_root: Path | None = None
_warned_unwritable: set[str] = set()


def _ensure_writable(path: Path) -> bool:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def writable_root() -> CacheRoot:
    """The writable root; an unwritable one falls back (with one warning) to a private temp root."""
    global _fallback_root
    wanted = env.cache_dir()
    if _ensure_writable(wanted):
        return CacheRoot(wanted, True)
    if str(wanted) not in _warned_unwritable:
        _warned_unwritable.add(str(wanted))
        logger.warning("mla_jit cache dir %s is not writable; using a private temporary cache "
                       "(set MLA_JIT_CACHE_DIR to a writable directory to keep kernels)", wanted)
    if _fallback_root is None or not _fallback_root.is_dir():
        _fallback_root = Path(tempfile.mkdtemp(prefix="mla_jit-cache-"))
    return CacheRoot(_fallback_root, True)


def all_roots() -> list[CacheRoot]:
    roots = [writable_root()]
    roots += [CacheRoot(p, False) for p in env.readonly_cache_dirs() if p.is_dir()]
    return roots


def entry_dir(root: Path, arch: str, name: str, key: str) -> Path:
    return root / arch / f"{name}-{key}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_entry(root: CacheRoot, arch: str, name: str, key: str) -> CacheEntry | None:
    """The verified entry for `key` under `root`, or None (missing or failing verification)."""
    path = entry_dir(root.path, arch, name, key)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        cubin = (path / CUBIN).read_bytes()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("mla_jit cache entry %s is unreadable (%s); it will be rebuilt", path, exc)
        return None
    if (manifest.get("key") != key or not cubin or manifest.get("cubin_size") != len(cubin)
            or manifest.get("cubin_sha256") != sha256(cubin)):
        logger.warning("mla_jit cache entry %s failed its checksum; it will be rebuilt", path)
        return None
    return CacheEntry(path, root, manifest, cubin)


def lookup(arch: str, name: str, key: str, roots: list[CacheRoot] | None = None) -> CacheEntry | None:
    for root in roots if roots is not None else all_roots():
        entry = read_entry(root, arch, name, key)
        if entry is not None:
            return entry
    return None


def key_lock(root: CacheRoot, arch: str, name: str, key: str) -> filelock.BaseFileLock:
    lock_dir = root.path / arch / _LOCKS
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return filelock.FileLock(str(lock_dir / f"{name}-{key}.lock"), timeout=env.lock_timeout())


def acquire(lock: filelock.BaseFileLock, what: str) -> None:
    try:
        lock.acquire()
    except filelock.Timeout as exc:
        raise CacheError(f"timed out after {env.lock_timeout():.0f} s waiting for another process "
                         f"compiling {what} (lock {lock.lock_file}); raise MLA_JIT_LOCK_TIMEOUT "
                         "or check for a hung compile") from exc


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sweep_stale_staging(staging_root: Path) -> None:
    now = time.time()
    for child in staging_root.iterdir() if staging_root.is_dir() else ():
        try:
            if now - child.stat().st_mtime > _STALE_STAGING_SECONDS:
                shutil.rmtree(child, ignore_errors=True)
        except OSError:
            pass


def publish(root: CacheRoot, arch: str, name: str, key: str, *, source: str, cubin: bytes,
            manifest: dict) -> CacheEntry:
    """Atomically install an entry. Call with the key's lock held."""
    final = entry_dir(root.path, arch, name, key)
    staging_root = root.path / arch / _STAGING
    try:
        staging_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        _sweep_stale_staging(staging_root)
        staging = staging_root / f"{name}-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(mode=0o700)
        manifest = {**manifest, "key": key, "cubin_sha256": sha256(cubin), "cubin_size": len(cubin)}
        _write_synced(staging / SOURCE, source.encode())
        _write_synced(staging / CUBIN, cubin)
        _write_synced(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        _fsync_dir(staging)
        if final.exists():  # a corrupt entry (a valid one is never recompiled): move it aside first
            trash = staging_root / f"trash-{name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(staging, final)
        _fsync_dir(final.parent)
    except OSError as exc:
        raise CacheError(f"could not publish kernel {name} into {root.path}: {exc}") from exc
    return CacheEntry(final, root, manifest, cubin)


def iter_entries(roots: list[CacheRoot] | None = None):
    """Yield (root, arch, entry dir, manifest or None) for every entry in the given roots."""
    for root in roots if roots is not None else all_roots():
        if not root.path.is_dir():
            continue
        for arch_dir in sorted(p for p in root.path.iterdir() if p.is_dir()):
            for entry in sorted(p for p in arch_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
                try:
                    manifest = json.loads((entry / MANIFEST).read_text())
                except (OSError, ValueError):
                    manifest = None
                yield root, arch_dir.name, entry, manifest


def clear(root: CacheRoot) -> int:
    """Remove every entry (and staging/lock dirs) under a writable root; returns entries removed."""
    removed = 0
    if not root.path.is_dir():
        return 0
    for arch_dir in [p for p in root.path.iterdir() if p.is_dir()]:
        for child in list(arch_dir.iterdir()):
            if child.is_dir() and not child.name.startswith("."):
                removed += 1
            if child.name != _LOCKS:  # lock files may be held by live processes
                shutil.rmtree(child, ignore_errors=True)
    return removed

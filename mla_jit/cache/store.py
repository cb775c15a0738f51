"""The on-disk store: `<root>/<arch>/<kernel-name>-<key>/{kernel.cu, kernel.cubin, manifest.json}`.

- Publish is atomic: files are written and fsynced in a staging dir inside the same root, the
  manifest last, then the dir is renamed into place. A reader never sees half an entry, and a
  process killed mid-write leaves only a staging dir that later publishes sweep away.
- Every load checks the manifest and the cubin's sha256; a corrupt, truncated or empty entry
  is reported as a miss (and replaced by the next compile), never trusted.
- One compile per key across processes: `key_lock` is an fcntl lock, released by the kernel
  when its holder dies, so a killed process never leaves a lock that blocks the next one.

Roots, the lock timeout and every other setting are arguments: this package reads no environment
variable and knows nothing of the JIT core (jit/build.py decides which roots to use).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import filelock

from ..errors import CacheError
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


def _describe(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def root_problem(path: Path) -> str | None:
    """Why `path` cannot serve as a writable cache root, or None if it can (it is a writable
    directory, or a missing one that could be created). Creates nothing (for `mla-jit list`)."""
    probe = Path(path)
    if probe.exists():
        if not probe.is_dir():
            return f"{probe} is not a directory"
        if not os.access(probe, os.W_OK | os.X_OK):
            return f"{probe} is not writable"
        return None
    parent = probe.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{probe} does not exist and {parent} is not writable"
    return None


_verified: set[str] = set()


def open_root(path: Path) -> CacheRoot:
    """`path` as a writable cache root: created (0700) if missing and checked by writing a probe file
    (once per process and path). Raises CacheError naming the directory and why it is unusable."""
    path = Path(path)
    if str(path) in _verified and path.is_dir():
        return CacheRoot(path, True)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        detail = exc.strerror or str(exc)
        if exc.filename and str(exc.filename) != str(path):
            detail += f": {exc.filename}"
        reason = root_problem(path) or f"cannot create or write it ({detail})"
        err = CacheError(f"cache directory {path} is not usable: {reason}")
        err.path, err.reason = path, reason
        raise err from None
    _verified.add(str(path))
    return CacheRoot(path, True)


def private_temp_root_path() -> Path:
    """Where `private_temp_root` lives (nothing is created)."""
    return Path(tempfile.gettempdir()) / f"mla_jit-cache-{os.getuid()}"


def private_temp_root() -> CacheRoot:
    """The one private fallback root of this user, `<tmp>/mla_jit-cache-<uid>`, shared by every
    process (so a fallback does not compile again in each). Created 0700; refused (CacheError) if it
    is a symlink, belongs to another user or is open to others."""
    uid = os.getuid()
    path = private_temp_root_path()
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise CacheError(f"fallback cache directory {path} is not usable: {_describe(exc)}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"fallback cache directory {path} is not a directory (a symlink or a file); remove it")
    if st.st_uid != uid:
        raise CacheError(f"fallback cache directory {path} belongs to uid {st.st_uid}, not {uid}; "
                         "set MLA_JIT_CACHE_DIR to a writable directory")
    if st.st_mode & 0o077:
        raise CacheError(f"fallback cache directory {path} is open to other users "
                         f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 700 it or remove it")
    return open_root(path)


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


def lookup(arch: str, name: str, key: str, roots: list[CacheRoot]) -> CacheEntry | None:
    """The first verified entry for `key` in `roots`, searched in order."""
    for root in roots:
        entry = read_entry(root, arch, name, key)
        if entry is not None:
            return entry
    return None


def key_lock(root: CacheRoot, arch: str, name: str, key: str, timeout: float) -> filelock.BaseFileLock:
    """The per-key lock; `acquire` waits at most `timeout` seconds for it."""
    lock_dir = root.path / arch / _LOCKS
    try:
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheError(f"cache directory {root.path} is not usable: {_describe(exc)}") from None
    return filelock.FileLock(str(lock_dir / f"{name}-{key}.lock"), timeout=timeout)


def acquire(lock: filelock.BaseFileLock, what: str) -> None:
    try:
        lock.acquire()
    except filelock.Timeout as exc:
        raise CacheError(f"timed out after {lock.timeout:.0f} s waiting for another process "
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


def iter_entries(roots: list[CacheRoot]):
    """Yield (root, arch, entry dir, manifest or None) for every entry in the given roots."""
    for root in roots:
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

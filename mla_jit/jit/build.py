"""Source -> cubin: key, in-process memo, cache lookup, locked compile, atomic publish.

The only place that decides whether to compile. Kernel families hand in a `KernelSource`;
they never touch the cache or the compilers directly.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..cache import key as cache_key
from ..cache import store
from ..errors import CacheError, CompileError, OfflineCacheMissError
from ..log import configure_from_env, logger
from . import env, paths
from .arch import ArchPair
from .compiler import Compiler, get_compiler


@dataclass(frozen=True)
class KernelSource:
    name: str                       # filesystem-safe, unique per configuration
    source: str                     # the rendered translation unit
    entry_points: tuple[str, ...]   # extern "C" kernel names in the cubin
    arch: ArchPair
    prewarm_command: str            # the CLI command that builds exactly this kernel


@dataclass(frozen=True)
class Binary:
    name: str
    key: str
    target_arch: str
    cubin: bytes
    entry_points: tuple[str, ...]
    origin: str                     # how this process got it: "compiled" or "disk"
    path: Path | None
    compiler: str
    log: str
    compile_seconds: float


_memo: dict[str, Binary] = {}
_memo_lock = threading.Lock()
_warned: set[str] = set()


def _warn_once(what: str, message: str, *args) -> None:
    if what not in _warned:
        _warned.add(what)
        logger.warning(message, *args)


def target_root(*, fallback: bool = True) -> store.CacheRoot:
    """The writable root: MLA_JIT_CACHE_DIR, created 0700. If it is unusable, `fallback=True` (ops)
    warns once and uses this user's one private temporary root; `fallback=False` (prewarm) raises
    CacheError naming the directory and why."""
    wanted = env.cache_dir()
    try:
        return store.open_root(wanted)
    except CacheError as exc:
        if not fallback:
            raise CacheError(f"cache directory {wanted} (MLA_JIT_CACHE_DIR) is not usable: "
                             f"{getattr(exc, 'reason', exc)}; set MLA_JIT_CACHE_DIR to a writable directory") from None
        root = store.private_temp_root()
        _warn_once(f"unwritable:{wanted}", "mla_jit %s; using the private cache %s instead (set MLA_JIT_CACHE_DIR "
                   "to a writable directory to keep kernels there)", exc, root.path)
        return root


def readonly_roots() -> list[store.CacheRoot]:
    """MLA_JIT_READONLY_CACHE_DIRS that exist (a missing entry is skipped with one warning per path)."""
    roots = []
    for path in env.readonly_cache_dirs():
        if path.is_dir():
            roots.append(store.CacheRoot(path, False))
        else:
            _warn_once(f"readonly:{path}", "MLA_JIT_READONLY_CACHE_DIRS entry %s is not a directory; skipped",
                       path)
    return roots


def cache_roots(*, fallback: bool = True) -> list[store.CacheRoot]:
    """Every root a lookup searches, in order: the writable one, then the read-only ones (and, when
    MLA_JIT_CACHE_DIR exists but is not writable, that directory, read-only, before them)."""
    roots = [target_root(fallback=fallback)]
    wanted = env.cache_dir()
    if roots[0].path != wanted and wanted.is_dir():
        roots.append(store.CacheRoot(wanted, False))
    return roots + [r for r in readonly_roots() if r.path not in {x.path for x in roots}]


def kernel_key(src: KernelSource, compiler: Compiler) -> str:
    return cache_key.compute_key(
        source=src.source, entry_points=src.entry_points, compiler_identity=compiler.identity(),
        flags=compiler.key_flags(src.arch.target), target_arch=src.arch.target.name,
        tuning_arch=src.arch.tuning.name,
        headers=cache_key.header_digest(src.source, paths.INCLUDE_DIR, paths.third_party_version_files()))


def _write_failed_source(src: KernelSource, key: str) -> Path | None:
    try:
        root = target_root().path / src.arch.target.name / ".failed"
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = root / f"{src.name}-{key}.cu"
        path.write_text(src.source)
        return path
    except (OSError, CacheError) as exc:
        logger.warning("could not keep the failed source of %s: %s", src.name, exc)
        return None


def _compile(src: KernelSource, key: str, compiler: Compiler) -> tuple[bytes, str, float]:
    try:
        result = compiler.compile(src.source, src.name, src.arch.target, None)
    except CompileError as exc:
        path = _write_failed_source(src, key)
        raise CompileError(src.name, exc.compiler, exc.log, path, exc.command) from None
    if env.ptxas_verbose() and result.log:
        logger.info("%s compile log:\n%s", src.name, result.log)
    logger.info("compiled %s with %s in %.2f s", src.name, compiler.name, result.seconds)
    return result.cubin, result.log, result.seconds


def _from_entry(entry: store.CacheEntry, src: KernelSource, key: str, origin: str) -> Binary:
    m = entry.manifest
    return Binary(src.name, key, src.arch.target.name, entry.cubin, src.entry_points, origin, entry.path,
                  m.get("compiler", "?"), m.get("log", ""), float(m.get("compile_seconds", 0.0)))


def lookup(src: KernelSource, compiler: Compiler | None = None, *, fallback: bool = True) -> Binary | None:
    """The cached binary for `src` (in-process memo, then every cache root), or None. Never compiles."""
    compiler = compiler or get_compiler()
    key = kernel_key(src, compiler)
    if (hit := _memo.get(f"{src.arch.target.name}/{key}")) is not None:
        return hit
    if env.cache_disabled():
        return None
    entry = store.lookup(src.arch.target.name, src.name, key, cache_roots(fallback=fallback))
    return None if entry is None else _from_entry(entry, src, key, "disk")


def build(src: KernelSource, compiler: Compiler | None = None, *, allow_compile: bool | None = None,
          fallback: bool = True) -> Binary:
    """Return the cubin for `src`, compiling at most once per key across processes.

    allow_compile: None follows MLA_JIT_OFFLINE (ops); True compiles a miss whatever it says
    (`mla-jit prewarm`). fallback: see `target_root`."""
    configure_from_env()
    compiler = compiler or get_compiler()
    key = kernel_key(src, compiler)
    memo_key = f"{src.arch.target.name}/{key}"
    if (hit := _memo.get(memo_key)) is not None:
        return hit
    if allow_compile is None:
        allow_compile = not env.offline()
    with _memo_lock:
        if (hit := _memo.get(memo_key)) is not None:
            return hit
        binary = _build_uncached_in_process(src, key, compiler, allow_compile, fallback)
        _memo[memo_key] = binary
        return binary


def _build_uncached_in_process(src: KernelSource, key: str, compiler: Compiler, allow_compile: bool,
                               fallback: bool) -> Binary:
    arch = src.arch.target.name
    if env.cache_disabled():
        if not allow_compile:
            raise OfflineCacheMissError(src.name, key, arch, src.prewarm_command, ())
        cubin, log, seconds = _compile(src, key, compiler)
        return Binary(src.name, key, arch, cubin, src.entry_points, "compiled", None, compiler.identity(),
                      log, seconds)

    roots = cache_roots(fallback=fallback)
    if (entry := store.lookup(arch, src.name, key, roots)) is not None:
        logger.debug("cache hit %s in %s", src.name, entry.path)
        return _from_entry(entry, src, key, "disk")
    if not allow_compile:
        raise OfflineCacheMissError(src.name, key, arch, src.prewarm_command, tuple(str(r.path) for r in roots))

    root = roots[0]
    lock = store.key_lock(root, arch, src.name, key, env.lock_timeout())
    store.acquire(lock, src.name)
    try:
        # Another process may have published while we waited for the lock.
        if (entry := store.read_entry(root, arch, src.name, key)) is not None:
            return _from_entry(entry, src, key, "disk")
        cubin, log, seconds = _compile(src, key, compiler)
        manifest = {
            "schema": cache_key.KEY_SCHEMA, "name": src.name, "arch": arch,
            "tuning_arch": src.arch.tuning.name, "entry_points": list(src.entry_points),
            "compiler": compiler.identity(), "flags": list(compiler.key_flags(src.arch.target)),
            "log": log, "compile_seconds": round(seconds, 3), "created": time.time(),
        }
        entry = store.publish(root, arch, src.name, key, source=src.source, cubin=cubin, manifest=manifest)
    finally:
        lock.release()
    return _from_entry(entry, src, key, "compiled")


def clear_memo() -> None:
    """Forget in-process binaries (tests use this to simulate a new process)."""
    with _memo_lock:
        _memo.clear()

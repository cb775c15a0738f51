"""`mla-jit prewarm`: enumerate the kernels asked for, look each up in the cache in this process,
and compile only the misses in worker processes."""
from __future__ import annotations

import os
import sys
import time

from .catalog import families, ops




def _arch_pairs(args) -> list:
    from ..errors import UnsupportedArchError
    from ..jit import env
    from ..jit.arch import parse_arch_pair
    given = args.arch or [env.arch_override() or "sm_90a"]
    pairs = []
    for text in given:
        try:
            pair = parse_arch_pair(text)
        except UnsupportedArchError as exc:
            raise UnsupportedArchError(f"{'--arch ' if args.arch else 'MLA_JIT_ARCH='}{text}: {exc}") from None
        if pair not in pairs:
            pairs.append(pair)
    return pairs


def _enumerate_jobs(args) -> list[tuple]:
    """(family, config, ArchPair) of every kernel to prewarm. Validates every --config spec, --op,
    --preset and --arch here, in this process, before anything is compiled."""
    from .. import presets
    from ..errors import ConfigSpecError, MlaJitError
    by_name = families()
    pairs = _arch_pairs(args)
    jobs: dict[tuple, tuple] = {}
    for spec in args.config or []:
        name = spec.partition(":")[0].strip()
        family = by_name.get(name)
        if family is None:
            raise ConfigSpecError(f"--config {spec}: unknown kernel family {name!r} (families: {', '.join(by_name)})")
        cfg = family.config_from_spec(spec)
        for pair in pairs:
            if not family.supports(pair.tuning):
                raise ConfigSpecError(f"--config {spec}: family {name} serves {', '.join(family.tunings)}, "
                                      f"not {pair.tuning.name} (--arch)")
            jobs.setdefault((name, cfg, pair), (family, cfg, pair))
    if args.config and not args.op and not args.preset:
        return list(jobs.values())
    known_ops = ops()
    for op in args.op or []:
        if op not in known_ops:
            raise MlaJitError(f"--op {op}: unknown op; known: {', '.join(known_ops)}")
    chosen_presets = presets.resolve(args.preset)
    for pair in pairs:
        for family in by_name.values():
            wanted = set(args.op) & set(family.ops) if args.op else family.default_prewarm
            if not wanted or not family.supports(pair.tuning):
                continue
            for cfg in family.prewarm_configs(pair.tuning, chosen_presets):
                jobs.setdefault((family.name, cfg, pair), (family, cfg, pair))
    return list(jobs.values())


def _prewarm_one(src, compiler_name: str) -> tuple[str, str, float, str | None]:
    """Build one kernel (in a worker process, or in this one). Returns (kernel name, origin,
    seconds, error): errors are reported, never raised (no worker tracebacks)."""
    from ..errors import MlaJitError
    start = time.perf_counter()
    try:
        from ..jit.build import build
        from ..jit.compiler import get_compiler
        binary = build(src, get_compiler(compiler_name), allow_compile=True, fallback=False)
        return src.name, binary.origin, time.perf_counter() - start, None
    except MlaJitError as exc:
        return src.name, "failed", time.perf_counter() - start, str(exc)
    except Exception as exc:  # noqa: BLE001 - report it with the kernel's name instead of a traceback
        return src.name, "failed", time.perf_counter() - start, f"{type(exc).__name__}: {exc}"


def _worker_init(interruptible: bool) -> None:
    # Ctrl-C reaches every process of the terminal's group: let a worker die of it quietly (the
    # kernel drops its cache lock; a half-written entry is only a staging dir) instead of printing
    # a KeyboardInterrupt traceback. The parent reports the interruption once. A parent that
    # ignores SIGINT (started in the background) keeps its workers ignoring it too.
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL if interruptible else signal.SIG_IGN)


def _progress(done: int, total: int, line: str) -> None:
    width = 24
    filled = width * done // max(total, 1)
    sys.stderr.write(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {line}\n")
    sys.stderr.flush()


def _run_compiles(sources: list, compiler_name: str, jobs_n: int):
    """Yield _prewarm_one's result for every source, compiling in `jobs_n` spawned processes
    (in this process when jobs_n is 1)."""
    if jobs_n == 1:
        for src in sources:
            yield _prewarm_one(src, compiler_name)
        return
    import concurrent.futures as cf
    import multiprocessing
    import signal
    from concurrent.futures.process import BrokenProcessPool
    interruptible = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # spawn: workers start clean (no inherited locks, threads or CUDA state from this process).
    pool = cf.ProcessPoolExecutor(jobs_n, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_worker_init, initargs=(interruptible,))
    try:
        futures = {pool.submit(_prewarm_one, src, compiler_name): src for src in sources}
        for fut in cf.as_completed(futures):
            try:
                yield fut.result()
            except BrokenProcessPool:
                yield futures[fut].name, "failed", 0.0, "a compile process died (killed by a signal?)"
    except BaseException:
        # Interrupted (or the parent failed): stop the workers now rather than wait for their compiles.
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            try:
                proc.terminate()
            except Exception:  # noqa: BLE001 - best effort
                pass
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def cmd_prewarm(args) -> int:
    from ..errors import ConfigError
    from ..jit import build as jit_build
    from ..jit import env
    from ..jit.compiler import get_compiler
    start = time.perf_counter()
    compiler_name = args.compiler or env.compiler_name()
    if env.cache_disabled():
        raise ConfigError("MLA_JIT_DISABLE_CACHE=1: prewarm would have no cache to fill; unset it")
    env.lock_timeout()   # a bad MLA_JIT_LOCK_TIMEOUT is reported once, here, not once per kernel
    jobs = _enumerate_jobs(args)
    if not jobs:
        print("nothing to prewarm for the given --arch/--op/--preset")
        return 0
    # The target root must be usable before anything compiles: no fallback to a temporary root
    # whose kernels would be lost (MLA_JIT_OFFLINE does not apply: prewarm compiles regardless).
    jit_build.target_root(fallback=False)
    compiler = get_compiler(compiler_name)
    sources = [family.source(cfg, pair) for family, cfg, pair in jobs]
    misses = [src for src in sources if jit_build.lookup(src, compiler, fallback=False) is None]
    counts = {"compiled": 0, "cached": len(sources) - len(misses), "failed": 0}
    jobs_n = max(1, min(args.jobs or os.cpu_count() or 1, len(misses)))
    print(f"prewarming {len(sources)} kernel(s): {counts['cached']} already cached"
          + (f", compiling {len(misses)} with {jobs_n} process(es)" if misses else ""), flush=True)
    failures: list[tuple[str, str]] = []
    if misses:
        try:
            for done, (name, origin, seconds, error) in enumerate(_run_compiles(misses, compiler_name, jobs_n), 1):
                counts["failed" if error else "compiled" if origin == "compiled" else "cached"] += 1
                if error:
                    failures.append((name, error))
                _progress(done, len(misses), f"{name}: {origin} ({seconds:.1f} s)")
        except KeyboardInterrupt:
            print(f"mla-jit: prewarm interrupted ({counts['compiled']} compiled before)", file=sys.stderr)
            return 130
    for name, error in failures:
        print(f"FAILED {name}:\n{error}\n", file=sys.stderr)
    print(f"prewarm: {counts['compiled']} compiled, {counts['cached']} already cached, "
          f"{counts['failed']} failed, {time.perf_counter() - start:.1f} s")
    return 1 if failures else 0

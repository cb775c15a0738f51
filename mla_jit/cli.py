"""`mla-jit`: prewarm | list | clear | info.

Startup stays light: the CLI never imports torch (only `info` does, for its GPU section) and never
touches CUDA. `prewarm` renders every kernel and looks it up in the cache in this process, and
starts compile processes only for the misses, so a warm prewarm takes well under a second.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time

# ---- what the registry, the presets and the arch module offer (for --help and validation) --------


def _families() -> dict:
    from .runtimes import registry
    return registry.families()


def _ops() -> dict[str, list]:
    """op -> the families serving it, in registry order."""
    out: dict[str, list] = {}
    for family in _families().values():
        for op in family.ops:
            out.setdefault(op, []).append(family)
    return out


def _default_ops() -> list[str]:
    return [op for op, fams in _ops().items() if any(f.default_prewarm for f in fams)]


def _example_ops() -> list[str]:
    return [op for op, fams in _ops().items() if not any(f.default_prewarm for f in fams)]


def _preset_names() -> list[str]:
    from . import presets
    groups = [f"{g} (= {', '.join(members)})" for g, members in presets.PRESET_GROUPS.items()]
    return [*groups, *presets.PRESETS]


def _arch_names() -> tuple[str, ...]:
    from .jit.arch import SUPPORTED_ARCHS
    return SUPPORTED_ARCHS


def _catalog() -> str:
    """The ops, families, presets and archs, generated from their modules (for --help)."""
    items = [
        ("ops", f"{', '.join(_default_ops())} (built by default); {', '.join(_example_ops())} "
                "(examples: built only when named with --op)"),
        ("families (--config FAMILY:field=value,...)", ", ".join(_families())),
        ("presets", ", ".join(_preset_names())),
        ("archs", f"{', '.join(_arch_names())}; TUNING@TARGET builds a family for a newer GPU "
                  "(e.g. sm_80@sm_90a)"),
    ]
    return "\n".join(textwrap.fill(text, 100, initial_indent=f"{name}: ", subsequent_indent="    ")
                     for name, text in items)


# ---- prewarm -----------------------------------------------------------------------------------------


def _arch_pairs(args) -> list:
    from .errors import UnsupportedArchError
    from .jit import env
    from .jit.arch import parse_arch_pair
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
    from . import presets
    from .errors import ConfigSpecError, MlaJitError
    families = _families()
    pairs = _arch_pairs(args)
    jobs: dict[tuple, tuple] = {}
    for spec in args.config or []:
        name = spec.partition(":")[0].strip()
        family = families.get(name)
        if family is None:
            raise ConfigSpecError(f"--config {spec}: unknown kernel family {name!r} (families: {', '.join(families)})")
        cfg = family.config_from_spec(spec)
        for pair in pairs:
            if not family.supports(pair.tuning):
                raise ConfigSpecError(f"--config {spec}: family {name} serves {', '.join(family.tunings)}, "
                                      f"not {pair.tuning.name} (--arch)")
            jobs.setdefault((name, cfg, pair), (family, cfg, pair))
    if args.config and not args.op and not args.preset:
        return list(jobs.values())
    known_ops = _ops()
    for op in args.op or []:
        if op not in known_ops:
            raise MlaJitError(f"--op {op}: unknown op; known: {', '.join(known_ops)}")
    chosen_presets = presets.resolve(args.preset)
    for pair in pairs:
        for family in families.values():
            wanted = set(args.op) & set(family.ops) if args.op else family.default_prewarm
            if not wanted or not family.supports(pair.tuning):
                continue
            for cfg in family.prewarm_configs(pair.tuning, chosen_presets):
                jobs.setdefault((family.name, cfg, pair), (family, cfg, pair))
    return list(jobs.values())


def _prewarm_one(src, compiler_name: str) -> tuple[str, str, float, str | None]:
    """Build one kernel (in a worker process, or in this one). Returns (kernel name, origin,
    seconds, error): errors are reported, never raised (no worker tracebacks)."""
    from .errors import MlaJitError
    start = time.perf_counter()
    try:
        from .jit.build import build
        from .jit.compiler import get_compiler
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
    from .errors import ConfigError
    from .jit import build as jit_build
    from .jit import env
    from .jit.compiler import get_compiler
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


# ---- list / clear / info: they look at the configured roots and never create one ----------------


def _roots() -> list[dict]:
    """The configured roots as they are: MLA_JIT_CACHE_DIR (status ok, missing or unusable; when it is
    unusable, the private fallback root ops use, if it exists), then MLA_JIT_READONLY_CACHE_DIRS."""
    from .cache import store
    from .jit import env
    wanted = env.cache_dir()
    problem = store.root_problem(wanted)
    status = "unusable" if problem else "ok" if wanted.is_dir() else "missing"
    roots = [{"root": store.CacheRoot(wanted, True), "source": "MLA_JIT_CACHE_DIR", "status": status,
              "problem": problem}]
    if problem and (fallback := store.private_temp_root_path()).is_dir():
        roots.append({"root": store.CacheRoot(fallback, True), "source": "fallback of MLA_JIT_CACHE_DIR",
                      "status": "ok", "problem": None})
    for path in env.readonly_cache_dirs():
        roots.append({"root": store.CacheRoot(path, False), "source": "MLA_JIT_READONLY_CACHE_DIRS",
                      "status": "ok" if path.is_dir() else "missing",
                      "problem": None if path.is_dir() else f"{path} is not a directory"})
    return roots


def _root_note(r: dict) -> str | None:
    path = r["root"].path
    if r["status"] == "unusable":
        return f"cache directory {path} ({r['source']}) is unusable: {r['problem']}"
    if r["status"] == "missing":
        what = "does not exist yet" if r["root"].writable else "does not exist"
        return f"cache directory {path} ({r['source']}) {what}"
    if r["source"].startswith("fallback"):
        return f"ops use the private fallback cache {path} instead"
    return None


def _entries(roots: list[dict]):
    from .cache import store
    now = time.time()
    usable = [r["root"] for r in roots if r["root"].path.is_dir()]
    for root, arch, path, manifest in store.iter_entries(usable):
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        yield {"name": (manifest or {}).get("name", path.name), "arch": arch, "size_bytes": size,
               "age_s": round(now - (manifest or {}).get("created", path.stat().st_mtime), 1),
               "compiler": (manifest or {}).get("compiler"), "valid_manifest": manifest is not None,
               "root": str(root.path), "read_only": not root.writable, "path": str(path)}


def cmd_list(args) -> int:
    roots = _roots()
    for r in roots:
        if (note := _root_note(r)):
            print(f"mla-jit: {note}", file=sys.stderr)
    rows = list(_entries(roots))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no cached kernels")
        return 0
    print(f"{'arch':8} {'size':>9} {'age':>8}  {'kernel':50} root")
    for r in rows:
        age = r["age_s"]
        age_text = f"{age / 3600:.1f}h" if age >= 3600 else f"{age / 60:.1f}m"
        print(f"{r['arch']:8} {r['size_bytes'] / 1024:8.0f}K {age_text:>8}  {r['name']:50} {r['root']}"
              + ("" if r["valid_manifest"] else "  (incomplete)"))
    return 0


def cmd_clear(args) -> int:
    from .cache import store
    from .errors import CacheError
    roots = _roots()
    r = roots[0]
    path = r["root"].path
    if r["status"] == "missing":
        print(f"nothing to remove: cache directory {path} does not exist")
        return 0
    if r["status"] == "unusable" and not (path.is_dir() and os.access(path, os.W_OK | os.X_OK)):
        fallback = [x for x in roots if x["source"].startswith("fallback")]
        hint = (f" (ops fall back to {fallback[0]['root'].path}: clear it with MLA_JIT_CACHE_DIR="
                f"{fallback[0]['root'].path})" if fallback else "")
        raise CacheError(f"cache directory {path} (MLA_JIT_CACHE_DIR) is unusable: {r['problem']}{hint}")
    if not args.yes:
        try:
            answer = input(f"remove every cached kernel under {path}? [y/N] ")
        except EOFError:
            answer = ""
            print()
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    print(f"removed {store.clear(r['root'])} cached kernel(s) from {path}")
    return 0


def _versions() -> dict:
    from importlib import metadata
    out: dict = {"python": sys.version.split()[0]}
    for dist in ("mla-jit", "torch", "cuda-python", "cuda-bindings", "nvidia-cuda-nvrtc", "nvidia-cutlass",
                 "nvidia-cuda-cccl", "jinja2", "filelock"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    from .jit.compiler import get_compiler
    for name in ("nvrtc", "nvcc"):
        try:
            out[f"{name}_identity"] = get_compiler(name).identity()
        except Exception as exc:  # noqa: BLE001 - info must report, not fail
            out[f"{name}_identity"] = f"unavailable ({exc})"
    try:
        from .jit.paths import cutlass_include_dir
        text = (cutlass_include_dir() / "cutlass" / "version.h").read_text()
        parts = [ln.split()[-1] for ln in text.splitlines()
                 if ln.startswith("#define CUTLASS_") and any(k in ln for k in ("MAJOR ", "MINOR ", "PATCH "))]
        out["cutlass_headers"] = ".".join(parts[:3])
    except Exception as exc:  # noqa: BLE001
        out["cutlass_headers"] = f"unavailable ({exc})"
    return out


def _gpu_info() -> dict:
    try:
        import torch  # the only command that imports torch, and only here
    except ImportError as exc:
        return {"available": False, "error": str(exc)}
    if not torch.cuda.is_available():
        return {"available": False}
    from .jit.arch import device_arch
    from .jit.driver import check, cu, init
    init()
    info = {"available": True, "driver": check(cu().cuDriverGetVersion(), "cuDriverGetVersion"), "devices": []}
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        try:
            arch = device_arch(i).name
        except Exception as exc:  # noqa: BLE001 - an unsupported GPU is still reported
            arch = f"unsupported ({exc})"
        info["devices"].append({"index": i, "name": props.name, "arch": arch, "sms": props.multi_processor_count})
    return info


def cmd_info(args) -> int:
    from .jit import env
    _families()   # the families declare their own MLA_JIT_* knobs: list them all
    roots = []
    all_roots = _roots()
    entries = list(_entries(all_roots))
    for r in all_roots:
        path = str(r["root"].path)
        mine = [e for e in entries if e["root"] == path]
        roots.append({"path": path, "writable": r["root"].writable, "source": r["source"], "status": r["status"],
                      "problem": r["problem"], "entries": len(mine), "bytes": sum(e["size_bytes"] for e in mine)})
    report = {"versions": _versions(), "gpu": _gpu_info(), "cache_roots": roots, "env": env.effective()}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for section, body in report.items():
        print(f"{section}:")
        items = body.items() if isinstance(body, dict) else enumerate(body)
        for k, v in items:
            print(f"  {k}: {v}")
    return 0


# ---- the parser ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    catalog = _catalog()
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="mla-jit", description="mla_jit kernel cache and JIT tools",
                                     epilog=catalog, formatter_class=raw)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prewarm", help="compile the kernels of the registered ops into the cache (no GPU needed)",
                       description=textwrap.fill(
                           "Compile kernels into the writable cache root (MLA_JIT_CACHE_DIR), whatever "
                           "MLA_JIT_OFFLINE says (it governs ops only). Fails, before compiling anything, "
                           "if that directory is unusable.", 100),
                       epilog=catalog, formatter_class=raw)
    p.add_argument("--arch", action="append",
                   help=f"target arch: {', '.join(_arch_names())}; TUNING@TARGET (e.g. sm_80@sm_90a) builds a "
                   "family for a newer GPU. Repeatable. Default: MLA_JIT_ARCH or sm_90a")
    p.add_argument("--preset", action="append",
                   help=f"model preset: {', '.join(_preset_names())}. Repeatable. Default: all")
    p.add_argument("--op", action="append",
                   help=f"only kernels of this op: {', '.join(_ops())}. Repeatable. Default: "
                   f"{', '.join(_default_ops())} (the examples {', '.join(_example_ops())} only when named)")
    p.add_argument("--config", action="append", help="one exact kernel, FAMILY:field=value,... "
                   "(as printed by offline-mode errors). Repeatable")
    p.add_argument("--jobs", type=int, default=0, help="parallel compile processes (default: CPU count)")
    p.add_argument("--compiler", choices=("nvrtc", "nvcc"), help="default: MLA_JIT_COMPILER or nvrtc")
    p.set_defaults(func=cmd_prewarm)
    p = sub.add_parser("list", help="list cached kernels")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("clear", help="remove every kernel from the writable cache root")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_clear)
    p = sub.add_parser("info", help="versions, GPU, cache roots and effective environment")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)
    return parser


def _quiet_broken_stdout() -> None:
    """stdout's reader went away (`mla-jit list | head -1`): send the rest to /dev/null so the final
    flush at exit does not complain either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    import logging
    from .errors import MlaJitError
    logging.basicConfig(format="%(name)s %(levelname)s: %(message)s")
    try:
        from .log import configure_from_env
        configure_from_env()
        args = build_parser().parse_args(argv)
        code = args.func(args)
        sys.stdout.flush()
        return code
    except MlaJitError as exc:
        print(f"mla-jit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mla-jit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _quiet_broken_stdout()
        return 141   # 128 + SIGPIPE, what a Unix tool killed by the broken pipe reports


if __name__ == "__main__":
    sys.exit(main())

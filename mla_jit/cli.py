"""`mla-jit`: prewarm | list | clear | info."""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class PrewarmJob:
    family: str
    spec: str
    arch: str        # "sm_90a" or "tuning@target"
    compiler: str


def _parse_arch(text: str):
    from .jit.arch import ArchPair, parse_arch
    tuning, _, target = text.partition("@")
    return ArchPair(parse_arch(tuning), parse_arch(target or tuning))


def _prewarm_one(job: PrewarmJob) -> tuple[str, str, float, str | None]:
    """Worker: build one kernel. Returns (kernel name, origin, seconds, error)."""
    from .errors import MlaJitError
    from .jit.build import build
    from .jit.compiler import get_compiler
    from .runtimes import registry
    start = time.perf_counter()
    family = registry.get(job.family)
    cfg = family.config_from_spec(job.spec)
    name = family.kernel_name(cfg)
    try:
        binary = build(family.source(cfg, _parse_arch(job.arch)), get_compiler(job.compiler))
        return name, binary.origin, time.perf_counter() - start, None
    except MlaJitError as exc:
        return name, "failed", time.perf_counter() - start, str(exc)


def _enumerate_jobs(args) -> list[PrewarmJob]:
    from . import presets
    from .errors import MlaJitError
    from .jit import env
    from .runtimes import registry
    families = registry.families()
    compiler = args.compiler or env.compiler_name()
    archs = args.arch or [env.arch_override() or "sm_90a"]
    jobs: list[PrewarmJob] = []
    for spec in args.config or []:
        family_name = spec.partition(":")[0]
        if family_name not in families:
            raise MlaJitError(f"--config {spec}: unknown kernel family {family_name!r} ({', '.join(families)})")
        for arch in archs:
            jobs.append(PrewarmJob(family_name, spec, arch, compiler))
    if args.config and not args.op and not args.preset:
        return jobs
    chosen_presets = presets.resolve(args.preset)
    known_ops = sorted({op for f in families.values() for op in f.ops})
    for op in args.op or []:
        if op not in known_ops:
            raise MlaJitError(f"--op {op}: unknown op; known: {', '.join(known_ops)}")
    for arch_text in archs:
        pair = _parse_arch(arch_text)
        for family in families.values():
            if not family.supports(pair.tuning) or (args.op and not set(args.op) & set(family.ops)):
                continue
            for cfg in family.prewarm_configs(pair.tuning, chosen_presets):
                job = PrewarmJob(family.name, family.config_spec(cfg), arch_text, compiler)
                if job not in jobs:
                    jobs.append(job)
    return jobs


def _progress(done: int, total: int, line: str) -> None:
    width = 24
    filled = width * done // max(total, 1)
    sys.stderr.write(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {line}\n")
    sys.stderr.flush()


def cmd_prewarm(args) -> int:
    jobs = _enumerate_jobs(args)
    if not jobs:
        print("nothing to prewarm for the given --arch/--op/--preset")
        return 0
    start = time.perf_counter()
    counts = {"compiled": 0, "cached": 0, "failed": 0}
    failures: list[tuple[str, str]] = []
    jobs_n = max(1, min(args.jobs or os.cpu_count() or 1, len(jobs)))
    print(f"prewarming {len(jobs)} kernel(s) with {jobs_n} process(es)", flush=True)
    # spawn: workers must not inherit a CUDA context or locks from this process.
    with cf.ProcessPoolExecutor(jobs_n, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_prewarm_one, job) for job in jobs]
        for done, fut in enumerate(cf.as_completed(futures), 1):
            name, origin, seconds, error = fut.result()
            key = "compiled" if origin == "compiled" else "failed" if error else "cached"
            counts[key] += 1
            if error:
                failures.append((name, error))
            _progress(done, len(jobs), f"{name}: {origin} ({seconds:.1f} s)")
    elapsed = time.perf_counter() - start
    for name, error in failures:
        print(f"FAILED {name}:\n{error}\n", file=sys.stderr)
    print(f"prewarm: {counts['compiled']} compiled, {counts['cached']} already cached, "
          f"{counts['failed']} failed, {elapsed:.1f} s")
    return 1 if failures else 0


def _entries():
    from .cache import store
    now = time.time()
    for root, arch, path, manifest in store.iter_entries():
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        yield {"name": (manifest or {}).get("name", path.name), "arch": arch, "size_bytes": size,
               "age_s": round(now - (manifest or {}).get("created", path.stat().st_mtime), 1),
               "compiler": (manifest or {}).get("compiler"), "valid_manifest": manifest is not None,
               "root": str(root.path), "read_only": not root.writable, "path": str(path)}


def cmd_list(args) -> int:
    rows = list(_entries())
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
    root = store.writable_root()
    if not args.yes:
        answer = input(f"remove every cached kernel under {root.path}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    print(f"removed {store.clear(root)} cached kernel(s) from {root.path}")
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
        except Exception as exc:  # info must report, not fail
            out[f"{name}_identity"] = f"unavailable ({exc})"
    try:
        from .jit.paths import cutlass_include_dir
        text = (cutlass_include_dir() / "cutlass" / "version.h").read_text()
        parts = [ln.split()[-1] for ln in text.splitlines()
                 if ln.startswith("#define CUTLASS_") and any(k in ln for k in ("MAJOR ", "MINOR ", "PATCH "))]
        out["cutlass_headers"] = ".".join(parts[:3])
    except Exception as exc:
        out["cutlass_headers"] = f"unavailable ({exc})"
    return out


def _gpu_info() -> dict:
    import torch
    if not torch.cuda.is_available():
        return {"available": False}
    from .jit.arch import device_arch
    from .jit.driver import check, cu, init
    init()
    info = {"available": True, "driver": check(cu().cuDriverGetVersion(), "cuDriverGetVersion"), "devices": []}
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        info["devices"].append({"index": i, "name": props.name, "arch": device_arch(i).name,
                                "sms": props.multi_processor_count})
    return info


def cmd_info(args) -> int:
    from .cache import store
    from .jit import env
    roots = []
    for root in store.all_roots():
        entries = [e for e in _entries() if e["root"] == str(root.path)]
        roots.append({"path": str(root.path), "writable": root.writable, "entries": len(entries),
                      "bytes": sum(e["size_bytes"] for e in entries)})
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mla-jit", description="mla_jit kernel cache and JIT tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prewarm", help="compile the kernels of the registered ops into the cache (no GPU needed)")
    p.add_argument("--arch", action="append", help="target arch (sm_90a, sm_89, sm_80; TUNING@TARGET for a "
                   "family on a newer GPU). Repeatable. Default: MLA_JIT_ARCH or sm_90a")
    p.add_argument("--preset", action="append", help="model preset (deepseek-v3, deepseek-v3-tp8, "
                   "deepseek-v2-lite, ...). Repeatable. Default: all")
    p.add_argument("--op", action="append", help="only kernels of this op. Repeatable")
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


def main(argv: list[str] | None = None) -> int:
    import logging
    from .errors import MlaJitError
    from .log import configure_from_env
    logging.basicConfig(format="%(name)s %(levelname)s: %(message)s")
    configure_from_env()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except MlaJitError as exc:
        print(f"mla-jit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

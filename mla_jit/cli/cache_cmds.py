"""`mla-jit list | clear | info`: they look at the configured roots and never create one."""
from __future__ import annotations

import json
import os
import sys
import time

from .catalog import families




def _roots() -> list[dict]:
    """The configured roots as they are: MLA_JIT_CACHE_DIR (status ok, missing or unusable; when it is
    unusable, the private fallback root ops use, if it exists), then MLA_JIT_READONLY_CACHE_DIRS."""
    from ..cache import store
    from ..jit import env
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
    from ..cache import store
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
    from ..cache import store
    from ..errors import CacheError
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
    from ..jit.compiler import get_compiler
    for name in ("nvrtc", "nvcc"):
        try:
            out[f"{name}_identity"] = get_compiler(name).identity()
        except Exception as exc:  # noqa: BLE001 - info must report, not fail
            out[f"{name}_identity"] = f"unavailable ({exc})"
    try:
        from ..jit.paths import cutlass_include_dir
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
    from ..jit.arch import device_arch
    from ..jit.driver import check, cu, init
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
    from ..jit import env
    families()   # the families declare their own MLA_JIT_* knobs: list them all
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

"""JIT figures: cold compile time (NVRTC, nvcc), first call in a new process with the kernel on
disk, and the host time of a warm launch. Usage: python bench/bench_jit.py [--json PATH]."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

FIRST_CALL = r"""
import time, torch
src = torch.randn(256, 256, device="cuda"); torch.cuda.synchronize()  # CUDA context up first
t0 = time.perf_counter()
from mla_jit.ops import toy
ti = time.perf_counter()
out = toy.tile_copy(src, 1.0); torch.cuda.synchronize()
t1 = time.perf_counter()
assert torch.equal(out, src + 1.0)
from mla_jit.runtimes import registry
origins = [b.origin for b in registry.get("tile_copy")._binaries.values()]
print(f"{(t1 - ti) * 1e3:.2f} {(ti - t0) * 1e3:.2f} {','.join(origins)}")
"""


def cold_compile_seconds(compiler: str) -> dict[str, float]:
    from mla_jit.jit.arch import resolve_for_build
    from mla_jit.jit.build import build, clear_memo
    from mla_jit.jit.compiler import get_compiler
    from mla_jit.runtimes import registry
    arch = resolve_for_build("sm_90a")
    out = {}
    with tempfile.TemporaryDirectory() as root:
        os.environ["MLA_JIT_CACHE_DIR"] = root
        for family_name in ("tile_copy", "wgmma_gemm"):
            family = registry.get(family_name)
            cfg = next(iter(family.prewarm_configs(arch.tuning, [])))
            clear_memo()
            t0 = time.perf_counter()
            binary = build(family.source(cfg, arch), get_compiler(compiler))
            out[family_name] = time.perf_counter() - t0
            assert binary.origin == "compiled"
    os.environ.pop("MLA_JIT_CACHE_DIR")
    return out


def first_call_ms(cache_dir: str) -> tuple[float, float, str]:
    """(first op call ms, import of mla_jit ms, origin of the binary) in a new process."""
    env = {**os.environ, "MLA_JIT_CACHE_DIR": cache_dir}
    line = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]
    ms, import_ms, origin = line.split()
    return float(ms), float(import_ms), origin


def warm_launch_us(n: int = 20000) -> dict[str, float]:
    from mla_jit.ops import toy
    from mla_jit.runtimes import registry
    src = torch.randn(128, 64, device="cuda")
    out = torch.empty_like(src)
    toy.tile_copy(src, 1.0, out=out)
    torch.cuda.synchronize()
    results = {}
    for label in ("op", "prepared_launch"):
        samples = []
        for _ in range(5):
            if label == "op":
                t0 = time.perf_counter()
                for _ in range(n):
                    toy.tile_copy(src, 1.0, out=out)
                t1 = time.perf_counter()
            else:
                launch = next(iter(registry.get("tile_copy")._launches.values()))
                desc = next(iter(toy.descriptors.values()))
                stream = torch.cuda.current_stream().cuda_stream
                ptr = out.data_ptr()
                t0 = time.perf_counter()
                for _ in range(n):
                    launch(stream, desc, ptr, 128, 64, 1.0)
                t1 = time.perf_counter()
            torch.cuda.synchronize()
            samples.append((t1 - t0) / n * 1e6)
        results[label] = statistics.median(samples)
    assert torch.equal(out, src + 1.0)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    report: dict = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    for compiler in ("nvrtc", "nvcc"):
        report[f"cold_compile_s_{compiler}"] = cold_compile_seconds(compiler)
    if torch.cuda.is_available():
        with tempfile.TemporaryDirectory() as cache:
            report["first_call_cold_ms"] = first_call_ms(cache)     # compiles
            report["first_call_disk_ms"] = first_call_ms(cache)     # new process, kernel on disk
        report["warm_launch_host_us"] = warm_launch_us()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print("\n== mla_jit JIT figures ==")
    print(f"GPU: {report['gpu']}")
    for compiler in ("nvrtc", "nvcc"):
        c = report[f"cold_compile_s_{compiler}"]
        print(f"cold compile {compiler:5}: toy {c['tile_copy']:.2f} s, wgmma {c['wgmma_gemm']:.2f} s")
    if "first_call_disk_ms" in report:
        for label, key in (("compiling", "first_call_cold_ms"), ("kernel on disk", "first_call_disk_ms")):
            ms, import_ms, origin = report[key]
            print(f"first call, new process, {label}: {ms:.1f} ms (binary: {origin}; import mla_jit "
                  f"{import_ms:.0f} ms before it)")
        w = report["warm_launch_host_us"]
        print(f"warm launch host time: op {w['op']:.2f} us, PreparedLaunch alone {w['prepared_launch']:.2f} us")


if __name__ == "__main__":
    main()

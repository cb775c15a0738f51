"""The short table scripts/gpu_run.sh prints last: test outcome, decode ratios, host times.

Usage: python scripts/summarize_gpu_run.py OUT_DIR (reads pytest.log, bench_decode*.json,
fp8_decode.json and bench_prefill*.json there).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: Path) -> None:
    print("\n== summary ==")
    log = out / "pytest.log"
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()] if log.exists() else []
    print(f"GPU tests: {lines[-1].strip('= ') if lines else 'not run'}")
    for path in sorted(out.glob("bench_decode*.json")):
        report = json.loads(path.read_text())
        rows = report["rows"]
        if not rows:
            continue
        cells = [f"{r['b']}/{r['s_q']}/{r['s_k']}/{r['h_q']}{'c' if r['causal'] else ''} {r['ratio']:.2f}" for r in rows]
        worst = min(rows, key=lambda r: r["ratio"])
        kernels = path.stem.removeprefix("bench_decode").lstrip("_") or "native"
        print(f"decode vs FlashMLA ({report['gpu']}, {kernels}), FlashMLA us / ours; b/s_q/s_k/h_q[c]:")
        for i in range(0, len(cells), 4):
            print("  " + "  ".join(f"{c:24s}" for c in cells[i:i + 4]))
        host = report["host"]
        print(f"  lowest {worst['ratio']:.3f} at {worst['b']}/{worst['s_q']}/{worst['s_k']}/{worst['h_q']}; "
              f"host per warm call: decode {host['decode_call_us']:.1f} us, metadata {host['metadata_call_us']:.1f} us"
              + (f", filled FlashMLASchedMeta {host['decode_call_lazy_schedule_us']:.1f} us"
                 if "decode_call_lazy_schedule_us" in host else ""))
        against = [r["against_us"] / r["us"] for r in rows if "against_us" in r]
        if against:
            print(f"  against ({report.get('against', 'other')}) us / ours: {min(against):.3f}-{max(against):.3f} "
                  f"over {len(against)} rows, geomean {_geomean(against):.3f}"
                  + (f"; its host per warm call: decode {host['against_decode_call_us']:.1f} us"
                     if "against_decode_call_us" in host else ""))

    _fp8_summary(out)
    _prefill_summary(out)
    _sparse_summary(out)


def _sparse_summary(out: Path) -> None:
    """bench_sparse_decode.py / bench_sparse_prefill.py: ours against FlashMLA's H200 figures."""
    for path in sorted(out.glob("sparse_*.json")):
        rows = json.loads(path.read_text())
        if not rows:
            continue
        if "b" in rows[0]:
            cells = [f"{r['b']}/{r['s_q']}/{r['h_q']} {r['us']:.0f}us {r['ratio']:.3f}" for r in rows]
            head = "b/s_q/h_q"
        else:
            cells = [f"{r['kv']}/{r['d_qk']}/{r['h_q']}/{r['s_kv']} {r['tflops']:.0f}TF {r['ratio']:.3f}" for r in rows]
            head = "kv/d_qk/h_q/s_kv"
        if "other_ratio" in rows[0]:  # --against-package: the other package's us / ours
            cells = [f"{c} A/B {r['other_ratio']:.3f}" for c, r in zip(cells, rows)]
        print(f"{path.stem} ({rows[0]['arch']}), FlashMLA us / ours; {head}:")
        for i in range(0, len(cells), 3):
            print("  " + "  ".join(f"{c:30s}" for c in cells[i:i + 3]))


def _fp8_summary(out: Path) -> None:
    """bench_decode.py --fp8: our bf16 decode, FP8 decode and bf16 q over the FP8 cache (kv8),
    interleaved, per row (fp8_decode_<tuning>.json: the mma.sync family forced)."""
    for path in sorted(out.glob("fp8_decode*.json")):
        _fp8_table(path)


def _fp8_table(path: Path) -> None:
    report = json.loads(path.read_text())
    rows = report["fp8_rows"]
    if not rows:
        return
    tuning = path.stem.removeprefix("fp8_decode").lstrip("_") or "native"
    print(f"FP8 decode ({report['gpu']}, {tuning} kernels): b/s_q/s_k/h_q[c], bf16 us, FP8 us, bf16 / FP8, FP8 "
          "TFLOPS and GB/s (1-byte q and cache), kv8 us, bf16 / kv8")
    for r in rows:
        shape = f"{r['b']}/{r['s_q']}/{r['s_k']}/{r['h_q']}{'c' if r['causal'] else ''}"
        print(f"  {shape:18s} {r['bf16_us']:8.1f} {r['us']:8.1f} {r['ratio']:6.3f} {r['tflops']:6.0f} {r['gbps']:6.0f}"
              f" {r.get('kv8_us', float('nan')):8.1f} {r.get('kv8_ratio', float('nan')):6.3f}")
    for key, name in (("ratio", "FP8"), ("kv8_ratio", "kv8")):
        ratios = [r[key] for r in rows if key in r]
        if ratios:
            print(f"  bf16 / {name}: {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} rows, "
                  f"geomean {_geomean(ratios):.3f}")


def _prefill_summary(out: Path) -> None:
    for path in sorted(out.glob("bench_prefill*.json")):
        rows = json.loads(path.read_text())
        if not rows:
            continue
        kernels = path.stem.removeprefix("bench_prefill").lstrip("_") or "native"
        print(f"prefill ({kernels}): TFLOPS ours / x cuDNN / x flash with V padded to 192")
        for r in rows:
            print(f"  {r['row']:46s} {r['tflops']:6.1f}  {r['tflops'] / r['cudnn_tflops']:5.3f}  "
                  f"{r['tflops'] / r['flash_pad_v_tflops']:5.3f}")


def _geomean(values: list[float]) -> float:
    import math
    return math.exp(sum(math.log(v) for v in values) / len(values))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/mla_jit_out"))

"""The V3.2 indexer on the GPU: DeepGEMM's test shapes, FLOP and byte formulas (tests/test_attention.py
of DeepGEMM), CUDA events, L2 flushed before each call, median of 20. DeepGEMM is not on this
machine: its figures are the H200 ones in ANCHORS.md (printed beside ours for the ratio).

  fp8_mqa_logits: H 64 (--heads), D 128, one sequence (row i sees keys [0, kv - seq + i + 1)), clean on
    (the clean pass is part of the call); TFLOPS = 2 * sum(ke - ks) * H * D / t.
  fp8_paged_mqa_logits: H 64, D 128, lengths uniform in [0.7, 1.3] x avg, clean off (what engines
    pass); GB/s = (q + weights + lens + sum_len * (D + 4) + sum_len / 64 * 4 + sum_len * next_n * 4) / t.
  get_paged_mqa_logits_metadata: its own time. Host time of a warm fp8_paged_mqa_logits call (median of
  rounds, enqueued while a sleep kernel holds the GPU: timing.host_time_us).

--arch sm_80 / sm_89 times the mma.sync kernels on this GPU (MLA_JIT_ARCH) and reports TFLOPS as a
fraction of this GPU's mma.sync ceiling for their instruction (bench/probe_mma_sync.py: f16 m16n8k16
for sm_80, e4m3 m16n8k32 for sm_89), measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import host_time_us, time_interleaved  # noqa: E402

import importlib  # noqa: E402

import mla_jit  # noqa: E402

H, D = 64, 128
# DeepGEMM 2.6.1 on the H200 (ANCHORS.md): us per shape.
ANCHOR_LOGITS = {(2048, 4096): 112, (2048, 8192): 233, (2048, 16384): 473, (2048, 32768): 958,
                 (2048, 65536): 1925, (2048, 131072): 3964, (4096, 4096): 160, (4096, 8192): 398,
                 (4096, 32768): 1856, (4096, 131072): 8280}
ANCHOR_PAGED = {(64, 1, 8192): 30.0, (64, 1, 32768): 83.4, (64, 2, 8192): 31.5, (64, 2, 32768): 88.7,
                (128, 1, 8192): 47.1, (128, 1, 32768): 149.7, (256, 1, 8192): 80.8, (256, 2, 8192): 94.2,
                (4096, 1, 8192): 1117.6, (4096, 2, 8192): 1201.4}


def _fp8_bytes(*shape, gen):
    """Random e4m3 bytes without NaN (0x7F, 0xFF)."""
    raw = torch.randint(0, 0x7F, shape, dtype=torch.uint8, device="cuda", generator=gen)
    return raw | (torch.randint(0, 2, shape, dtype=torch.uint8, device="cuda", generator=gen) << 7)


def _variants(call):
    """(setup, fn) of this package, and of --against-package's copy (interleaved call by call)."""
    out = [(lambda: None, lambda: call(mla_jit))]
    if AGAINST is not None:
        out.append((lambda: None, lambda: call(AGAINST)))
    return out


AGAINST = None


def ragged_inputs(seq: int, kv: int, gen: torch.Generator):
    """DeepGEMM's test inputs: one causal sequence, row i sees keys [0, kv - seq + i + 1)."""
    q = _fp8_bytes(seq, H, D, gen=gen).view(torch.float8_e4m3fn)
    k = _fp8_bytes(kv, D, gen=gen).view(torch.float8_e4m3fn)
    k_scale = torch.rand(kv, device="cuda", generator=gen) * 0.01 + 0.001
    weights = torch.randn(seq, H, device="cuda", generator=gen)
    ks = torch.zeros(seq, dtype=torch.int32, device="cuda")
    ke = torch.arange(seq, dtype=torch.int32, device="cuda") + (kv - seq + 1)
    return q, k, k_scale, weights, ks, ke


def bench_logits(flush, rows):
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for seq, kv in rows:
        q, k, k_scale, weights, ks, ke = ragged_inputs(seq, kv, gen)
        cost = int((ke - ks).clamp(min=0).sum())
        t, *other = time_interleaved(_variants(lambda pkg: pkg.fp8_mqa_logits(q, (k, k_scale), weights, ks, ke)),
                                     flush)
        tflops = 2 * cost * H * D / t / 1e6
        anchor = ANCHOR_LOGITS.get((seq, kv)) if H == 64 else None   # (DeepGEMM's figures: 64 heads)
        out.append({"op": "fp8_mqa_logits", "seq": seq, "kv": kv, "us": t, "tflops": tflops,
                    "deepgemm_us": anchor, "x_deepgemm": anchor / t if anchor else None,
                    "against_us": other[0] if other else None})
        del q, k, k_scale, weights
    return out


def paged_inputs(b: int, next_n: int, avg: int, gen: torch.Generator):
    """DeepGEMM's test inputs: lengths 0.7-1.3 x avg, pages of 64 keys in a random order."""
    lens = torch.randint(int(0.7 * avg), int(1.3 * avg), (b,), device="cuda", generator=gen).int()
    pages = ((lens + 63) // 64)
    total_pages = int(pages.sum())
    max_blocks = int(pages.max())
    perm = torch.randperm(total_pages, device="cuda", generator=gen).int()
    table = torch.zeros(b, max_blocks, dtype=torch.int32, device="cuda")
    starts = torch.cumsum(pages, 0) - pages
    col = torch.arange(max_blocks, device="cuda")[None]
    valid = col < pages[:, None]
    table[valid] = perm[(starts[:, None] + col)[valid].long()]
    cache = _fp8_bytes(total_pages, 64 * (D + 4), gen=gen)
    scales = cache[:, 64 * D:].view(torch.float32)
    scales.copy_(torch.rand(total_pages, 64, device="cuda", generator=gen) * 0.01 + 0.001)
    cache = cache.view(total_pages, 64, 1, D + 4)
    q = _fp8_bytes(b, next_n, H, D, gen=gen).view(torch.float8_e4m3fn)
    weights = torch.randn(b * next_n, H, device="cuda", generator=gen)
    return q, cache, weights, lens, table


def bench_paged(flush, rows):
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = []
    max_model_len = 111 * 1000
    for b, next_n, avg in rows:
        q, cache, weights, lens, table = paged_inputs(b, next_n, avg, gen)
        num_sms = torch.cuda.get_device_properties(0).multi_processor_count
        schedule = mla_jit.get_paged_mqa_logits_metadata(lens, 64, num_sms)
        variants = _variants(lambda pkg: pkg.fp8_paged_mqa_logits(q, cache, weights, lens, table, schedule,
                                                                  max_model_len))
        variants.append((lambda: None, lambda: mla_jit.get_paged_mqa_logits_metadata(lens, 64, num_sms)))
        t, *other, t_meta = time_interleaved(variants, flush)
        host = [host_time_us(lambda pkg=pkg: pkg.fp8_paged_mqa_logits(q, cache, weights, lens, table, schedule,
                                                                       max_model_len))
                for pkg in ([mla_jit] + ([AGAINST] if AGAINST else []))]
        sum_lens = int(lens.long().sum())
        in_bytes = q.numel() + weights.numel() * 4 + lens.numel() * 4 + sum_lens * (D + 4) + sum_lens / 64 * 4
        gbs = (in_bytes + sum_lens * next_n * 4) / t / 1e3
        tflops = 2 * sum_lens * next_n * H * D / t / 1e6
        anchor = ANCHOR_PAGED.get((b, next_n, avg)) if H == 64 else None
        out.append({"op": "fp8_paged_mqa_logits", "batch": b, "next_n": next_n, "avg_ctx": avg, "us": t,
                    "gbs": gbs, "tflops": tflops, "metadata_us": t_meta, "deepgemm_us": anchor,
                    "x_deepgemm": anchor / t if anchor else None, "against_us": other[0] if other else None,
                    "host_us": host})
        del cache, q, weights, table
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="a few rows only")
    ap.add_argument("--heads", type=int, default=64, help="query heads (DeepGEMM's figures are for 64)")
    ap.add_argument("--only", choices=("logits", "paged"), help="one op's rows only")
    ap.add_argument("--arch", help="MLA_JIT_ARCH for mla_jit (sm_80, sm_86, sm_89: the mma.sync kernels)")
    ap.add_argument("--against-package", help="also time another copy of the package importable under this name "
                    "(scripts/prepare_prev.sh), interleaved call by call")
    args = ap.parse_args()
    global AGAINST, H
    H = args.heads
    limit = None
    if args.arch:
        os.environ["MLA_JIT_ARCH"] = args.arch
        from probe_mma_sync import peak_tflops
        limit = peak_tflops("e4m3_m16n8k32" if args.arch in ("sm_89", "89") else "f16_m16n8k16")
        print(f"MLA_JIT_ARCH={args.arch}: mma.sync ceiling {limit:.1f} TFLOPS on this GPU")
    if args.against_package:
        AGAINST = importlib.import_module(args.against_package)
    flush = torch.empty(8 << 30 >> 2, dtype=torch.float32, device="cuda")   # 8 GB: flushes the L2
    logits_rows = list(ANCHOR_LOGITS)
    paged_rows = list(ANCHOR_PAGED)
    if args.quick:
        logits_rows, paged_rows = logits_rows[:3], paged_rows[:3]
    if args.only:
        logits_rows, paged_rows = (logits_rows, []) if args.only == "logits" else ([], paged_rows)
    results = bench_logits(flush, logits_rows) + bench_paged(flush, paged_rows)
    for r in results:
        r["arch"] = args.arch or "native"
        r["mma_sync_limit_tflops"] = limit
        r["of_limit"] = r["tflops"] / limit if limit else None
    print(f"{'op':22} {'shape':24} {'us':>9} {'TFLOPS':>7} {'GB/s':>6} {'DG us':>7} {'x DG':>6}"
          + ("  of mma.sync" if limit else "") + ("  against us  x against" if AGAINST else ""))
    for r in results:
        shape = (f"seq {r['seq']} kv {r['kv']}" if r["op"] == "fp8_mqa_logits"
                 else f"b {r['batch']} n {r['next_n']} ctx {r['avg_ctx']}")
        gbs = f"{r['gbs']:6.0f}" if "gbs" in r else " " * 6
        dg = f"{r['deepgemm_us']:7.1f} {r['x_deepgemm']:6.3f}" if r["deepgemm_us"] else ""
        vs = f"  {r['against_us']:10.1f} {r['against_us'] / r['us']:10.3f}" if r.get("against_us") else ""
        lim = f"  {r['of_limit']:11.1%}" if limit else ""
        print(f"{r['op']:22} {shape:24} {r['us']:9.1f} {r['tflops']:7.0f} {gbs} {dg}{lim}{vs}")
    for r in results:
        if "metadata_us" in r:
            host = " / ".join(f"{h:.1f}" for h in r["host_us"])
            print(f"b {r['batch']:5} n {r['next_n']}: metadata {r['metadata_us']:.1f} us GPU; paged call host {host} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "arch": args.arch or "native",
                       "mma_sync_limit_tflops": limit, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()

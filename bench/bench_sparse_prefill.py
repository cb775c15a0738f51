"""Sparse (DSA) prefill, flash_mla_sparse_fwd: the whole call, CUDA events, 8 GB L2 flush, median of 20,
against FlashMLA's figures measured on the H200 (../shared/ANCHORS.md: s_q 4096, h_q 128, topk 2048).
Rows at h_q 16 / 32 / 64 (V3.2 at TP8 / TP4 / TP2): FlashMLA pads to 64 heads, which costs at least
half its h_q 128 time (ANCHORS has no h_q 64 prefill figure: that half is the bound quoted). The FP8
row reads FlashMLA's 656-byte records straight from the cache (engines up-convert the cache to bf16
first; FlashMLA has no such kernel). FLOPs as FlashMLA's test counts them: 2 s_q h_q topk (d_qk + 512).

    python bench/bench_sparse_prefill.py [--arch sm_80|sm_89] [--quick] [--against-package mla_jit_prev] [--json out.json]

--against-package: another copy of the package (scripts/prepare_prev.sh) timed call by call with this one.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import torch

import mla_jit
from timing import time_interleaved  # noqa: E402  (bench/ is sys.path[0])

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from sparse_inputs import quantize_records  # noqa: E402

S_Q, TOPK = 4096, 2048
# (kv, d_qk, h_q, s_kv, FlashMLA us on the H200 at max(h_q, 64) heads: h_q 128 measured, lower a bound)
ROWS = [("bf16", 576, 128, 8192, 3480.0), ("bf16", 576, 128, 32768, 3669.0), ("bf16", 576, 128, 131072, 4033.0),
        ("bf16", 512, 128, 8192, 3307.0), ("bf16", 512, 128, 32768, 3440.0), ("bf16", 512, 128, 131072, 3921.0),
        ("bf16", 576, 64, 32768, 3669.0 / 2), ("bf16", 576, 32, 32768, 3669.0 / 2),
        ("bf16", 576, 16, 32768, 3669.0 / 2), ("fp8", 576, 128, 32768, 3669.0), ("fp8", 576, 16, 32768, 3669.0 / 2)]


def _inputs(kv_format: str, d: int, h_q: int, s_kv: int):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((S_Q, h_q, d), generator=gen, device="cuda").to(torch.bfloat16)
    kv = torch.randn((s_kv, 1, d), generator=gen, device="cuda")
    # topk distinct keys of each token (as the indexer's top-k picks them)
    indices = torch.rand((S_Q, s_kv), generator=gen, device="cuda").topk(TOPK, dim=-1).indices.int().unsqueeze(1)
    if kv_format == "fp8":
        kv = quantize_records(kv.view(s_kv // 64, 64, d))[0]
    else:
        kv = kv.to(torch.bfloat16)
    return q, kv, indices


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", help="tuning forced through MLA_JIT_ARCH (e.g. sm_80, sm_89)")
    parser.add_argument("--quick", action="store_true", help="the s_kv 32768 rows only")
    parser.add_argument("--against-package", help="a second copy of the package, timed interleaved")
    parser.add_argument("--json")
    args = parser.parse_args()
    other = importlib.import_module(args.against_package) if args.against_package else None
    if args.arch:
        os.environ["MLA_JIT_ARCH"] = args.arch
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    results = []
    print(f"{'kv':>4} {'d_qk':>4} {'h_q':>4} {'s_kv':>6} {'us':>8} {'TFLOPS':>7} {'FlashMLA us':>11} {'ratio':>6}"
          + (f" {'other us':>8} {'other/us':>8}" if other else ""))
    for kv_format, d, h_q, s_kv, anchor_us in ROWS:
        if args.quick and s_kv != 32768:
            continue
        q, kv, indices = _inputs(kv_format, d, h_q, s_kv)
        sink = torch.zeros(h_q, device="cuda")
        scale = d ** -0.5

        def caller(pkg):
            return lambda: pkg.flash_mla_sparse_fwd(q, kv, indices, scale, attn_sink=sink)
        variants = [(lambda: None, caller(mla_jit))] + ([(lambda: None, caller(other))] if other else [])
        us, *other_us = time_interleaved(variants, flush)
        flop = 2 * S_Q * h_q * TOPK * (d + 512)
        row = {"kv": kv_format, "d_qk": d, "h_q": h_q, "s_kv": s_kv, "s_q": S_Q, "topk": TOPK, "us": us,
               "tflops": flop / us / 1e6, "flashmla_us": anchor_us, "ratio": anchor_us / us,
               "arch": args.arch or "native"}
        if other:
            row.update(other_us=other_us[0], other_ratio=other_us[0] / us)
        results.append(row)
        print(f"{kv_format:>4} {d:>4} {h_q:>4} {s_kv:>6} {us:>8.1f} {row['tflops']:>7.1f} {anchor_us:>11.1f} "
              f"{row['ratio']:>6.3f}" + (f" {other_us[0]:>8.1f} {other_us[0] / us:>8.3f}" if other else ""))
        del q, kv, indices
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

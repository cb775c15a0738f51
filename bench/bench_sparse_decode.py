"""Sparse (DSA) decode over FlashMLA's FP8 records: the whole call (schedule reused, as engines do
across layers), CUDA events, 8 GB L2 flush, median of 20, against FlashMLA's figures measured on the
H200 (../shared/ANCHORS.md; at h_q 8 / 16 / 32 FlashMLA pads to 64 heads, so its time is the h_q 64 one).
FLOPs as FlashMLA's test counts them: 2 * b * s_q * h_q * topk * (576 + 512); bytes: the records read
(656 a selected token), q, out and the indices.

    python bench/bench_sparse_decode.py [--arch sm_80|sm_89] [--against-package mla_jit_prev | --against-env NAME=VALUE]
                                        [--json out.json]

--against-package: another copy of the package (scripts/prepare_prev.sh) timed call by call with this one;
--against-env: this package again with an environment setting (e.g. MLA_JIT_SM90_CLUSTER=1: the head-tile
pairs against the unpaired kernel), switched between the calls.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import torch

import mla_jit
from bench_decode import _env_setter  # noqa: E402  (bench/ is sys.path[0])
from timing import time_interleaved  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from sparse_inputs import SparseCase, make_sparse_inputs  # noqa: E402

# (b, s_q, h_q, FlashMLA us on the H200 at max(h_q, 64) heads); topk 2048, s_k ~32768.
ROWS = [(128, 1, 64, 119.7), (128, 2, 64, 227.1), (128, 1, 128, 188.0), (128, 2, 128, 364.8),
        (128, 1, 8, 119.7), (128, 1, 16, 119.7), (128, 1, 32, 119.7), (128, 2, 16, 227.1)]
TOPK, S_K = 2048, 32768


def sparse_call(b: int, s_q: int, h_q: int, topk: int, s_k: int = S_K):
    """A sparse decode call over FP8 records, this benchmark's inputs (no invalid index, no sink)."""
    q, records, _, indices, _, _ = make_sparse_inputs(SparseCase(b, s_q, h_q, topk, s_k=s_k, invalid=0.0))
    sched, _ = mla_jit.get_mla_metadata()
    return lambda: mla_jit.flash_mla_with_kvcache(q, records, None, None, 512, sched, None, is_fp8_kvcache=True,
                                                  indices=indices)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", help="tuning forced through MLA_JIT_ARCH (e.g. sm_80, sm_89)")
    contender = parser.add_mutually_exclusive_group()
    contender.add_argument("--against-package", help="a second copy of the package, timed interleaved")
    contender.add_argument("--against-env", metavar="NAME=VALUE",
                           help="this package with an environment setting, timed interleaved")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.arch:
        os.environ["MLA_JIT_ARCH"] = args.arch
    other = importlib.import_module(args.against_package) if args.against_package else None
    setups = [lambda: None, lambda: None]
    if args.against_env:
        name, sep, value = args.against_env.partition("=")
        if not sep or not name:
            parser.error("--against-env expects NAME=VALUE")
        setups = [_env_setter({name: os.environ.get(name)}), _env_setter({name: value})]
        other = mla_jit
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    results = []
    print(f"{'b':>4} {'s_q':>3} {'h_q':>4} {'us':>8} {'TFLOPS':>7} {'GB/s':>6} {'FlashMLA us':>11} {'ratio':>6}"
          + (f" {'other us':>8} {'other/us':>8}" if other else ""))
    for b, s_q, h_q, anchor_us in ROWS:
        case = SparseCase(b, s_q, h_q, TOPK, s_k=S_K, invalid=0.0)
        q, records, _, indices, _, _ = make_sparse_inputs(case)
        sink = torch.zeros(h_q, device="cuda")  # FlashMLA's figures were taken with the sink on
        def caller(pkg, setup):
            setup()   # (the schedule object is filled on the first call: under the variant's settings)
            sched, _ = pkg.get_mla_metadata()
            return lambda: pkg.flash_mla_with_kvcache(q, records, None, None, 512, sched, None, is_fp8_kvcache=True,
                                                      indices=indices, attn_sink=sink)
        variants = [(setups[0], caller(mla_jit, setups[0]))]
        if other:
            variants.append((setups[1], caller(other, setups[1])))
        us, *other_us = time_interleaved(variants, flush)
        flop = 2 * b * s_q * h_q * TOPK * (576 + 512)
        nbytes = b * s_q * TOPK * (656 + 4) + b * s_q * h_q * (576 + 512) * 2
        row = {"b": b, "s_q": s_q, "h_q": h_q, "topk": TOPK, "us": us, "tflops": flop / us / 1e6,
               "gbps": nbytes / us / 1e3, "flashmla_us": anchor_us, "ratio": anchor_us / us,
               "arch": args.arch or "native"}
        if other:
            row.update(other_us=other_us[0], other_ratio=other_us[0] / us)
        results.append(row)
        print(f"{b:>4} {s_q:>3} {h_q:>4} {us:>8.1f} {row['tflops']:>7.1f} {row['gbps']:>6.0f} {anchor_us:>11.1f} "
              f"{row['ratio']:>6.3f}" + (f" {other_us[0]:>8.1f} {row['other_ratio']:>8.3f}" if other else ""))
        del q, records, indices
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

"""Run one warm decode call per case, for `ncu` to profile (see scripts/ncu_run.sh).

Usage: python bench/profile_kernels.py B S_Q S_K H_Q [--arch sm_80] [--schedule ws] [--fp8 | --sparse TOPK]
--sparse TOPK: the sparse decode over FP8 records instead (inputs as bench_sparse_decode.py, s_k tokens).
The call is made 3 times: ncu's --launch-skip picks the last one (kernels warm, caches primed).
"""
from __future__ import annotations

import argparse
import os

import torch

import mla_jit
from bench_decode import make_inputs, quantize_e4m3
from bench_sparse_decode import sparse_call


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("b", type=int)
    parser.add_argument("s_q", type=int)
    parser.add_argument("s_k", type=int)
    parser.add_argument("h_q", type=int)
    parser.add_argument("--arch")
    parser.add_argument("--schedule")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--fp8", action="store_true", help="e4m3 q and cache (flash_mla_with_kvcache_fp8)")
    kind.add_argument("--sparse", type=int, metavar="TOPK", help="the sparse decode, topk TOPK")
    args = parser.parse_args()
    if args.arch:
        os.environ["MLA_JIT_ARCH"] = args.arch
    if args.schedule:
        os.environ["MLA_JIT_SM90_DECODE_SCHEDULE"] = args.schedule
    if args.sparse:
        call = sparse_call(args.b, args.s_q, args.h_q, args.sparse, s_k=args.s_k)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        return
    q, k_cache, block_table, lens = make_inputs(args.b, args.s_q, args.s_k, args.h_q)
    metadata, num_splits = mla_jit.get_mla_metadata(lens, args.s_q * args.h_q, 1)
    descales = {}
    if args.fp8:
        (q, descale_q), (k_cache, descale_k) = quantize_e4m3(q), quantize_e4m3(k_cache)
        descales = {"descale_q": descale_q, "descale_k": descale_k}
    for _ in range(3):
        mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, metadata, num_splits, **descales)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

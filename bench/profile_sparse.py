"""A few sparse decode calls of one shape, for hardware-counter runs (scripts/ncu_run.sh with
NCU_SCRIPT=bench/profile_sparse.py): python bench/profile_sparse.py B S_Q H_Q [TOPK] [--arch A]."""
from __future__ import annotations

import argparse
import os

import torch

from bench_sparse_decode import S_K, TOPK, sparse_call


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("b", type=int)
    parser.add_argument("s_q", type=int)
    parser.add_argument("h_q", type=int)
    parser.add_argument("topk", type=int, nargs="?", default=TOPK)
    parser.add_argument("--arch")
    args = parser.parse_args()
    if args.arch:
        os.environ["MLA_JIT_ARCH"] = args.arch
    call = sparse_call(args.b, args.s_q, args.h_q, args.topk, S_K)
    for _ in range(5):
        call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

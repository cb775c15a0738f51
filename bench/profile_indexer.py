"""Run fp8_mqa_logits a few times on one shape (bench_indexer.py's inputs), for ncu:
NCU_SCRIPT=bench/profile_indexer.py NCU_KERNEL=indexer scripts/ncu_run.sh "SEQ KV".

Usage: python3 bench/profile_indexer.py SEQ KV
"""
import argparse

import torch

import mla_jit
from bench_indexer import D, H, _fp8_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("seq", type=int)
    ap.add_argument("kv", type=int)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = _fp8_bytes(args.seq, H, D, gen=gen).view(torch.float8_e4m3fn)
    k = _fp8_bytes(args.kv, D, gen=gen).view(torch.float8_e4m3fn)
    k_scale = torch.rand(args.kv, device="cuda", generator=gen) * 0.01 + 0.001
    weights = torch.randn(args.seq, H, device="cuda", generator=gen)
    ks = torch.zeros(args.seq, dtype=torch.int32, device="cuda")
    ke = torch.arange(args.seq, dtype=torch.int32, device="cuda") + (args.kv - args.seq + 1)
    for _ in range(4):
        mla_jit.fp8_mqa_logits(q, (k, k_scale), weights, ks, ke)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

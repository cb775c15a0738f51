"""Run flash_attn_varlen_func a few times on one causal shape (for ncu: scripts/ncu_run.sh with
NCU_SCRIPT=bench/profile_prefill.py NCU_KERNEL=prefill).

Usage: python3 bench/profile_prefill.py B S H [--arch sm_80]
"""
import argparse
import os

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("b", type=int)
    ap.add_argument("s", type=int)
    ap.add_argument("h", type=int)
    ap.add_argument("--arch")
    args = ap.parse_args()
    if args.arch:
        os.environ["MLA_JIT_ARCH"] = args.arch
    import mla_jit
    total = args.b * args.s
    q = torch.randn(total, args.h, 192, device="cuda").to(torch.bfloat16)
    k = torch.randn(total, args.h, 192, device="cuda").to(torch.bfloat16)
    v = torch.randn(total, args.h, 128, device="cuda").to(torch.bfloat16)
    cu = torch.arange(0, total + 1, args.s, dtype=torch.int32, device="cuda")
    for _ in range(4):
        mla_jit.flash_attn_varlen_func(q, k, v, cu, cu, args.s, args.s, causal=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

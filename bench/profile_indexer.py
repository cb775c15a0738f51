"""Run fp8_mqa_logits or fp8_paged_mqa_logits a few times on one shape (bench_indexer.py's inputs), for ncu:
NCU_SCRIPT=bench/profile_indexer.py NCU_KERNEL=indexer scripts/ncu_run.sh "SEQ KV" "paged B NEXT_N CTX".

Usage: python3 bench/profile_indexer.py SEQ KV
       python3 bench/profile_indexer.py paged B NEXT_N AVG_CTX
"""
import sys

import torch

import mla_jit
from bench_indexer import paged_inputs, ragged_inputs


def ragged(seq: int, kv: int):
    q, k, k_scale, weights, ks, ke = ragged_inputs(seq, kv, torch.Generator(device="cuda").manual_seed(0))
    return lambda: mla_jit.fp8_mqa_logits(q, (k, k_scale), weights, ks, ke)


def paged(b: int, next_n: int, avg: int):
    q, cache, weights, lens, table = paged_inputs(b, next_n, avg, torch.Generator(device="cuda").manual_seed(1))
    schedule = mla_jit.get_paged_mqa_logits_metadata(lens, 64, torch.cuda.get_device_properties(0).multi_processor_count)
    return lambda: mla_jit.fp8_paged_mqa_logits(q, cache, weights, lens, table, schedule, 111 * 1000)


def main() -> None:
    args = sys.argv[1:]
    call = paged(*map(int, args[1:4])) if args[0] == "paged" else ragged(*map(int, args[:2]))
    for _ in range(4):
        call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

"""Where a KV tile's time goes in the sm80 family's Q-in-smem kernel (built with MLA_JIT_TRACE=1).

Usage: python bench/trace_sm80_phases.py B S_K H_Q [--arch sm_80|sm_89] [--runs N]
The kernel's lane 0 of every warp records %clock64 at 7 points of four steady-state tiles (tiles
64..67 of a CTA; decode/splitkv_sm80.cuh: PhaseTrace). This prints the median over those rows of
each phase in SM clocks, and one CTA's per-warp offsets:
  tail    PV issued -> the next tile's wait (epilogue check, cursor advance, loop)
  barA    wait for tile n + barrier A          S       S = Q K^T MMAs issued (partial, split over d)
  exch    partial-S exchange done              max+B   mask, row max, barrier B
  smax+C  softmax, P to smem, barrier C        PV      O rescale + P V MMAs issued
Inputs and L2 flush as bench_decode.py; s_q = 1. Needs a sequence long enough for 68 tiles per CTA
(e.g. 128 32768 64).
"""
from __future__ import annotations

import argparse
import os
import statistics

os.environ["MLA_JIT_TRACE"] = "1"  # before any kernel is built: part of the cache key

import torch  # noqa: E402

import mla_jit  # noqa: E402
from bench_decode import DV, make_inputs  # noqa: E402
from trace_decode import _read, _tables, traced_calls  # noqa: E402
from mla_jit.configs.decode_sm80 import sm80_decode_config  # noqa: E402
from mla_jit.jit.arch import parse_arch  # noqa: E402

PHASES = ("tail", "barA", "S", "exch", "max+B", "smax+C", "PV")
TILES = 4  # PhaseTrace::kTiles


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("b", "s_k", "h_q"):
        parser.add_argument(name, type=int)
    parser.add_argument("--arch", default="sm_80", help="the family's tuning (sets MLA_JIT_ARCH)")
    parser.add_argument("--runs", type=int, default=3, help="calls (the last one is read), at least 1")
    args = parser.parse_args()
    os.environ["MLA_JIT_ARCH"] = args.arch
    q, k_cache, block_table, lens = make_inputs(args.b, 1, args.s_k, args.h_q)
    metadata, num_splits = mla_jit.get_mla_metadata(lens, args.h_q, 1)
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    call = lambda: mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, DV, metadata, num_splits)  # noqa: E731
    call()
    torch.cuda.synchronize()
    tables = [t[1:] for t in _tables(torch.cuda.current_device()) if t[0] == "mla_jit_trace_splitkv"]
    traced_calls(tables, flush, call, args.runs)
    rows = {r[0]: r[1:] for address, nbytes in tables for r in _read(address, nbytes)}
    complete = {i: r for i, r in rows.items() if all(r[:7])}
    if not complete:
        raise SystemExit("no phase rows: a Q-in-smem sm80-family kernel (rows > 16) and >= 68 tiles per CTA?")
    spans = {name: [] for name in PHASES}
    tile_clk = []
    for i, r in complete.items():
        for k in range(6):
            spans[PHASES[k + 1]].append(r[k + 1] - r[k])
        nxt = complete.get(i + 1) if i % TILES != TILES - 1 else None
        if nxt:
            spans["tail"].append(nxt[0] - r[6])
            tile_clk.append(nxt[0] - r[0])
    print(f"== {args.b}/1/{args.s_k}/{args.h_q} {args.arch} ({torch.cuda.get_device_name(0)}): "
          f"{len(complete)} rows, tile {statistics.median(tile_clk) if tile_clk else 0:.0f} clk (median)")
    print("  " + "  ".join(f"{n} {statistics.median(v):.0f}" for n, v in spans.items() if v))
    num_warps = sm80_decode_config("bf16", q.shape[-1], DV, k_cache.shape[1], args.h_q, parse_arch(args.arch)).num_warps
    print("  first CTA, tile 65, clocks from the wait point to each mark:")
    for w in range(num_warps):
        r = complete.get(w * TILES + 1)
        if r:
            print(f"    warp {w}: " + " ".join(f"{r[k] - r[0]:6d}" for k in range(7)))


if __name__ == "__main__":
    main()

"""Where a tile's time goes in the warp-specialized wgmma kernel (splitkv_ws.cuh, built with
MLA_JIT_TRACE=1): its sparse form, or the dense decode over an e4m3 cache.

Usage: python bench/trace_ws_phases.py sparse B S_Q H_Q [--topk K] [--runs N]
       python bench/trace_ws_phases.py fp8 B S_Q S_K H_Q [--runs N]
sparse: a sparse decode over FP8 records (inputs as bench_sparse_decode.py); fp8: the dense decode
with e4m3 q and cache (inputs as bench_decode.py --fp8). 8 GB L2 flush before the traced call.
WG0's thread 0 and thread 128 (a P V warpgroup) record %clock64 at 8 points of tiles 8..15 of each
CTA (WsPhaseTrace); this prints the median over those rows, in SM clocks:
  WG0  wait    tile n's stage announced (sparse: kv_ready; fp8: TMA full)   S    S(n) issued and done
       smax    softmax, P(n) stored (sparse: and published)                 gap  to the next tile's wait
       fp8, smax's parts: soft  the softmax (and a piece end's rows)   slot  the wait for P(n)'s slot
       (P V(n - 2) done)   store  P(n) stored
  P V  sparse: deq    named barrier -> tile n + 1 de-quantized               waitP  -> P(n) arrived
       fp8:    deq    wait for tile n's bytes + V^T chunk 0 into registers   waitP  -> P(n) arrived
       pv      P V(n) (sparse: with the gather beside it; fp8: chunks 1-3's V^T loads between its wgmmas)
                                                                             loop   -> the next tile's start
       sparse crossover, deq's parts: peer  the wait for the peer's stage (peer_free)  land  the
       records' landing  conv  the conversion and the copies to the peer
       fp8, the refill by the producer (thread 128; page >= 64) beside P V(n): rel  P(n) arrived ->
       the stage released (stage_free), tma  -> its loads issued (block-table read, the TMA loads)
and the tile period (WG0's wait start to the next one's). Needs >= 16 tiles per CTA (e.g. sparse 128 1 64,
fp8 128 1 32768 16).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ["MLA_JIT_TRACE"] = "1"  # before any kernel is built: part of the cache key

import torch  # noqa: E402

import mla_jit  # noqa: E402
from trace_decode import _read, family_tables, sparse_call, traced_calls  # noqa: E402  (bench/ is sys.path[0])

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

TILES = 8  # WsPhaseTrace::kTiles


def _sparse_call(args):
    return "mla_sparse_sm90", sparse_call(*args.dims[:3], args.topk)


def _fp8_call(args):
    from decode_inputs import DecodeCase, make_fp8_inputs
    b, s_q, s_k, h_q = args.dims
    case = DecodeCase(b, s_q, s_k, h_q, causal=s_q > 1)
    q8, k8, block_table, lens, descale_q, descale_k = make_fp8_inputs(case, seed=0)
    meta, splits = mla_jit.get_mla_metadata(lens, s_q * h_q, 1)
    return "mla_decode_sm90", lambda: mla_jit.flash_mla_with_kvcache_fp8(
        q8, k8, block_table, lens, 512, meta, splits, causal=case.causal, descale_q=descale_q, descale_k=descale_k)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("sparse", "fp8"))
    parser.add_argument("dims", type=int, nargs="+", help="sparse: B S_Q H_Q; fp8: B S_Q S_K H_Q")
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3, help="calls (the last one is read), at least 1")
    args = parser.parse_args()
    if len(args.dims) != (3 if args.kind == "sparse" else 4):
        parser.error(f"{args.kind} takes {'B S_Q H_Q' if args.kind == 'sparse' else 'B S_Q S_K H_Q'}")
    family, call = (_sparse_call if args.kind == "sparse" else _fp8_call)(args)
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    call()
    torch.cuda.synchronize()
    tables = family_tables(family, "mla_jit_trace_phases", torch.cuda.current_device())
    if not tables:
        raise SystemExit(f"no {family} binary with a phase table (an sm_90a GPU?)")
    traced_calls(tables, flush, call, args.runs)
    rows = {r[0]: r[1:] for address, nbytes in tables for r in _read(address, nbytes)}
    complete = {i: r for i, r in rows.items() if all(r[:8])}
    names = ("wait", "S", "smax", "soft", "slot", "store", "gap", "deq", "peer", "land", "conv", "waitP", "pv",
             "loop", "rel", "tma", "rest", "period")
    spans = {n: [] for n in names}
    for i, r in complete.items():
        spans["wait"].append(r[1] - r[0])
        spans["S"].append(r[2] - r[1])
        spans["smax"].append(r[3] - r[2])
        if r[10] and r[11]:   # (e4m3: around the wait for P(n)'s slot)
            spans["soft"].append(r[10] - r[2])
            spans["slot"].append(r[11] - r[10])
            spans["store"].append(r[3] - r[11])
        spans["deq"].append(r[5] - r[4])
        spans["waitP"].append(r[6] - r[5])
        spans["pv"].append(r[7] - r[6])
        nxt = complete.get(i + 1) if i % TILES != TILES - 1 else None
        if nxt:
            spans["gap"].append(nxt[0] - r[3])
            spans["loop"].append(nxt[4] - r[7])
            if r[8] and r[9] and r[4] <= r[8] <= r[9] <= r[5]:   # (sparse crossover: deq's parts)
                spans["peer"].append(r[8] - r[4])
                spans["land"].append(r[9] - r[8])
                spans["conv"].append(r[5] - r[9])
            elif r[8] and r[9] and r[6] <= r[8] <= r[7]:   # (e4m3: the refill issued beside P V(n))
                spans["rel"].append(r[8] - r[6])
                spans["tma"].append(r[9] - r[8])
            elif nxt[8] and nxt[9]:   # (the refill the next tile's loop issued)
                spans["rel"].append(nxt[8] - r[7])
                spans["tma"].append(nxt[9] - nxt[8])
                spans["rest"].append(nxt[4] - nxt[9])
            spans["period"].append(nxt[0] - r[0])
    if not spans["period"]:
        raise SystemExit("no complete rows: at least 16 tiles per CTA needed")
    shape = "/".join(map(str, args.dims)) + (f" topk {args.topk}" if args.kind == "sparse" else "")
    print(f"== {args.kind} decode {shape} ({torch.cuda.get_device_name(0)}): "
          f"{len(complete)} rows, clocks (median)")
    print("  " + "  ".join(f"{n} {statistics.median(v):.0f}" for n, v in spans.items() if v))


if __name__ == "__main__":
    main()

"""Where a tile's time goes in the sparse wgmma kernel (splitkv_ws.cuh, built with MLA_JIT_TRACE=1).

Usage: python bench/trace_ws_sparse.py B S_Q H_Q [--topk K] [--runs N]
A sparse decode over FP8 records (inputs as bench_sparse_decode.py, 8 GB L2 flush). WG0's thread 0
and thread 128 (a P V warpgroup) record %clock64 at 8 points of tiles 8..15 of each CTA
(WsPhaseTrace); this prints the median over those rows, in SM clocks:
  WG0  wait    tile n's stage announced (kv_ready)      S       S(n) issued and done
       smax    softmax, P(n) stored and published       gap     to the next tile's wait
  P V  deq     named barrier -> tile n + 1 de-quantized  waitP   -> P(n) arrived
       pv      P V(n) with the gather beside it          loop    -> the next tile's barrier passed
and the tile period (WG0's wait start to the next one's). Needs >= 16 tiles per CTA (e.g. 128 1 64).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ["MLA_JIT_TRACE"] = "1"  # before any kernel is built: part of the cache key

import torch  # noqa: E402

import mla_jit  # noqa: E402
from trace_decode import _read  # noqa: E402  (bench/ is sys.path[0])
from mla_jit.errors import LaunchError  # noqa: E402
from mla_jit.jit.driver import check, cu  # noqa: E402
from mla_jit.jit.loader import global_address  # noqa: E402
from mla_jit.runtimes import registry  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from sparse_inputs import SparseCase, make_sparse_inputs  # noqa: E402

TILES = 8  # WsPhaseTrace::kTiles


def _phase_tables(device: int) -> list[tuple[int, int]]:
    found = []
    for binary in list(registry.get("mla_sparse_sm90")._binaries.values()):
        try:
            found.append(global_address(binary, "mla_jit_trace_phases", device))
        except LaunchError:  # built without the table
            pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("b", "s_q", "h_q"):
        parser.add_argument(name, type=int)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3, help="calls (the last one is read), at least 1")
    args = parser.parse_args()
    case = SparseCase(args.b, args.s_q, args.h_q, args.topk, s_k=32768, invalid=0.0)
    q, records, _, indices, _, _ = make_sparse_inputs(case)
    sched, _ = mla_jit.get_mla_metadata()
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    call = lambda: mla_jit.flash_mla_with_kvcache(q, records, None, None, 512, sched, None,  # noqa: E731
                                                  is_fp8_kvcache=True, indices=indices)
    call()
    torch.cuda.synchronize()
    tables = _phase_tables(torch.cuda.current_device())
    if not tables:
        raise SystemExit("no mla_sparse_sm90 binary with a phase table: h_q above 16 on sm_90a?")
    for _ in range(max(1, args.runs)):
        for address, nbytes in tables:
            check(cu().cuMemsetD8(address, 0, nbytes), "clearing a trace table")
        flush.zero_()
        call()
        torch.cuda.synchronize()
    rows = {r[0]: r[1:] for address, nbytes in tables for r in _read(address, nbytes)}
    complete = {i: r for i, r in rows.items() if all(r[:8])}
    names = ("wait", "S", "smax", "gap", "deq", "waitP", "pv", "loop", "period")
    spans = {n: [] for n in names}
    for i, r in complete.items():
        spans["wait"].append(r[1] - r[0])
        spans["S"].append(r[2] - r[1])
        spans["smax"].append(r[3] - r[2])
        spans["deq"].append(r[5] - r[4])
        spans["waitP"].append(r[6] - r[5])
        spans["pv"].append(r[7] - r[6])
        nxt = complete.get(i + 1) if i % TILES != TILES - 1 else None
        if nxt:
            spans["gap"].append(nxt[0] - r[3])
            spans["loop"].append(nxt[4] - r[7])
            spans["period"].append(nxt[0] - r[0])
    if not spans["period"]:
        raise SystemExit("no complete rows: at least 16 tiles per CTA needed")
    print(f"== sparse decode {args.b}/{args.s_q}/{args.h_q} topk {args.topk} ({torch.cuda.get_device_name(0)}): "
          f"{len(complete)} rows, clocks (median)")
    print("  " + "  ".join(f"{n} {statistics.median(v):.0f}" for n, v in spans.items() if v))


if __name__ == "__main__":
    main()

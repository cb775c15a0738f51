"""Per-CTA timeline of one decode call (kernels built with MLA_JIT_TRACE=1): where a call's time goes.

Usage: python bench/trace_decode.py B S_Q S_K H_Q [--causal] [--schedule S] [--cluster C] [--runs N]
                                     [--rows-out PATH] [--sparse-topk K]
Inputs and L2 flush as bench_decode.py (FlashMLA's recipe, an 8 GB zero_ before each call). With
--sparse-topk: the sparse decode over FP8 records instead (inputs as bench_sparse_decode.py: topk K
of S_K cache tokens a sequence, no invalid index), the same kernel body and combine. The sm90
ws split-KV kernel (ws and ws_unfused schedules) and the combine kernel record %globaltimer at a
few events per CTA (decode/common.cuh: TraceSplitKV, TraceCombine); the sm80 family records phase
rows instead (bench/trace_sm80_phases.py reads those), other kernels nothing.
This prints, for the last of N runs, each event's spread across CTAs in us from the first CTA's
entry and the combine kernel's. --rows-out writes every CTA's row as CSV: kernel, cta (linear
block index x + gridDim.x (y + gridDim.y z)), then columns c0..c7 = the kernel's events in enum
order (split-KV: entry, tile0, first_q, wg0_done, pv_done, exit, tiles, smid; combine: entry,
go, done, splits), raw %globaltimer ns or values, 0 = not recorded.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics

os.environ["MLA_JIT_TRACE"] = "1"  # before any kernel is built: part of the cache key

import torch  # noqa: E402

import mla_jit  # noqa: E402
from bench_decode import make_inputs  # noqa: E402
from bench_sparse_decode import sparse_call  # noqa: E402,F401  (trace_ws_phases takes it from here)
from mla_jit.errors import LaunchError  # noqa: E402
from mla_jit.jit.driver import check, cu  # noqa: E402
from mla_jit.jit.loader import global_address  # noqa: E402
from mla_jit.runtimes import registry  # noqa: E402

EVENTS = 12  # kTraceEvents (common/trace.cuh)
SPLITKV = ("entry", "tile0", "first_q", "wg0_done", "pv_done", "exit", "tiles", "smid")
COMBINE = ("entry", "go", "done", "splits")


def _tables(device: int) -> list[tuple[str, int, int]]:
    """(symbol, address, bytes) of the trace tables of every decode binary this process loaded
    (only the launched one's record anything: all are cleared before a run)."""
    return [(symbol, *table) for name in ("mla_decode_sm90", "mla_decode_sm80", "mla_sparse_sm90")
            for symbol in ("mla_jit_trace_splitkv", "mla_jit_trace_combine")
            for table in family_tables(name, symbol, device)]


def family_tables(family: str, symbol: str, device: int) -> list[tuple[int, int]]:
    """(address, bytes) of the table `symbol` in each binary of `family` this process loaded."""
    found = []
    for binary in list(registry.get(family)._binaries.values()):
        try:
            found.append(global_address(binary, symbol, device))
        except LaunchError:  # built without the table
            pass
    return found


def traced_calls(tables: list[tuple[int, int]], flush: torch.Tensor, call, runs: int) -> None:
    """`runs` times (at least once): clear the tables, flush the L2, call; the last call's rows stay."""
    for _ in range(max(1, runs)):
        for address, nbytes in tables:
            check(cu().cuMemsetD8(address, 0, nbytes), "clearing a trace table")
        flush.zero_()
        call()
        torch.cuda.synchronize()


def _read(address: int, nbytes: int) -> list[list[int]]:
    raw = (ctypes.c_uint64 * (nbytes // 8))()
    check(cu().cuMemcpyDtoH(ctypes.addressof(raw), address, nbytes), "reading a trace table")
    rows = [list(raw[i:i + EVENTS]) for i in range(0, len(raw), EVENTS)]
    return [[cta, *r] for cta, r in enumerate(rows) if r[0]]  # [cta, events...] of CTAs that ran


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    q = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return f"min {min(values):8.2f}  p10 {q[0]:8.2f}  med {statistics.median(values):8.2f}  p90 {q[-1]:8.2f}  max {max(values):8.2f}"


def _dense_call(args):
    q, k_cache, block_table, lens = make_inputs(args.b, args.s_q, args.s_k, args.h_q)
    metadata, num_splits = mla_jit.get_mla_metadata(lens, args.s_q * args.h_q, 1)
    return lambda: mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, metadata, num_splits,
                                                  causal=args.causal)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("b", "s_q", "s_k", "h_q"):
        parser.add_argument(name, type=int)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--schedule", help="MLA_JIT_SM90_DECODE_SCHEDULE")
    parser.add_argument("--cluster", help="MLA_JIT_SM90_CLUSTER")
    parser.add_argument("--runs", type=int, default=5, help="calls (the last one is read), at least 1")
    parser.add_argument("--rows-out")
    parser.add_argument("--sparse-topk", type=int, help="trace the sparse decode (topk K) instead")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.schedule:
        os.environ["MLA_JIT_SM90_DECODE_SCHEDULE"] = args.schedule
    if args.cluster:
        os.environ["MLA_JIT_SM90_CLUSTER"] = args.cluster
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")  # 8 GB, as bench_decode.py
    call = (sparse_call(args.b, args.s_q, args.h_q, args.sparse_topk, args.s_k) if args.sparse_topk
            else _dense_call(args))
    call()
    torch.cuda.synchronize()
    tables = _tables(torch.cuda.current_device())
    if not tables:
        raise SystemExit("no trace tables found: is this an sm90 ws or combine kernel built with MLA_JIT_TRACE=1?")
    for _ in range(args.runs):
        for _, address, nbytes in tables:
            check(cu().cuMemsetD8(address, 0, nbytes), "clearing a trace table")
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
    print(f"== {args.b}/{args.s_q}/{args.s_k}/{args.h_q} ({torch.cuda.get_device_name(0)}): "
          f"call {start.elapsed_time(end) * 1e3:.1f} us (CUDA events, last run)")
    rows: dict[str, list[list[int]]] = {}
    for symbol, address, nbytes in tables:
        recorded = _read(address, nbytes)
        if recorded and symbol in rows:
            raise SystemExit(f"two loaded binaries recorded {symbol}: run one configuration per process")
        if recorded:
            rows[symbol] = recorded
    sk, cb = rows.get("mla_jit_trace_splitkv", []), rows.get("mla_jit_trace_combine", [])
    if not sk:
        raise SystemExit("the split-KV kernel recorded nothing (not the ws schedule?)")
    sk, cb = [r[1:] for r in sk], [r[1:] for r in cb]
    ctas = {"splitkv": [r[0] for r in rows.get("mla_jit_trace_splitkv", [])],
            "combine": [r[0] for r in rows.get("mla_jit_trace_combine", [])]}
    t0 = min(r[0] for r in sk)
    us = lambda t: (t - t0) / 1e3  # noqa: E731
    print(f"split-KV kernel: {len(sk)} CTAs; times in us from the first CTA's entry")
    for i, name in enumerate(SPLITKV[:6]):
        print(f"  {name:9s} {_spread([us(r[i]) for r in sk if r[i]])}")
    tiles = [r[6] for r in sk]
    busy = [(r[4] - r[1]) / 1e3 / r[6] for r in sk if r[6] and r[1] and r[4]]
    print(f"  tiles     {_spread([float(t) for t in tiles])}")
    print(f"  us/tile   {_spread(busy)}  ((pv_done - tile0) / tiles: fill and O stores included)")
    print(f"  kernel span {us(max(r[5] for r in sk)):.2f} us; SMs used {len({r[7] for r in sk})}")
    if cb:
        print(f"combine kernel: {len(cb)} CTAs")
        for i, name in enumerate(COMBINE[:3]):
            print(f"  {name:9s} {_spread([us(r[i]) for r in cb if r[i]])}")
        print(f"  splits    {_spread([float(r[3]) for r in cb])}")
    if args.rows_out:
        with open(args.rows_out, "w") as f:
            f.write("kernel,cta," + ",".join(f"c{i}" for i in range(EVENTS)) + "\n")
            for kernel, table in (("splitkv", sk), ("combine", cb)):
                for cta, r in zip(ctas[kernel], table):
                    f.write(f"{kernel},{cta}," + ",".join(str(v) for v in r) + "\n")


if __name__ == "__main__":
    main()

"""Where a fp8_paged_mqa_logits call's time goes, CTA by CTA (paged_logits_sm90.cuh built with
MLA_JIT_TRACE=1: PagedTrace, %globaltimer in ns). After an L2 flush, like the benchmark's calls;
inputs as bench_indexer.py's. Prints, over the CTAs, the spread of each event's time from the
kernel's first CTA start (the first K load issued, the first tile landed and computed, the last
load issued, the last logits stored) and of each CTA's streaming rate between its first tile's
arrival and its last load, which says whether a short call (batch 64) loses its time at the start,
in the steady state, or at the tail.

Usage: python3 bench/trace_paged_indexer.py B NEXT_N AVG_CTX [--runs N]
"""
from __future__ import annotations

import argparse
import os
import statistics

os.environ["MLA_JIT_TRACE"] = "1"  # before any kernel is built: part of the cache key

import torch  # noqa: E402

import mla_jit  # noqa: E402
from bench_indexer import D, paged_inputs  # noqa: E402  (bench/ is sys.path[0])
from trace_decode import _read, _spread, family_tables, traced_calls  # noqa: E402

START, FIRST_LOAD, FIRST_LANDED, FIRST_MMA, LAST_LOAD, LAST_STORE, SM, TILES = range(8)
TILE_BYTES = 64 * (D + 4)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("b", "next_n", "avg_ctx"):
        parser.add_argument(name, type=int)
    parser.add_argument("--runs", type=int, default=3, help="calls (the last one is read), at least 1")
    args = parser.parse_args()
    q, cache, weights, lens, table = paged_inputs(args.b, args.next_n, args.avg_ctx,
                                                  torch.Generator(device="cuda").manual_seed(1))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    schedule = mla_jit.get_paged_mqa_logits_metadata(lens, 64, sms)
    max_len = int(lens.max()) + 64

    def call():
        mla_jit.fp8_paged_mqa_logits(q, cache, weights, lens, table, schedule, max_len)

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    call()
    torch.cuda.synchronize()
    tables = family_tables("indexer_paged_sm90", "mla_jit_trace_indexer", torch.cuda.current_device())
    if not tables:
        raise SystemExit("no indexer_paged_sm90 binary with a trace table (an sm_90a GPU?)")
    traced_calls(tables, flush, call, args.runs)
    rows = [r[1:] for address, nbytes in tables for r in _read(address, nbytes)]
    working = [r for r in rows if r[TILES] > 0 and all(r[:LAST_STORE + 1])]
    if not working:
        raise SystemExit("no CTA with tiles traced")
    t0 = min(r[START] for r in rows)
    us = lambda r, e: (r[e] - t0) / 1e3  # noqa: E731
    print(f"== fp8_paged_mqa_logits b {args.b} next_n {args.next_n} avg ctx {args.avg_ctx} "
          f"({torch.cuda.get_device_name(0)}): {len(rows)} CTAs, {len(working)} with tiles; us from the first start")
    for name, e in (("start", START), ("first load issued", FIRST_LOAD), ("first tile landed", FIRST_LANDED),
                    ("first wgmma done", FIRST_MMA), ("last load issued", LAST_LOAD), ("last logits stored", LAST_STORE)):
        print(f"  {name:<20} {_spread([us(r, e) for r in working])}")
    print(f"  {'tiles a CTA':<20} {_spread([float(r[TILES]) for r in working])}")
    rates = [r[TILES] * TILE_BYTES / (r[LAST_LOAD] - r[FIRST_LANDED]) for r in working
             if r[LAST_LOAD] > r[FIRST_LANDED] and r[TILES] > 12]
    if rates:   # bytes / ns = GB/s a CTA; times the CTAs: the device's
        print(f"  {'GB/s a CTA':<20} {_spread(rates)}  (x {len(working)} CTAs = {statistics.median(rates) * len(working):.0f})")
    span = (max(r[LAST_STORE] for r in working) - t0) / 1e3
    print(f"  kernel span (first start -> last store) {span:.1f} us")


if __name__ == "__main__":
    main()

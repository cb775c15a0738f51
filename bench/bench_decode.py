"""Dense MLA decode vs FlashMLA's H200 figures (the project's anchor table), same recipe and formulas.

Inputs as FlashMLA's dense decode test: d=576, dv=512, h_kv=1, page 64, randomly permuted block
table, varlen lengths ~ Normal(s_k, s_k/2) clipped at s_q (seed 0), q and k ~ N(0, 0.1^2) clipped
to [-1, 1]. Time: the whole call (metadata computed once and reused; split-KV + combine), CUDA
events, L2 flushed before each of 20 iterations, median.
Usage: python bench/bench_decode.py [--json PATH] [--rows N] [--schedule S] [--arch A]
                                    [--against S | --against-env NAME=VALUE | --against-package NAME]
                                    [--spec-rows | --fp8]
--against S times the sm90 schedule S too, interleaved call by call with the default one (A B A B),
and prints the ratio: the way to compare two kernels (clocks drift between runs and machines).
--against-env NAME=VALUE does the same for a kernel picked by an environment variable (e.g.
MLA_JIT_SM90_DECODE_SCHEDULE=ws_unfused), the first variant keeping the variable as the process has it.
--against-package NAME does the same for another copy of the package importable as NAME (e.g. the
previous commit's mla_jit extracted as mla_jit_prev: scripts/gpu_run.sh PREV=<commit>), host times too.
--fp8 times our bf16 decode, our FP8 decode (the same values quantized to e4m3 with per-tensor
scales, flash_mla_with_kvcache_fp8) and our bf16 q over that e4m3 cache ("kv8", de-quantized on
chip) interleaved call by call, on the anchor rows and the s_q 1-16 rows of --spec-rows, with the
ratios bf16 us / FP8 us and bf16 us / kv8 us; GB/s counts 1-byte q and cache (out is bf16).
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os

import importlib

import torch

import mla_jit
from timing import host_times_interleaved, time_interleaved  # noqa: E402  (bench/ is sys.path[0])

COPY_GBPS = 4273.0      # H200 copy bandwidth (read + write), measured with the anchors
MATMUL_TFLOPS = 790.0   # H200 bf16 matmul, measured with the anchors

# b, s_q, s_k, h_q, causal, FlashMLA us (the anchor table, H200)
ANCHOR_ROWS = [
    (128, 1, 4096, 128, 0, 253.7), (128, 1, 8192, 128, 0, 463.5), (128, 1, 16384, 128, 0, 885.7),
    (128, 1, 32768, 128, 0, 1731.1), (128, 2, 4096, 128, 0, 438.4), (128, 2, 8192, 128, 0, 831.7),
    (128, 2, 16384, 128, 0, 1611.8), (128, 2, 32768, 128, 0, 3182.2), (128, 2, 4096, 128, 1, 439.9),
    (128, 2, 32768, 128, 1, 3430.7), (32, 1, 4096, 16, 0, 55.1), (32, 1, 32768, 16, 0, 311.2),
    (32, 1, 4096, 32, 0, 56.3), (32, 1, 32768, 32, 0, 313.7), (32, 1, 4096, 64, 0, 60.0),
    (32, 1, 32768, 64, 0, 317.7), (128, 1, 4096, 16, 0, 175.0), (128, 1, 32768, 16, 0, 1160.3),
    (128, 1, 4096, 32, 0, 178.0), (128, 1, 32768, 32, 0, 1166.9), (128, 1, 4096, 64, 0, 185.1),
    (128, 1, 32768, 64, 0, 1190.0),
]
# vLLM's FP8 decode (flash_mla_with_kvcache_fp8, the FP8 peer), ANCHORS.md's H200 table:
# (b, s_q, s_k, h_q) -> us, causal for s_q > 1 (at s_q 1 the mask is empty).
VLLM_FP8_US = {
    (32, 1, 4096, 64): 51.6, (32, 1, 32768, 32): 214.0, (32, 1, 32768, 64): 219.0, (128, 1, 4096, 16): 134.8,
    (128, 1, 4096, 32): 141.1, (128, 1, 4096, 64): 168.6, (128, 1, 32768, 16): 798.1, (128, 1, 32768, 32): 803.5,
    (128, 1, 32768, 64): 809.7, (128, 1, 4096, 128): 237.3, (128, 4, 4096, 128): 955.8, (128, 4, 4096, 16): 141.6,
    (128, 8, 4096, 16): 238.8, (128, 16, 4096, 16): 443.2, (128, 8, 4096, 128): 1954.7, (128, 16, 4096, 128): 3457.2,
}
D, DV, H_KV, PAGE = 576, 512, 1, 64
# Speculative decoding shapes (b, s_q, s_k, h_q, causal): s_q 1, 4, 8, 16 query tokens a sequence.
SPEC_SHAPES = [(128, s_q, s_k, h_q, int(s_q > 1)) for h_q, s_k in itertools.product((16, 128), (1024, 4096))
               for s_q in (1, 4, 8, 16)]
E4M3_MAX = 448.0


def make_inputs(b, s_q, s_k, h_q, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.normal(float(s_k), s_k / 2, (b,), generator=gen).clamp(min=s_q).round().to(torch.int32)
    max_blocks = math.ceil(int(lens.max()) / 256) * 256 // PAGE
    block_table = torch.randperm(b * max_blocks, generator=gen).view(b, max_blocks).to(torch.int32).cuda()
    torch.manual_seed(seed)
    q = (torch.randn(b, s_q, h_q, D, device="cuda") * 0.1).clamp_(-1, 1).to(torch.bfloat16)
    k_cache = torch.empty(b * max_blocks, PAGE, H_KV, D, device="cuda", dtype=torch.bfloat16)
    for chunk in k_cache.split(4096):  # fill in chunks: no fp32 copy of the whole cache
        chunk.copy_((torch.randn(chunk.shape, device="cuda") * 0.1).clamp_(-1, 1))
    return q, k_cache, block_table, lens.cuda()


def quantize_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in e4m3 with a per-tensor scale, amax / 448, as an engine stores it; the float32 (1,)
    descale), converted in chunks: no fp32 copy of a whole cache."""
    descale = (torch.stack([chunk.abs().amax() for chunk in x.split(4096)]).max().float() / E4M3_MAX).reshape(1)
    x8 = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    for src, dst in zip(x.split(4096), x8.split(4096)):
        dst.copy_(src.float() / descale)
    return x8, descale


def flop_and_bytes(b: int, s_q: int, h_q: int, lens: torch.Tensor, elem_bytes: int = 2) -> tuple[float, float]:
    """FlashMLA's formulas (mean = mean of cache_seqlens): q and cache of `elem_bytes`-byte
    elements, out bf16 (2 bytes) whatever they are."""
    mean = lens.float().mean().item()
    flop = b * h_q * s_q * (2 * D * mean + 2 * mean * DV)
    nbytes = b * (s_q * h_q * D * elem_bytes + mean * H_KV * D * elem_bytes + s_q * h_q * DV * 2)
    return flop, nbytes


def _env_setter(values: dict[str, str | None]):
    """A setup that sets (or, for None, removes) these environment variables."""
    def setup():
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return setup


def spec_rows(flush: torch.Tensor, json_path: str | None) -> None:
    """Many query tokens a sequence (speculative decoding): the call's time and its time per query
    token against s_q = 1 and 4 on the same shape (it should fall as s_q grows)."""
    rows = []
    print(f"{'b':>4s} {'h_q':>4s} {'s_k':>5s} {'s_q':>3s} {'us':>8s} {'us/token':>8s} {'TFLOPS':>7s} {'GB/s':>6s}")
    for b, s_q, s_k, h_q, causal in SPEC_SHAPES:
        q, k_cache, block_table, lens = make_inputs(b, s_q, s_k, h_q)
        metadata, num_splits = mla_jit.get_mla_metadata(lens, s_q * h_q // H_KV, H_KV)
        call = functools.partial(mla_jit.flash_mla_with_kvcache, q, k_cache, block_table, lens, DV, metadata,
                                 num_splits, causal=bool(causal))
        (us,) = time_interleaved([(lambda: None, call)], flush)
        flop, nbytes = flop_and_bytes(b, s_q, h_q, lens)
        rows.append({"b": b, "h_q": h_q, "s_k": s_k, "s_q": s_q, "us": us, "us_per_token": us / s_q,
                     "tflops": flop / us / 1e6, "gbps": nbytes / us / 1e3})
        print(f"{b:4d} {h_q:4d} {s_k:5d} {s_q:3d} {us:8.1f} {us / s_q:8.1f} {flop / us / 1e6:7.1f} "
              f"{nbytes / us / 1e3:6.0f}", flush=True)
        del q, k_cache, block_table
        torch.cuda.empty_cache()
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "spec_rows": rows}, f, indent=1)


def fp8_rows(flush: torch.Tensor, json_path: str | None, anchor_rows: int, against=None, setups=None) -> None:
    """Our bf16 decode, our FP8 decode (e4m3 q and cache) and our bf16 q over the e4m3 cache, on the
    same inputs (the FP8 ones quantized from the bf16 ones), interleaved call by call: the anchor
    rows, then SPEC_SHAPES. TFLOPS and GB/s are the FP8 decode's (1-byte q and cache); "x vLLM" is
    vLLM's FP8 decode time on that shape (ANCHORS.md, VLLM_FP8_US) over ours. `against` (another copy
    of the package, or this one under another environment): its FP8 decode too, in the same
    interleaving; setups: (ours, the contender's) environment setters, run before each call."""
    ours, theirs = setups or (lambda: None, lambda: None)
    shapes = list(dict.fromkeys([row[:5] for row in ANCHOR_ROWS[:anchor_rows]] + SPEC_SHAPES))
    rows = []
    print(f"{'b':>4} {'sq':>2} {'sk':>6} {'hq':>4} {'c':>1} {'bf16 us':>8} {'fp8 us':>8} {'ratio':>6} "
          f"{'TFLOPS':>7} {'GB/s':>6} {'kv8 us':>8} {'ratio':>6} {'x vLLM':>6}"
          + (f" {'vs fp8 us':>9} {'ratio':>6}" if against else ""))
    for b, s_q, s_k, h_q, causal in shapes:
        q, k_cache, block_table, lens = make_inputs(b, s_q, s_k, h_q)
        (q8, descale_q), (k8, descale_k) = quantize_e4m3(q), quantize_e4m3(k_cache)
        metadata, num_splits = mla_jit.get_mla_metadata(lens, s_q * h_q // H_KV, H_KV)
        common = (block_table, lens, DV, metadata, num_splits)
        bf16 = functools.partial(mla_jit.flash_mla_with_kvcache, q, k_cache, *common, causal=bool(causal))
        fp8 = functools.partial(mla_jit.flash_mla_with_kvcache_fp8, q8, k8, *common, causal=bool(causal),
                                descale_q=descale_q, descale_k=descale_k)
        kv8 = functools.partial(mla_jit.flash_mla_with_kvcache, q, k8, *common, causal=bool(causal),
                                descale_k=descale_k)
        calls = [(ours, bf16), (ours, fp8), (ours, kv8)]
        if against is not None:
            calls.append((theirs, functools.partial(
                against.flash_mla_with_kvcache_fp8, q8, k8, *common, causal=bool(causal), descale_q=descale_q,
                descale_k=descale_k)))
        bf16_us, fp8_us, kv8_us, *vs_us = time_interleaved(calls, flush)
        flop, nbytes = flop_and_bytes(b, s_q, h_q, lens, elem_bytes=1)
        vllm_us = VLLM_FP8_US.get((b, s_q, s_k, h_q)) if causal == int(s_q > 1) else None
        rows.append({"b": b, "s_q": s_q, "s_k": s_k, "h_q": h_q, "causal": causal, "bf16_us": bf16_us,
                     "us": fp8_us, "ratio": bf16_us / fp8_us, "tflops": flop / fp8_us / 1e6,
                     "gbps": nbytes / fp8_us / 1e3, "kv8_us": kv8_us, "kv8_ratio": bf16_us / kv8_us,
                     "vllm_fp8_us": vllm_us, **({"against_fp8_us": vs_us[0]} if vs_us else {})})
        x_vllm = f"{vllm_us / fp8_us:6.3f}" if vllm_us else f"{'-':>6}"
        print(f"{b:>4} {s_q:>2} {s_k:>6} {h_q:>4} {causal:>1} {bf16_us:8.1f} {fp8_us:8.1f} {bf16_us / fp8_us:6.3f} "
              f"{flop / fp8_us / 1e6:7.0f} {nbytes / fp8_us / 1e3:6.0f} {kv8_us:8.1f} {bf16_us / kv8_us:6.3f} {x_vllm}"
              + (f" {vs_us[0]:9.1f} {vs_us[0] / fp8_us:6.3f}" if vs_us else ""), flush=True)
        del q, k_cache, q8, k8, block_table
        torch.cuda.empty_cache()
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "fp8_rows": rows}, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--rows", type=int, default=len(ANCHOR_ROWS), help="anchor rows to time (0: host times only)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--spec-rows", action="store_true",
                      help="only the speculative-decoding rows: b 128, h_q 16 / 128, s_k 1024 / 4096, s_q 1, 4, "
                      "8, 16 (causal above 1), with the time per query token")
    mode.add_argument("--fp8", action="store_true",
                      help="only bf16 against FP8 (e4m3 q and cache) decode, interleaved: the anchor rows (--rows) "
                      "and the --spec-rows shapes")
    parser.add_argument("--arch", help="kernel family tuning, e.g. sm_80 or sm_89 (sets MLA_JIT_ARCH); "
                        "default: the GPU's own")
    parser.add_argument("--schedule", choices=("ws", "ws_unfused"),
                        help="sm90 split-KV schedule (sets MLA_JIT_SM90_DECODE_SCHEDULE)")
    contender = parser.add_mutually_exclusive_group()
    contender.add_argument("--against", choices=("ws", "ws_unfused"),
                           help="also time this sm90 schedule, interleaved with the first, and print the ratio")
    contender.add_argument("--against-env", metavar="NAME=VALUE",
                           help="also time the kernel this environment setting picks, interleaved, with the ratio")
    contender.add_argument("--against-package", metavar="NAME",
                           help="also time this importable copy of the package (e.g. mla_jit_prev), interleaved")
    args = parser.parse_args()
    if args.arch:
        os.environ["MLA_JIT_ARCH"] = args.arch
    if args.schedule:
        os.environ["MLA_JIT_SM90_DECODE_SCHEDULE"] = args.schedule
    schedule_var = "MLA_JIT_SM90_DECODE_SCHEDULE"
    first = {schedule_var: args.schedule or os.environ.get(schedule_var)}
    contender = None
    if args.against:
        contender = {schedule_var: args.against}
    elif args.against_env:
        name, sep, value = args.against_env.partition("=")
        if not sep or not name:
            parser.error("--against-env expects NAME=VALUE")
        first[name] = os.environ.get(name)
        contender = {**first, name: value}
    packages = [mla_jit]
    if args.against_package:
        packages.append(importlib.import_module(args.against_package))
        contender = dict(first)
    args.against = args.against or args.against_env or args.against_package
    variants = [_env_setter(first)] + ([_env_setter(contender)] if contender else [])
    pkg_of = [packages[min(k, len(packages) - 1)] for k in range(len(variants))]
    # 8 GB, as the anchor FlashMLA figures were taken (2 GB until session 11; interleaved on the
    # H200, the two gave the same times within 0.7% on every row).
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    if args.spec_rows:
        spec_rows(flush, args.json)
        return
    if args.fp8:
        fp8_rows(flush, args.json, args.rows, pkg_of[1] if contender else None,
                 (variants[0], variants[-1]))
        return
    results = []
    for b, s_q, s_k, h_q, causal, anchor_us in ANCHOR_ROWS[:args.rows]:
        q, k_cache, block_table, lens = make_inputs(b, s_q, s_k, h_q)

        def make_call(pkg, setup):
            setup()
            metadata, num_splits = pkg.get_mla_metadata(lens, s_q * h_q // H_KV, H_KV)
            return lambda: pkg.flash_mla_with_kvcache(q, k_cache, block_table, lens, DV, metadata, num_splits,
                                                      causal=bool(causal))
        calls = [(setup, make_call(pkg, setup)) for setup, pkg in zip(variants, pkg_of)]
        us, *against = time_interleaved(calls, flush)
        variants[0]()
        flop, nbytes = flop_and_bytes(b, s_q, h_q, lens)
        tflops, gbps = flop / us / 1e6, nbytes / us / 1e3
        roofline = max(tflops / MATMUL_TFLOPS, gbps / COPY_GBPS)
        results.append({"b": b, "s_q": s_q, "s_k": s_k, "h_q": h_q, "causal": causal, "us": us,
                        "tflops": tflops, "gbps": gbps, "flashmla_us": anchor_us, "ratio": anchor_us / us,
                        "roofline_fraction": roofline, **({"against_us": against[0]} if against else {})})
        del q, k_cache, block_table
        torch.cuda.empty_cache()

    # Host time: a shape whose GPU time (~10 us) is well below the host time, so that the launch
    # queue never fills and blocks the host ((4, 1, 512, 16) was ~20 us of GPU time, too close).
    q, k_cache, block_table, lens = make_inputs(1, 1, 256, 16)
    fns = {}
    for tag, pkg in zip(("", "against_"), packages):
        metadata, num_splits = pkg.get_mla_metadata(lens, 16, 1)
        fns[tag + "decode_call_us"] = functools.partial(pkg.flash_mla_with_kvcache, q, k_cache, block_table, lens,
                                                        DV, metadata, num_splits)
        fns[tag + "metadata_call_us"] = functools.partial(pkg.get_mla_metadata, lens, 16, 1)
    # FlashMLA's current API, as an engine's later layers call it: the schedule object already filled.
    sched, _ = mla_jit.get_mla_metadata()
    mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, DV, sched, None)
    fns["decode_call_lazy_schedule_us"] = functools.partial(mla_jit.flash_mla_with_kvcache, q, k_cache, block_table,
                                                            lens, DV, sched, None)
    # The torch custom op called directly (what a torch.compile'd graph runs), for the dispatcher's cost.
    metadata, num_splits = mla_jit.get_mla_metadata(lens, 16, 1)
    fns["decode_torch_op_us"] = functools.partial(torch.ops.mla_jit.flash_mla_with_kvcache, q, k_cache, block_table,
                                                  lens, DV, metadata, num_splits)
    host = host_times_interleaved(fns)
    report = {"gpu": torch.cuda.get_device_name(0), "rows": results, "host": host,
              **({"against": args.against} if args.against else {})}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    report["arch"] = (args.arch or "native") + (f", {args.schedule}" if args.schedule else "")
    print(f"\n== dense MLA decode vs FlashMLA ({report['gpu']}, kernels: {report['arch']}) ==")
    against_hdr = f" {args.against + ' us':>11} {'ratio':>6}" if args.against else ""
    print(f"{'b':>4} {'sq':>2} {'sk':>6} {'hq':>4} {'c':>1} {'us':>8} {'TFLOPS':>7} {'GB/s':>6} "
          f"{'FlashMLA':>8} {'ratio':>6} {'roof':>5}" + against_hdr)
    for r in results:
        extra = f" {r['against_us']:11.1f} {r['against_us'] / r['us']:6.3f}" if args.against else ""
        print(f"{r['b']:>4} {r['s_q']:>2} {r['s_k']:>6} {r['h_q']:>4} {r['causal']:>1} {r['us']:8.1f} "
              f"{r['tflops']:7.0f} {r['gbps']:6.0f} {r['flashmla_us']:8.1f} {r['ratio']:6.2f} "
              f"{r['roofline_fraction']:5.2f}" + extra)
    print("host times interleaved round by round (sleep kernel holds the GPU; median of 30 rounds of 200 calls)")
    print(f"host time per warm call: decode {host['decode_call_us']:.1f} us, metadata {host['metadata_call_us']:.1f} us, "
          f"decode with a filled FlashMLASchedMeta {host['decode_call_lazy_schedule_us']:.1f} us, "
          f"torch.ops.mla_jit decode {host['decode_torch_op_us']:.1f} us")
    if "against_decode_call_us" in host:
        print(f"host time per warm call, {args.against_package}: decode {host['against_decode_call_us']:.1f} us, "
              f"metadata {host['against_metadata_call_us']:.1f} us")


if __name__ == "__main__":
    main()

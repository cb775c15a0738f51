"""MHA-mode MLA prefill (q/k 192, v 128) against torch's scaled_dot_product_attention, interleaved
call by call in one run: cuDNN (takes dv 128 natively) and the flash backend with V zero-padded to
192 (what vLLM does on Ampere/Ada). CUDA events, L2 flushed before each call, median of 20.

FLOPs = 2 * h * sum over sequences of n_q * n_k * (192 + 128), halved where causal with n_q = n_k
(ANCHORS.md). Rows: the issue's causal b x s x h, a varlen batch (32 sequences, 256..8192 tokens;
the peers run it sequence by sequence, as a caller without varlen would) and a chunked-context row
(2048 new tokens over 16384 context keys, non-causal, with lse; merge_attn_states of its result
timed on its own in the same interleave; the peers return no lse).

Usage: python3 bench/bench_prefill.py [--arch sm_80] [--rows N] [--json PATH] [--against-config SPEC]
(--against-config 'prefill_sm80:...', repeatable, also times that kernel config through its own plan
in the same interleave: a tile-shape A/B; --against-package mla_jit_prev a previous commit's package,
in the same interleave too.)
"""
from __future__ import annotations

import argparse
import json
import os
import random

import torch

from timing import time_interleaved  # noqa: E402  (bench/ is sys.path[0])

D, DV = 192, 128
CAUSAL_ROWS = [(1, 4096, 128), (1, 8192, 128), (4, 4096, 16), (1, 16384, 16), (8, 2048, 128), (1, 32768, 16)]


def _rand(*shape):
    return (torch.randn(*shape, device="cuda") * 0.5).to(torch.bfloat16)


def _flops(lens_q, lens_k, h, causal):
    total = sum(nq * nk for nq, nk in zip(lens_q, lens_k))
    return 2 * h * total * (D + DV) / (2 if causal else 1)


def _cu(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def _sdpa_calls(qs, ks, vs, causal):
    """cuDNN and flash (V padded to 192) over dense (1, h, s, d) views, sequence by sequence."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    qd = [q.transpose(0, 1).unsqueeze(0) for q in qs]
    kd = [k.transpose(0, 1).unsqueeze(0) for k in ks]
    vd = [v.transpose(0, 1).unsqueeze(0) for v in vs]
    vpad = [F.pad(v, (0, D - DV)) for v in vd]

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for q, k, v in zip(qd, kd, vd):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def flash_padded():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for q, k, v in zip(qd, kd, vpad):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)[..., :DV]
    return {"cudnn": cudnn, "flash_pad_v": flash_padded}


def _sdpa_batched(b, s, h, causal):
    """The same peers on a dense (b, h, s, d) batch (the issue's fixed-length rows)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    q, k, v = _rand(b, h, s, D), _rand(b, h, s, D), _rand(b, h, s, DV)
    vpad = F.pad(v, (0, D - DV))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def flash_padded():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, vpad, is_causal=causal)[..., :DV]
    return {"cudnn": cudnn, "flash_pad_v": flash_padded}


def _ours(lens_q, lens_k, h, causal, with_lse=False):
    """Our call (into a preallocated out, as engines pass out=) and, for the chunked-context row,
    the merge of its (out, lse) into a running state, timed as a separate variant."""
    import mla_jit
    q, k, v = _rand(sum(lens_q), h, D), _rand(sum(lens_k), h, D), _rand(sum(lens_k), h, 2 * DV)[..., DV:]
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    out = torch.empty(sum(lens_q), h, DV, dtype=torch.bfloat16, device="cuda")

    def call():
        return mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                              return_softmax_lse=with_lse, out=out)
    merge = None
    if with_lse:
        _, lse = call()
        prev, prev_lse = torch.randn_like(out), torch.randn(h, sum(lens_q), device="cuda")
        merged, merged_lse = torch.empty_like(out), torch.empty_like(prev_lse)

        def merge():
            mla_jit.merge_attn_states(merged, prev, prev_lse, out, lse, merged_lse)
    return call, merge, (q, k, v)


def _forced_plan_call(spec, lens_q, lens_k, h, causal, tensors):
    """A call of our kernel with the config `spec` forced (a plan built around it), same inputs."""
    import mla_jit  # noqa: F401
    from mla_jit.runtimes import prefill_plan, registry
    family_name = spec.split(":", 1)[0]
    cfg = registry.get(family_name).config_from_spec(spec)
    q, k, v = tensors
    name = "sm80_prefill_config" if family_name == "prefill_sm80" else "prefill_config"
    original = getattr(prefill_plan, name)
    setattr(prefill_plan, name, lambda *a: cfg)
    try:
        plan = prefill_plan.PrefillPlan(q, k, v, causal)
    finally:
        setattr(prefill_plan, name, original)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    out = torch.empty(q.shape[0], h, DV, dtype=q.dtype, device="cuda")
    return lambda: plan.run(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), out, None, D ** -0.5)


def _package_call(name, lens_q, lens_k, causal, with_lse, tensors):
    """The same call through another copy of the package (e.g. a previous commit's)."""
    import importlib
    pkg = importlib.import_module(name)
    q, k, v = tensors
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    out = torch.empty(q.shape[0], q.shape[1], DV, dtype=q.dtype, device="cuda")
    return lambda: pkg.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                              return_softmax_lse=with_lse, out=out)


def _split(t, lens):
    out, s = [], 0
    for n in lens:
        out.append(t[s:s + n])
        s += n
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", help="MLA_JIT_ARCH for mla_jit (e.g. sm_80: the Ampere/Ada family on this GPU)")
    ap.add_argument("--rows", type=int, default=0, help="only the first N rows")
    ap.add_argument("--json")
    ap.add_argument("--against-config", action="append",
                    help="also time this kernel config (FAMILY:field=value,...); may be given more than once")
    ap.add_argument("--against-package", help="also time another copy of the package importable under this "
                    "name (scripts/prepare_prev.sh: mla_jit_prev), same inputs")
    args = ap.parse_args()
    if args.arch:
        os.environ["MLA_JIT_ARCH"] = args.arch
    torch.manual_seed(0)
    flush = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    rows = []
    for b, s, h in CAUSAL_ROWS:
        rows.append((f"{b}x{s}x{h} causal", [s] * b, [s] * b, h, True, False, _sdpa_batched(b, s, h, True)))
    rnd = random.Random(1)
    lens = [rnd.randint(256, 8192) for _ in range(32)]
    rows.append(("varlen 32 seqs 256..8192 h16 causal", lens, lens, 16, True, False, None))
    rows.append(("chunk 2048 new x 16384 ctx h16 non-causal +lse", [2048], [16384], 16, False, True, None))
    if args.rows:
        rows = rows[:args.rows]
    results = []
    header = f"{'row':44s} {'ours us':>9s} {'TFLOPS':>7s} {'cuDNN':>7s} {'flashpad':>8s} {'x cuDNN':>8s} {'x flashpad':>10s}"
    print(header)
    for name, lq, lk, h, causal, with_lse, peers in rows:
        ours, merge, (q, k, v) = _ours(lq, lk, h, causal, with_lse)
        if peers is None:
            peers = _sdpa_calls(_split(q, lq), _split(k, lk), _split(v, lk), causal)
        variants = [(lambda: None, ours)] + [(lambda: None, fn) for fn in peers.values()]
        if merge is not None:
            variants.append((lambda: None, merge))
        against = []   # (label, call): other configs and another package, in the same interleave
        for spec in args.against_config or ():
            against.append((spec.partition(":")[2] or spec, _forced_plan_call(spec, lq, lk, h, causal, (q, k, v))))
        if args.against_package:
            against.append((args.against_package,
                            _package_call(args.against_package, lq, lk, causal, with_lse, (q, k, v))))
        variants += [(lambda: None, call) for _, call in against]
        times = time_interleaved(variants, flush)
        flops = _flops(lq, lk, h, causal)
        tf = [flops / (t * 1e-6) / 1e12 for t in times[:3]]
        row = {"row": name, "us": times[0], "tflops": tf[0], **{f"{p}_tflops": t for p, t in zip(peers, tf[1:])}}
        note = ""
        if merge is not None:
            row["merge_us"] = times[3]
            note = f"  (+ merge_attn_states {times[3]:.1f} us)"
        if against:
            row["against_us"] = {label: t for (label, _), t in zip(against, times[-len(against):])}
            for (label, _), t in zip(against, times[-len(against):]):
                note += f"  ({label}: {t:.1f} us, its us / ours {t / times[0]:.3f})"
        results.append(row)
        print(f"{name:44s} {times[0]:9.1f} {tf[0]:7.1f} {tf[1]:7.1f} {tf[2]:8.1f} {tf[0] / tf[1]:8.3f} "
              f"{tf[0] / tf[2]:10.3f}{note}", flush=True)
        del q, k, v, ours, peers, merge
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

"""Fused vs separate combine on the sm90 ws kernel, per shape: the data behind the "auto" rule
(configs/decode.py fused_combine_pays). Times MLA_JIT_SM90_DECODE_SCHEDULE=ws and =ws_unfused
interleaved call by call (bench_decode's recipe and timing), prints the ratio and what "auto"
would pick. Usage: python bench/compare_fused_combine.py [--json PATH]"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import mla_jit
from mla_jit.configs.decode import fused_combine_pays, num_sm_parts

sys.path.insert(0, str(Path(__file__).parent))
from bench_decode import DV, H_KV, PAGE, _env_setter, make_inputs, time_interleaved  # noqa: E402


def _schedule_setter(schedule):
    return _env_setter({"MLA_JIT_SM90_DECODE_SCHEDULE": schedule})

# b, s_q, s_k, h_q: small batches and short sequences (many splits per batch) to the anchor sizes.
SHAPES = [(1, 1, 512, 16), (4, 1, 512, 16), (4, 1, 4096, 16), (4, 1, 4096, 64), (8, 1, 2048, 128),
          (8, 1, 4096, 16), (16, 1, 4096, 16), (16, 1, 4096, 64), (32, 1, 1024, 16), (32, 1, 1024, 64),
          (32, 1, 4096, 16), (32, 1, 4096, 32), (64, 1, 2048, 16), (64, 1, 4096, 32), (64, 1, 4096, 64),
          (128, 1, 1024, 64), (128, 1, 4096, 16), (128, 2, 4096, 128), (1, 1, 32768, 128), (4, 1, 32768, 64),
          (32, 2, 4096, 64)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")  # 8 GB, as bench_decode.py
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows_out = []
    print(f"{'b':>4} {'sq':>2} {'sk':>6} {'hq':>4} {'fused us':>9} {'unfused us':>10} {'ratio':>6} {'auto':>6}")
    for b, s_q, s_k, h_q in SHAPES:
        q, k_cache, block_table, lens = make_inputs(b, s_q, s_k, h_q)
        rows = s_q * h_q // H_KV
        metadata, num_splits = mla_jit.get_mla_metadata(lens, rows, H_KV)

        def call():
            return mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, DV, metadata, num_splits)
        fused, unfused = time_interleaved([(_schedule_setter("ws"), call), (_schedule_setter("ws_unfused"), call)],
                                          flush)
        _schedule_setter(None)()
        auto = fused_combine_pays(b, rows, num_sm_parts(sms, rows, H_KV), DV, block_table.shape[1] * PAGE,
                                  H_KV * k_cache.shape[-1] * k_cache.element_size())
        rows_out.append({"b": b, "s_q": s_q, "s_k": s_k, "h_q": h_q, "fused_us": fused, "unfused_us": unfused,
                         "auto_fuses": auto})
        print(f"{b:>4} {s_q:>2} {s_k:>6} {h_q:>4} {fused:9.1f} {unfused:10.1f} {unfused / fused:6.3f} "
              f"{'fused' if auto else 'kernel':>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()

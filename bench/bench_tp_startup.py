"""Start-up time of tensor-parallel ranks with a warm shared cache root.

A warm run (one process) puts every kernel the ranks need into the writable root of this environment
(MLA_JIT_CACHE_DIR); then --ranks processes start at once as torchrun starts them (tests/tp_rank.py,
mode `attention`: DeepSeek V3 decode and MHA-mode prefill on this rank's share of 128 heads), each
with that root as MLA_JIT_READONLY_CACHE_DIRS, a fresh writable root of its own and MLA_JIT_OFFLINE=1.
Ranks go to GPU LOCAL_RANK % device_count (on one GPU all share it: gloo). Times are seconds since
each rank's process was created. --cold: no warm run; the ranks start on one empty shared writable
root (each kernel compiled by one rank while the others wait for it).

    python bench/bench_tp_startup.py --ranks 8 [--cold] [--backend gloo|nccl] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.tp_launch import RANK_SCRIPT, start_ranks, wait_ranks  # noqa: E402

PHASES = (("t_start", "interpreter up"), ("t_torch", "torch imported"), ("t_mla_jit", "mla_jit imported"),
          ("t_inputs", "decode inputs on GPU (CUDA initialized)"), ("t_first_decode", "first decode done"),
          ("t_prefill_inputs", "prefill inputs on GPU"), ("t_first_prefill", "first prefill done"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--backend", default=None, help="default: nccl with a GPU per rank, else gloo")
    parser.add_argument("--cold", action="store_true", help="start on an empty shared writable root")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import torch
    from mla_jit.jit import env as jit_env
    backend = args.backend or ("nccl" if torch.cuda.device_count() >= args.ranks else "gloo")
    with tempfile.TemporaryDirectory(prefix="tp_startup_") as tmp:
        tmp = Path(tmp)
        out = tmp / "reports"
        out.mkdir()
        env = {"TP_BACKEND": backend, "NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": "1"}
        if args.cold:
            env.update({"MLA_JIT_CACHE_DIR": str(tmp / "shared"), "MLA_JIT_READONLY_CACHE_DIRS": "",
                        "TP_RANK_CACHE_DIR": "", "MLA_JIT_OFFLINE": "0"})
        else:
            warm = subprocess.run([sys.executable, str(RANK_SCRIPT), "warm", str(tmp), str(args.ranks)], cwd=REPO,
                                  capture_output=True, text=True)
            if warm.returncode:
                raise SystemExit(f"warm run failed:\n{warm.stderr[-4000:]}")
            env.update({"MLA_JIT_READONLY_CACHE_DIRS": str(jit_env.cache_dir()),
                        "TP_RANK_CACHE_DIR": str(tmp / "local" / "rank{rank}"), "MLA_JIT_OFFLINE": "1"})
        reports = wait_ranks(start_ranks(args.ranks, ["attention", str(out)], env), out, args.ranks, timeout=1800)
    gpu = reports[0]["gpu"]
    compiled = sum(origin == "compiled" for r in reports for origin in r["origins"].values())
    print(f"\n{args.ranks} ranks ({backend}, {torch.cuda.device_count()} x {gpu}), heads per rank "
          f"{128 // args.ranks}, {'cold' if args.cold else 'warm read-only'} shared root ({compiled} kernels "
          f"compiled over all ranks); seconds since each rank's process was created")
    print("| phase | rank 0 | slowest rank |")
    print("|---|---|---|")
    for key, label in PHASES:
        print(f"| {label} | {reports[0][key]:.2f} | {max(r[key] for r in reports):.2f} |")
    print(f"rank 0 checks (max abs err of the gathered heads): {reports[0]['checks']}")
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()

"""One rank of a tensor-parallel start, launched as torchrun launches it (RANK, WORLD_SIZE, LOCAL_RANK in
the environment): `python -m torch.distributed.run --nproc-per-node N tests/tp_rank.py MODE OUT_DIR ...`.
Each rank writes OUT_DIR/rank{RANK}.json; the tests and bench/bench_tp_startup.py read them.

Modes:
  build OUT_DIR DTYPE...   (CPU) build the toy kernel of each dtype, this rank's order rotated, once
                           OUT_DIR/go exists (the launcher writes it when every OUT_DIR/ready{RANK}
                           does: all ranks start at once); report each binary's origin and checksum.
  attention OUT_DIR        (GPU) DeepSeek V3's decode and MHA-mode prefill attention, this rank's share
                           of the 128 heads, gathered over torch.distributed (TP_BACKEND: nccl,
                           or gloo through the host); rank 0 also runs all 128 heads itself and checks
                           the gathered result against that run and the float32 reference.
  warm OUT_DIR WORLD...    (GPU, one process) every shape `attention` runs for those world sizes, so a
                           cache root holds every kernel the ranks need.

TP_RANK_CACHE_DIR, if set, is formatted with the rank ("/local/mla_jit/rank{rank}") into
MLA_JIT_CACHE_DIR: each rank's writable root, beside the shared read-only one.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _process_age() -> float:
    """Seconds since this process was created (Linux /proc; the launcher's fork + exec included)."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return time.time() - (boot + start)
    except (OSError, ValueError, StopIteration):
        return float("nan")


T_START = _process_age()
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
if os.environ.get("TP_RANK_CACHE_DIR"):
    os.environ["MLA_JIT_CACHE_DIR"] = os.environ["TP_RANK_CACHE_DIR"].format(rank=RANK)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

T_TORCH = _process_age()

import mla_jit  # noqa: E402

T_MLA_JIT = _process_age()

H_Q = 128   # DeepSeek V3's query heads (decode: h_kv 1, d 576, dv 512; prefill: 192 / 128)


def _write(out_dir: Path, report: dict) -> None:
    report.update(rank=RANK, world=WORLD, t_start=T_START, t_torch=T_TORCH, t_mla_jit=T_MLA_JIT)
    tmp = out_dir / f".rank{RANK}.json"
    tmp.write_text(json.dumps(report))
    tmp.replace(out_dir / f"rank{RANK}.json")


def build_mode(out_dir: Path, dtypes: list[str]) -> None:
    from mla_jit.cache.store import sha256
    from mla_jit.jit.build import build
    from tests.helpers import toy_source
    (out_dir / f"ready{RANK}").touch()
    go = out_dir / "go"
    while not go.exists():
        time.sleep(0.01)
    shift = RANK % len(dtypes)
    report = {"origin": {}, "sha": {}, "path": {}}
    for dtype in dtypes[shift:] + dtypes[:shift]:
        binary = build(toy_source(dtype))
        report["origin"][dtype], report["sha"][dtype] = binary.origin, sha256(binary.cubin)
        report["path"][dtype] = str(binary.path)
    _write(out_dir, report)


# ---- attention ------------------------------------------------------------------------------

def _decode_inputs():
    from tests.decode_inputs import DecodeCase, make_inputs
    case = DecodeCase(b=8, s_q=2, s_k=1500, h_q=H_Q, varlen=True, causal=True)
    return case, make_inputs(case, seed=21)


def _decode(case, q, k_cache, block_table, lens):
    metadata, num_splits = mla_jit.get_mla_metadata(lens, case.s_q * q.shape[2], 1)
    return mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, case.dv, metadata, num_splits,
                                          causal=True)


def _prefill_inputs():
    gen = torch.Generator(device="cpu").manual_seed(22)
    lens_q, lens_k = [300, 1, 0, 777], [300, 129, 64, 1000]   # chunked context on the last two
    cu_q, cu_k = ([0, *torch.tensor(x).cumsum(0).tolist()] for x in (lens_q, lens_k))
    q = torch.randn(cu_q[-1], H_Q, 192, generator=gen).to(torch.bfloat16).cuda()
    k = torch.randn(cu_k[-1], H_Q, 192, generator=gen).to(torch.bfloat16).cuda()
    v = torch.randn(cu_k[-1], H_Q, 128, generator=gen).to(torch.bfloat16).cuda()
    cu = [torch.tensor(x, dtype=torch.int32, device="cuda") for x in (cu_q, cu_k)]
    return q, k, v, cu[0], cu[1], max(lens_q), max(lens_k)


def _prefill(q, k, v, cu_q, cu_k, max_q, max_k):
    return mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, return_softmax_lse=True)


def _heads(world: int, rank: int) -> slice:
    share = H_Q // world
    return slice(rank * share, (rank + 1) * share)


def _sync_age() -> float:
    torch.cuda.synchronize()
    return _process_age()


def _gather(local: torch.Tensor, dim: int, backend: str) -> torch.Tensor:
    """Every rank's `local` concatenated along `dim`, as float32 (exact for bf16; gloo goes through the host)."""
    import torch.distributed as dist
    src = local.float().contiguous() if backend == "nccl" else local.float().cpu().contiguous()
    parts = [torch.empty_like(src) for _ in range(WORLD)]
    dist.all_gather(parts, src)
    return torch.cat(parts, dim=dim).to(local.device)


def attention_mode(out_dir: Path) -> None:
    import torch.distributed as dist
    backend = os.environ.get("TP_BACKEND", "nccl")
    device = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(device)
    report = {"device": device, "backend": backend, "gpu": torch.cuda.get_device_name(device)}
    case, (q, k_cache, block_table, lens) = _decode_inputs()
    report["t_inputs"] = _sync_age()
    mine = _heads(WORLD, RANK)
    out, lse = _decode(case, q[:, :, mine].contiguous(), k_cache, block_table, lens)
    report["t_first_decode"] = _sync_age()
    pq, pk, pv, cu_q, cu_k, max_q, max_k = _prefill_inputs()
    report["t_prefill_inputs"] = _sync_age()
    p_out, p_lse = _prefill(pq[:, mine], pk[:, mine], pv[:, mine], cu_q, cu_k, max_q, max_k)
    report["t_first_prefill"] = _sync_age()

    dist.init_process_group(backend, device_id=torch.device("cuda", device) if backend == "nccl" else None)
    try:
        gathered = {"decode_out": _gather(out, 2, backend), "decode_lse": _gather(lse, 1, backend),
                    "prefill_out": _gather(p_out, 1, backend), "prefill_lse": _gather(p_lse, 0, backend)}
        dist.barrier()
    finally:
        dist.destroy_process_group()
    report["origins"] = _origins()   # this rank's kernels, before rank 0's one-GPU check adds its own
    if RANK == 0:
        report["checks"] = _check_against_one_gpu(case, (q, k_cache, block_table, lens),
                                                  (pq, pk, pv, cu_q, cu_k, max_q, max_k), gathered)
    _write(out_dir, report)


def _origins() -> dict[str, str]:
    """How this process got each kernel binary it used: "compiled" or "disk" (by kernel name)."""
    from mla_jit.runtimes import registry
    return {binary.name: binary.origin for family in registry.families().values()
            for binary in family._binaries.values()}


def _check_against_one_gpu(case, decode_args, prefill_args, gathered) -> dict:
    """The gathered heads against this GPU's own 128-head call (decode tolerances) and the float32
    reference. Raises AssertionError (the rank then exits non-zero) on a mismatch."""
    from tests.decode_reference import mla_decode_reference
    from tests.prefill_reference import prefill_reference
    from tests.test_gpu_decode import assert_decode_close
    q, k_cache, block_table, lens = decode_args
    full_out, full_lse = _decode(case, *decode_args)
    assert_decode_close(gathered["decode_out"], gathered["decode_lse"], full_out.float(), full_lse)
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, lens, case.dv, causal=True)
    assert_decode_close(gathered["decode_out"], gathered["decode_lse"], ref_out, ref_lse)
    pq, pk, pv, cu_q, cu_k, max_q, max_k = prefill_args
    p_out, p_lse = _prefill(*prefill_args)
    total_q = int(cu_q[-1])
    p_ref, p_ref_lse = prefill_reference(pq, pk, pv, cu_q, cu_k, 192 ** -0.5, True)
    errs = {
        "decode_vs_one_gpu": (gathered["decode_out"].float() - full_out.float()).abs().max().item(),
        "decode_vs_fp32": (gathered["decode_out"].float() - ref_out).abs().max().item(),
        "prefill_vs_one_gpu": (gathered["prefill_out"][:total_q].float() - p_out[:total_q].float()).abs().max().item(),
        "prefill_vs_fp32": (gathered["prefill_out"][:total_q].float() - p_ref).abs().max().item(),
    }
    assert torch.equal(torch.isinf(gathered["prefill_lse"]), torch.isinf(p_ref_lse))
    finite = ~torch.isinf(p_ref_lse)
    errs["prefill_lse_vs_fp32"] = (gathered["prefill_lse"][finite] - p_ref_lse[finite]).abs().max().item()
    assert errs["prefill_vs_one_gpu"] <= 1e-2, errs
    assert errs["prefill_vs_fp32"] <= 2e-2 and errs["prefill_lse_vs_fp32"] <= 2e-3, errs
    return errs


def warm_mode(out_dir: Path, worlds: list[int]) -> None:
    """Run every head share `attention` runs (world sizes `worlds`, and the full 128 heads)."""
    case, (q, k_cache, block_table, lens) = _decode_inputs()
    prefill_args = _prefill_inputs()
    pq, pk, pv, *rest = prefill_args
    for world in sorted({1, *worlds}):
        mine = _heads(world, 0)
        _decode(case, q[:, :, mine].contiguous(), k_cache, block_table, lens)
        _prefill(pq[:, mine], pk[:, mine], pv[:, mine], *rest)
    torch.cuda.synchronize()
    _write(out_dir, {"warmed": sorted({1, *worlds})})


def main(argv: list[str]) -> None:
    mode, out_dir = argv[0], Path(argv[1])
    if mode == "build":
        build_mode(out_dir, argv[2:])
    elif mode == "attention":
        attention_mode(out_dir)
    elif mode == "warm":
        warm_mode(out_dir, [int(x) for x in argv[2:]])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

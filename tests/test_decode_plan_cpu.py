"""GPU-free checks of the decode launch plans (runtimes/decode_plan.py): which family and kernel a
GPU gets, grid, block and shared memory, the cache's TMA descriptor, the FP8 plans' descale
pointers, and the errors raised before any kernel."""
import itertools

import pytest

from mla_jit.runtimes import registry
from mla_jit.runtimes.decode import DECODE_PARAMS


@pytest.mark.parametrize("tuning,override,rows,expect", [
    ("sm_90a", "", 128, ("mla_decode_sm90", 2, 384, "tile")),
    ("sm_80", "sm_80", 16, ("mla_decode_sm80", 1, 128, None)),
    ("sm_89", "sm_89", 128, ("mla_decode_sm80", 4, 128, None)),
])
def test_decode_launch_geometry(tuning, override, rows, expect, monkeypatch):
    """Host-side plan for each family, without a GPU: grid, block, smem source and TMA box."""
    import torch

    from mla_jit.jit.arch import ArchPair, parse_arch
    from mla_jit.runtimes import decode_plan as runtime
    arch = ArchPair(parse_arch(tuning), parse_arch("sm_90a"))
    monkeypatch.setenv("MLA_JIT_ARCH", override)
    monkeypatch.delenv("MLA_JIT_SM90_CLUSTER", raising=False)
    monkeypatch.delenv("MLA_JIT_SM90_DECODE_SCHEDULE", raising=False)
    monkeypatch.setattr(runtime, "read_global_int32", lambda binary, symbol, device: (symbol, 1234))
    monkeypatch.setattr(runtime, "_smem_bytes", {})
    calls = []
    for name in ("mla_decode_sm90", "mla_decode_sm80"):
        family = registry.get(name)
        monkeypatch.setattr(family, "binary", lambda cfg, arch: None)
        monkeypatch.setattr(family, "launcher", lambda *a, **k: calls.append((a, k)) or len(calls))
        monkeypatch.setattr(family, "kernel", lambda *a: None)
    resident = []  # clusters the GPU keeps resident at once, as cuOccupancyMaxActiveClusters would say
    monkeypatch.setattr(runtime, "max_active_clusters", lambda kernel, grid, block, smem, cluster: resident[0])
    q = torch.zeros(3, 1, rows, 576, dtype=torch.bfloat16)
    family_name, row_tiles, threads, want_box = expect
    # Sequences of at most one KV tile: one split per batch, so the sm90 "auto" schedule fuses the
    # combine into the split-KV kernel; long ones (many splits of 64 rows) get the combine kernel.
    # Two row tiles on sm90: clusters of 2 (7 of them) when all fit at once, else none.
    for (max_seq_tokens, fused), fits in itertools.product(((64, family_name == "mla_decode_sm90"), (1 << 20, False)),
                                                           (7, 6)):
        calls.clear()
        resident[:] = [fits]
        splitkv, combine, box, plan_row_tiles = runtime._kernels(tuple(q.shape), "bf16", "bf16", 512, 64, 1, 7,
                                                                 max_seq_tokens, 576 * 2, arch, 0)
        (sk_args, sk_kw), *combine_calls = calls
        assert sk_args[2] == registry.get(family_name).SPLITKV
        assert sk_args[5:7] == ((7, 1, row_tiles), (threads, 1, 1)) and plan_row_tiles == row_tiles
        assert sk_kw["dynamic_smem"] == (f"{registry.get(family_name).SPLITKV}_smem_bytes", 1234)
        clustered = family_name == "mla_decode_sm90" and row_tiles == 2 and fits == 7
        assert sk_kw["cluster"] == ((1, 1, 2) if clustered else None)
        if fused:
            assert combine is None and not combine_calls
        else:
            ((cb_args, cb_kw),) = combine_calls
            assert cb_args[5:7] == ((3, 1, -(-rows // 8)), (256, 1, 1)) and cb_kw["pdl"] is True
        # sm90, pages of 64: the tile's 9 chunks in one TMA load, or a group of 3 a cluster CTA.
        assert box == ((3 if clustered else 9, 64, 1, 64) if want_box == "tile" else want_box)


def _stub_decode_families(monkeypatch, tuning: str) -> list:
    """DecodePlan without a GPU on a GPU detected as `tuning`: kernels neither built nor loaded; the
    returned list collects each launcher's (args, kwargs), and each launch's (stream, *args) lands in
    its launcher's `.launches`."""
    from mla_jit.jit.arch import ArchPair, parse_arch
    from mla_jit.runtimes import decode_plan as runtime
    arch = ArchPair(parse_arch(tuning), parse_arch(tuning))
    monkeypatch.setattr(runtime, "resolve_for_device", lambda device: arch)
    for var in ("MLA_JIT_ARCH", "MLA_JIT_SM90_CLUSTER", "MLA_JIT_SM90_DECODE_SCHEDULE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(runtime, "read_global_int32", lambda binary, symbol, device: 1234)
    for memo in ("_smem_bytes", "_unit_descales", "_descriptors"):
        monkeypatch.setattr(runtime, memo, {})
    calls = []

    class Launch:
        def __init__(self, *args, **kwargs):
            self.launches = []
            calls.append((args, kwargs))

        def __call__(self, *args):
            self.launches.append(args)

    for name in ("mla_decode_sm90", "mla_decode_sm80"):
        family = registry.get(name)
        monkeypatch.setattr(family, "binary", lambda cfg, arch: None)
        monkeypatch.setattr(family, "launcher", Launch)
        monkeypatch.setattr(family, "kernel", lambda *a: None)
    return calls


def test_detected_ampere_or_ada_gets_the_sm80_family_without_override(monkeypatch):
    import torch

    from mla_jit.runtimes import decode_plan as runtime
    calls = _stub_decode_families(monkeypatch, "sm_89")
    q = torch.zeros(1, 1, 16, 576, dtype=torch.bfloat16)
    k_cache = torch.zeros(1, 64, 1, 576, dtype=torch.bfloat16)
    block_table = torch.zeros(1, 64, dtype=torch.int32)
    plan = runtime.DecodePlan(q, k_cache, block_table, 512, 1)
    assert plan.box is None and calls[0][0][2] == registry.get("mla_decode_sm80").SPLITKV
    assert calls[1][1]["pdl"] is False  # no programmatic dependent launch below sm_90


def test_batch_limit_of_32_bit_output_offsets():
    import mla_jit
    from mla_jit.ops.decode import check_output_offsets
    check_output_offsets((8000, 4, 128, 576), 132, 512)         # (8000 + 132) * 4 * 128 * 512 < 2^31
    check_output_offsets((200_000, 1, 16, 576), 132, 512)       # fewer heads: larger batches
    with pytest.raises(mla_jit.InvalidArgumentError, match="q"):
        check_output_offsets((8192, 4, 128, 576), 132, 512)


def test_kv_descriptor_promotes_l2_fills_to_one_box_row(monkeypatch):
    """The KV cache's descriptor asks L2 for 128-byte fills (a box row), not 256: with 256 and
    evict_first KV loads the memory-bound rows ran 1-4.5% slower on the H200 (bench/NOTES.md)."""
    import torch

    from mla_jit.jit import tma
    from mla_jit.runtimes import decode_plan as runtime
    seen = []
    monkeypatch.setattr(tma, "tiled", lambda tensor, box, swizzle=0, l2_promotion=None: seen.append(
        (tuple(tensor.shape), tuple(box), swizzle, l2_promotion)) or object())
    monkeypatch.setattr(runtime, "_descriptors", {})
    k_cache = torch.zeros(3, 64, 1, 576, dtype=torch.bfloat16)
    runtime.kv_descriptor(k_cache, ("test", k_cache.data_ptr()), (64, 1, 64))
    assert seen == [((3 * 64, 1, 576), (64, 1, 64), 128, 128)]
    # e4m3: the same box, whose 64 columns are 64 bytes: 64-byte swizzle and fills.
    fp8_cache = torch.zeros(3, 16, 1, 512, dtype=torch.float8_e4m3fn)
    runtime.kv_descriptor(fp8_cache, ("test", fp8_cache.data_ptr(), fp8_cache.dtype), (16, 1, 64))
    assert seen[1:] == [((3 * 16, 1, 512), (16, 1, 64), 64, 64)]
    # The tile-wide box (pages >= 64): the chunk-outermost view, its own memo entry.
    runtime.kv_descriptor(k_cache, ("test", k_cache.data_ptr(), (9, 64, 1, 64)), (9, 64, 1, 64))
    assert seen[2:] == [((9, 3 * 64, 1, 64), (9, 64, 1, 64), 128, 128)]
    assert tma.TmaSpec(torch.bfloat16, (64, 64), (64,), (64, 8)).l2_promotion == 128


def _fp8_decode_inputs(b=1, h_q=16, page=64, d=576):
    import torch
    q = torch.zeros(b, 1, h_q, d, dtype=torch.float8_e4m3fn)
    k_cache = torch.zeros(4, page, 1, d, dtype=torch.float8_e4m3fn)
    return q, k_cache, torch.zeros(b, 4, dtype=torch.int32)


@pytest.mark.parametrize("tuning", ["sm_80", "sm_86", "sm_89"])
@pytest.mark.parametrize("h_q", [16, 128])
def test_fp8_cache_below_hopper_plans_the_mma_sync_e4m3_kernel(tuning, h_q, monkeypatch):
    """e4m3 q (fp16 MMAs, bf16 out; sm_89 converts with its cvt) and a bf16 q over the e4m3 cache:
    the mma.sync family's e4m3-cache kernel, on the grid the schedule plans (the bf16 kernel's rows
    per CTA), with the cache as a plain pointer and a 1.0 descale for the missing one."""
    import torch

    from mla_jit.configs.decode_sm80 import block_m_for
    from mla_jit.jit.arch import parse_arch
    from mla_jit.runtimes import decode_plan as runtime
    calls = _stub_decode_families(monkeypatch, tuning)
    q8, k_cache, block_table = _fp8_decode_inputs(h_q=h_q)
    for q, kv_dtype, mma, cvt in ((q8, None, "fp16", tuning == "sm_89"), (q8.bfloat16(), "e4m3", "bf16", False)):
        del calls[:]
        plan = runtime.DecodePlan(q, k_cache, block_table, 512, 1)
        cfg, grid = calls[0][0][0], calls[0][0][5]
        assert (cfg.kv_fp8, cfg.kv_dtype, cfg.mma_dtype, cfg.fp8_cvt, plan.box) == (True, kv_dtype, mma, cvt, None)
        assert grid == (1, 1, -(-h_q // block_m_for(h_q, parse_arch(tuning))))
        assert plan.out_dtype == torch.bfloat16 and plan.unit_descale.tolist() == [1.0]


def test_fp8_plan_packs_the_descale_pointers(monkeypatch):
    """An e4m3 plan on Hopper: the 4-stage e4m3 kernel, bf16 out, and the descales' pointers last in
    DecodeParams (None: a 1.0 kept per device, made once); a bf16 plan passes null pointers."""
    import torch

    from mla_jit.jit import tma
    from mla_jit.runtimes import decode_plan as runtime, workspace
    calls = _stub_decode_families(monkeypatch, "sm_90a")
    monkeypatch.setattr(runtime, "current_stream", lambda device: 7)
    monkeypatch.setattr(workspace, "_capturing", lambda: False)
    monkeypatch.setattr(workspace, "_buffers", {})
    monkeypatch.setattr(workspace, "_counters", {})
    monkeypatch.setattr(tma, "tiled", lambda tensor, box, swizzle=0, l2_promotion=None: (box, swizzle))
    q, k_cache, block_table = _fp8_decode_inputs()
    lens, splits, meta = torch.full((1,), 100, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), \
        torch.zeros(1, 8, dtype=torch.int32)
    plan = runtime.DecodePlan(q, k_cache, block_table, 512, 1)
    cfg = calls[0][0][0]
    assert (cfg.dtype, cfg.num_stages, plan.box, plan.out_dtype) == ("e4m3", 4, (9, 64, 1, 64), torch.bfloat16)
    assert runtime.DecodePlan(q, k_cache, block_table, 512, 1).unit_descale is plan.unit_descale  # one per device
    assert plan.unit_descale.tolist() == [1.0] and plan.unit_descale.dtype == torch.float32
    descale_q, descale_k = torch.tensor([0.5]), torch.tensor([0.25])
    for given, want in (((None, None), (plan.unit_ptr,) * 2),
                        ((descale_q, descale_k), (descale_q.data_ptr(), descale_k.data_ptr())),
                        ((None, descale_k), (plan.unit_ptr, descale_k.data_ptr()))):
        out, lse = plan.run(q, q.data_ptr(), k_cache, k_cache.data_ptr(), block_table, lens, meta, splits, 0.1,
                            False, *given)
        stream, params, kv = plan.splitkv.launches[-1]
        assert DECODE_PARAMS.unpack(params)[-8:-6] == want and kv == ((9, 64, 1, 64), 64)
        assert out.dtype == torch.bfloat16 and out.shape == (1, 1, 16, 512) and lse.dtype == torch.float32
    # bf16 q over the e4m3 cache: the bf16 kernel that de-quantizes it (2 stages), the e4m3 box
    # (64-byte rows), bf16 out; descale_q always the 1.0.
    over = runtime.DecodePlan(q.bfloat16(), k_cache, block_table, 512, 1)
    cfg = calls[-1][0][0]
    assert (cfg.dtype, cfg.kv_dtype, cfg.num_stages, over.out_dtype) == ("bf16", "e4m3", 2, torch.bfloat16)
    over.run(q.bfloat16(), 0, k_cache, 0, block_table, lens, meta, splits, 0.1, False, None, descale_k)
    stream, params, kv = over.splitkv.launches[-1]
    assert DECODE_PARAMS.unpack(params)[-8:-6] == (over.unit_ptr, descale_k.data_ptr()) and kv == ((9, 64, 1, 64), 64)
    bf16 = runtime.DecodePlan(q.bfloat16(), k_cache.bfloat16(), block_table, 512, 1)
    assert bf16.unit_descale is None and bf16.out_dtype == torch.bfloat16
    bf16.run(q.bfloat16(), 0, k_cache.bfloat16(), 0, block_table, lens, meta, splits, 0.1, False)
    assert DECODE_PARAMS.unpack(bf16.splitkv.launches[-1][1])[-8:-6] == (0, 0)

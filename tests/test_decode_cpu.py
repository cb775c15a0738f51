"""GPU-free checks of the decode family: configs, rendering for the whole supported grid, and
compile-only of the metadata, split-KV and combine kernels with ptxas's resource report."""
import itertools
import re

import pytest

from mla_jit import presets
from mla_jit.configs.decode import (S_HALVES_MIN_ROWS, SUPPORTED_HEAD_DIMS, SUPPORTED_PAGE_SIZES, accum_rows,
                                    decode_config, metadata_config, num_sm_parts)
from mla_jit.jit.build import build
from mla_jit.runtimes import registry
from mla_jit.runtimes.decode import DECODE_PARAMS

from .helpers import SM90, sass_of


def test_num_sm_parts_fills_one_wave():
    assert num_sm_parts(132, 128, 1) == 66      # two 64-row tiles per KV head
    assert num_sm_parts(132, 16, 1) == 132
    assert num_sm_parts(132, 512, 8) == 2
    assert num_sm_parts(132, 512, 8 * 100) == 1  # never zero
    assert accum_rows(128, 132) == 260


def test_every_supported_config_renders():
    family = registry.get("mla_decode_sm90")
    names = set()
    for dtype, (d, dv), page, kv in itertools.product(("bf16", "fp16"), SUPPORTED_HEAD_DIMS, SUPPORTED_PAGE_SIZES,
                                                      (None, "e4m3")):
        for schedule, tail, combine in (("ws", "true, 1", False), ("ws_unfused", "false, 1", True)):
            cfg = decode_config(dtype, d, dv, page, SM90.tuning, schedule, 1, kv)
            src = family.source(cfg, SM90)
            assert f"SplitKVWsConfig<cutlass::{'bfloat16_t' if dtype == 'bf16' else 'half_t'}, {d}, {dv}," in src.source
            # 3 stages, or 2 (and 2 landing slots) over an e4m3 cache
            assert f"{page}, 64, 64, {2 if kv else 3}, {tail}, {'true' if kv else 'false'},\n" in src.source
            chunks = d // 64 if page >= 64 else 1   # a page per tile: one TMA load a tile
            assert "/*SPARSE_KV=*/0, /*COMPACT_ROWS=*/false," in src.source
            assert f"/*CHUNKS_PER_LOAD=*/{chunks}, /*S_HALVES=*/false>" in src.source
            # The fused-combine kernel ships without the combine kernel.
            assert ("mla_jit_decode_combine(" in src.source) == combine
            assert family.entry_points(cfg)[1:] == (("mla_jit_decode_combine",) if combine else ())
            names.add(src.name)
    assert len(names) == 2 * 2 * 2 * len(SUPPORTED_HEAD_DIMS) * len(SUPPORTED_PAGE_SIZES)
    # At most 32 rows a KV head: compact rows (one row tile); 33 or more, or unknown: 64-row tiles.
    assert decode_config("e4m3", 576, 512, 64, SM90.tuning, rows=32).compact_rows
    assert not decode_config("e4m3", 576, 512, 64, SM90.tuning, rows=33).compact_rows
    assert not decode_config("e4m3", 576, 512, 64, SM90.tuning).compact_rows
    # e4m3 at S_HALVES_MIN_ROWS rows a KV head or more: S by token halves; other dtypes never.
    assert decode_config("e4m3", 576, 512, 64, SM90.tuning, rows=S_HALVES_MIN_ROWS).s_halves
    assert not decode_config("e4m3", 576, 512, 64, SM90.tuning, rows=S_HALVES_MIN_ROWS - 1).s_halves
    assert not decode_config("e4m3", 576, 512, 64, SM90.tuning).s_halves
    assert not decode_config("bf16", 576, 512, 64, SM90.tuning, rows=4096).s_halves
    assert not decode_config("bf16", 576, 512, 64, SM90.tuning, rows=4096, kv_dtype="e4m3").s_halves
    src = family.source(decode_config("e4m3", 576, 512, 64, SM90.tuning, rows=2048), SM90).source
    assert "/*S_HALVES=*/true>" in src and " S by token halves" in src
    src = family.source(decode_config("bf16", 576, 512, 64, SM90.tuning, rows=16), SM90).source
    assert "/*COMPACT_ROWS=*/true," in src and " compact rows 9 chunks a TMA load." in src
    assert decode_config("bf16", 576, 512, 64, SM90.tuning).schedule == "ws"  # the default
    assert decode_config("bf16", 576, 512, 64, SM90.tuning, kv_dtype="bf16").kv_dtype is None  # q's own: None
    clustered = decode_config("bf16", 576, 512, 64, SM90.tuning, "ws", 2)
    assert "64, 64, 3, true, 2, false,\n" in family.source(clustered, SM90).source and clustered.cluster == (1, 1, 2)
    assert decode_config("bf16", 576, 512, 64, SM90.tuning, "ws").cluster is None


@pytest.mark.parametrize("field,value,match", [("schedule", "baseline", "schedule"), ("cluster_m", 4, "cluster_m"),
                                               ("page_size", 48, "page_size"), ("head_dim_v", 128, "head_dim"),
                                               ("num_stages", 2, "num_stages"), ("dtype", "fp32", "dtype"),
                                               ("kv_dtype", "fp8", "kv_dtype"), ("kv_dtype", "bf16", "kv_dtype"),
                                               ("s_halves", True, "s_halves")])
def test_decode_config_rejects_values_no_kernel_serves(field, value, match):
    """A config built by hand or from a prewarm --config spec is checked when constructed."""
    import dataclasses

    import mla_jit
    good = decode_config("bf16", 576, 512, 64, SM90.tuning, "ws_unfused", 2)
    with pytest.raises(mla_jit.InvalidArgumentError, match=match):
        dataclasses.replace(good, **{field: value})


def test_fp8_decode_config_takes_four_stages():
    """e4m3 q and cache: the same tiles, 4 pipeline stages (half the bytes a stage); 4 stages for
    bf16 / fp16 and 3 for e4m3 are no kernel's."""
    import dataclasses

    import torch

    import mla_jit
    from mla_jit.dtypes import cpp_type, name_of
    cfg = decode_config("e4m3", 576, 512, 64, SM90.tuning, "ws_unfused", 2)
    assert (cfg.dtype, cfg.block_m, cfg.block_n, cfg.num_stages, cfg.schedule, cfg.cluster_m) == \
        ("e4m3", 64, 64, 4, "ws_unfused", 2)
    assert decode_config("e4m3", 512, 512, 16, SM90.tuning).num_stages == 4
    assert decode_config("bf16", 576, 512, 64, SM90.tuning).num_stages == 3
    for good, stages in ((cfg, 3), (decode_config("bf16", 576, 512, 64, SM90.tuning), 4),
                         (decode_config("fp16", 576, 512, 64, SM90.tuning), 4)):
        with pytest.raises(mla_jit.InvalidArgumentError, match="num_stages"):
            dataclasses.replace(good, num_stages=stages)
    assert name_of(torch.float8_e4m3fn) == "e4m3" and cpp_type("e4m3") == "cutlass::float_e4m3_t"
    # Its own kernel, apart from the bf16 one of the same shape.
    family = registry.get("mla_decode_sm90")
    source = family.source(cfg, SM90)
    assert "cutlass::float_e4m3_t" in source.source
    assert source.name != family.source(dataclasses.replace(cfg, dtype="bf16", num_stages=3), SM90).name


def test_cluster_size_divides_the_row_tiles(monkeypatch):
    from mla_jit.configs.decode import cluster_m_for
    from mla_jit.errors import ConfigError
    from mla_jit.jit import env
    from mla_jit.runtimes import decode_plan
    assert [cluster_m_for(t) for t in (1, 2, 3, 4, 8)] == [1, 2, 1, 2, 2]   # auto: pairs of row tiles
    assert [cluster_m_for(t, "2") for t in (1, 2, 3, 4, 8)] == [1, 2, 1, 2, 2]
    assert [cluster_m_for(t, "1") for t in (2, 4)] == [1, 1]
    monkeypatch.setenv("MLA_JIT_SM90_CLUSTER", "4")  # 33 clusters of 4 do not fit 132 SMs: not offered
    with pytest.raises(ConfigError, match="MLA_JIT_SM90_CLUSTER"):
        env.choice("MLA_JIT_SM90_CLUSTER")
    monkeypatch.setenv("MLA_JIT_SM90_CLUSTER", "1")
    assert decode_plan.plan_env()[2] in ("1", b"1")  # part of the plan key


def test_schedule_env_var_is_part_of_the_plan_key(monkeypatch):
    from mla_jit.errors import ConfigError
    from mla_jit.jit import env
    from mla_jit.runtimes import decode_plan
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", "ws_unfused")
    assert env.choice("MLA_JIT_SM90_DECODE_SCHEDULE") == "ws_unfused"
    assert decode_plan.plan_env()[1] in ("ws_unfused", b"ws_unfused")  # raw value: another value, another plan
    for retired in ("fastest", "baseline", "seesaw"):
        monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", retired)
        with pytest.raises(ConfigError, match="MLA_JIT_SM90_DECODE_SCHEDULE"):
            env.choice("MLA_JIT_SM90_DECODE_SCHEDULE")


def test_prewarm_covers_every_preset():
    family = registry.get("mla_decode_sm90")
    cfgs = list(family.prewarm_configs(SM90.tuning, presets.resolve(["deepseek-v3", "deepseek-v2-lite"])))
    # The default "auto" schedule picks the fused or the unfused ws kernel per call: both warmed,
    # each unclustered and in clusters of 2 (128 heads, or 64 at s_q = 2: two row tiles), for a
    # bf16, e4m3 q and cache, and bf16 q over an e4m3 cache; and compact rows, unclustered (the
    # TP4 / TP8 presets' 32 / 16 heads at s_q 1: at most 32 rows a KV head); e4m3 with S by token
    # halves too, either cluster size (128 heads at s_q 4: 512 rows a KV head).
    expected = [decode_config(dtype, 576, 512, 64, SM90.tuning, schedule, cluster_m, kv_dtype, rows)
                for dtype, kv_dtype in (("bf16", None), ("e4m3", None), ("bf16", "e4m3"))
                for schedule in ("ws", "ws_unfused")
                for cluster_m, rows in ((1, None), (2, None), (1, 16), (1, 512), (2, 512))]
    assert sum(c.s_halves for c in cfgs) == 4
    assert len(cfgs) == len(set(cfgs)) and set(cfgs) == set(expected)


def test_fused_combine_pays_only_for_small_calls_with_small_partials():
    from mla_jit.configs.decode import FUSED_COMBINE_MAX_KV_BYTES, fused_combine_pays
    # (batch, rows, parts, dv, max tokens[, KV bytes per token]) -> fused.
    # Large calls (every anchor shape): the combine kernel, whatever the partials.
    assert not fused_combine_pays(128, 128, 66, 512, 65536)
    assert not fused_combine_pays(32, 16, 132, 512, 65536)
    assert not fused_combine_pays(32, 16, 132, 512, 4096)
    # Small calls (host time bounds them): fused where the partials per batch are small.
    assert fused_combine_pays(1, 16, 132, 512, 256)            # the host-time shape
    assert not fused_combine_pays(1, 128, 66, 512, 2048)       # up to 32 splits of 64 rows: 4 MB of partials
    assert fused_combine_pays(2, 16, 132, 512, 1024)
    assert not fused_combine_pays(2, 64, 132, 512, 1024)       # 16 splits of 64 rows: 2 MB of partials
    assert fused_combine_pays(32, 64, 132, 512, 64)            # one KV tile per batch: one split
    # The size limit is on the KV the block table can address, in bytes.
    tokens = FUSED_COMBINE_MAX_KV_BYTES // (576 * 2)
    assert fused_combine_pays(1, 16, 132, 512, tokens)
    assert not fused_combine_pays(1, 16, 132, 512, tokens + 64)
    assert fused_combine_pays(1, 16, 132, 512, tokens + 64, kv_bytes_per_token=512 * 2)


def test_params_struct_layout_matches_header():
    from pathlib import Path
    import mla_jit
    header = Path(mla_jit.__file__).parent / "include/mla_jit/decode/common.cuh"
    assert f"static_assert(sizeof(DecodeParams) == {DECODE_PARAMS.size}," in header.read_text()
    assert DECODE_PARAMS.size == 216   # 160 + the FP8 descale pointers + the sparse fields + max_logits


def _assert_compiles_clean(family_name: str, cfg) -> None:
    """Built with ptxas's resource report: no stack, no spills, no serialized wgmma. The e4m3 q and
    cache kernel (V^T a register operand beside O^T's 128 accumulators) spills a few scalars of its
    P V loop (bench/NOTES.md, session 36): at most 64 bytes there."""
    family = registry.get(family_name)
    binary = build(family.source(cfg, SM90))
    for entry in family.entry_points(cfg):
        report = binary.log.split(f"Function properties for {entry}")[1].splitlines()[1]
        if getattr(cfg, "dtype", None) == "e4m3" and entry == "mla_jit_decode_splitkv":
            assert int(re.search(r"(\d+) bytes spill stores", report).group(1)) <= 64, binary.log
        else:
            assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    # ptxas's wgmma advisories: C7517 (a warpgroup.wait it had to inject), C7515 / C7518 / C7520
    # (every wgmma serialized: a non-wgmma definition of an accumulator in flight, a wait or an
    # arrive it put in a divergent path). Any one costs a large part of the kernel's speed.
    assert not any(code in binary.log for code in ("C7515", "C7517", "C7518", "C7520")), binary.log
    assert b"mla_jit_decode_splitkv_smem_bytes" in binary.cubin or family_name == "mla_metadata"


@pytest.mark.slow
def test_decode_kernels_compile_without_spills(cache_root, monkeypatch):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    for family_name, cfg in (("mla_metadata", metadata_config()),
                             ("mla_decode_sm90", decode_config("bf16", 576, 512, 64, SM90.tuning)),
                             ("mla_decode_sm90", decode_config("bf16", 512, 512, 16, SM90.tuning)),
                             ("mla_decode_sm90", decode_config("bf16", 576, 512, 64, SM90.tuning, "ws_unfused")),
                             ("mla_decode_sm90", decode_config("bf16", 576, 512, 16, SM90.tuning, "ws_unfused", 2)),
                             ("mla_decode_sm90", decode_config("bf16", 576, 512, 64, SM90.tuning, rows=16)),
                             ("mla_decode_sm90", decode_config("e4m3", 576, 512, 64, SM90.tuning, rows=32))):
        _assert_compiles_clean(family_name, cfg)


@pytest.mark.slow
@pytest.mark.parametrize("d,page,schedule,cluster_m", [(576, 64, "ws", 1), (512, 16, "ws_unfused", 2),
                                                       (576, 256, "ws_unfused", 1)])
def test_fp8_decode_kernels_compile_clean(d, page, schedule, cluster_m, cache_root, monkeypatch):
    """e4m3 q and cache, and a 16-bit q over an e4m3 cache (bf16, and fp16 at one shape)."""
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    # (the page-256 row with S by token halves, as at h_q 128 s_q 4 and more)
    rows = S_HALVES_MIN_ROWS if page == 256 else None
    _assert_compiles_clean("mla_decode_sm90", decode_config("e4m3", d, 512, page, SM90.tuning, schedule, cluster_m,
                                                            rows=rows))
    _assert_compiles_clean("mla_decode_sm90", decode_config("bf16" if page > 16 else "fp16", d, 512, page, SM90.tuning,
                                                            schedule, cluster_m, "e4m3"))


def test_tile_wide_tma_box_view_and_config():
    """Pages >= 64: the 4-D view's element (chunk c, token t, head h, x) is the cache's (t, h, 64 c + x),
    and the config takes the tile's chunks in one load (one per cluster CTA group); smaller pages a load
    a chunk."""
    import torch

    from mla_jit.runtimes.decode_plan import kv_tma_view
    k = torch.arange(3 * 64 * 2 * 576, dtype=torch.int32).view(3, 64, 2, 576)
    view4 = kv_tma_view(k, 4)
    assert view4.shape == (9, 192, 2, 64)
    c, t, h, x = 7, 100, 1, 33
    assert view4[c, t, h, x] == k.view(192, 2, 576)[t, h, 64 * c + x]
    assert torch.equal(view4.permute(1, 2, 0, 3).reshape(192, 2, 576), k.view(192, 2, 576))
    assert decode_config("e4m3", 576, 512, 64, SM90.tuning).chunks_per_load == 9
    assert decode_config("e4m3", 576, 512, 64, SM90.tuning, "ws", 2).chunks_per_load == 3
    assert decode_config("e4m3", 512, 512, 128, SM90.tuning, "ws", 2).chunks_per_load == 4
    assert decode_config("e4m3", 576, 512, 32, SM90.tuning).chunks_per_load == 1  # 2 pages a tile
    assert decode_config("bf16", 576, 512, 256, SM90.tuning).chunks_per_load == 9
    assert decode_config("bf16", 576, 512, 16, SM90.tuning, kv_dtype="e4m3").chunks_per_load == 1


@pytest.mark.slow
def test_fp8_clustered_tile_box_kernel_compiles_clean(cache_root, monkeypatch):
    """The e4m3 kernel (early stage release) with a TMA load a group of 3 chunks, clustered."""
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    cfg = decode_config("e4m3", 576, 512, 64, SM90.tuning, "ws_unfused", 2)
    assert cfg.chunks_per_load == 3
    assert "/*CHUNKS_PER_LOAD=*/3, /*S_HALVES=*/false>" in registry.get("mla_decode_sm90").source(cfg, SM90).source
    _assert_compiles_clean("mla_decode_sm90", cfg)


@pytest.mark.slow
@pytest.mark.parametrize("arch_name,rows,dtype", [("sm_80", 128, "bf16"), ("sm_80", 16, "bf16"), ("sm_86", 64, "bf16"),
                                                  ("sm_89", 128, "bf16"), ("sm_80@sm_90a", 128, "bf16"),
                                                  ("sm_80", 128, "e4m3"), ("sm_89", 16, "e4m3")])
def test_sm80_family_compiles_without_spills_with_hmma_and_cp_async(arch_name, rows, dtype, cache_root, monkeypatch,
                                                                      tmp_path):
    """tuning[@target]: sm_80@sm_90a is the family as the GPU tests run it on a Hopper GPU. e4m3 (q and
    cache): fp16 MMAs, the cache converted by bit arithmetic (sm_80) or by the cvt (sm_89: F2FP)."""

    from mla_jit.configs.decode_sm80 import sm80_decode_config
    from mla_jit.jit.arch import ArchPair, parse_arch
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    tuning, _, target = arch_name.partition("@")
    arch = ArchPair(parse_arch(tuning), parse_arch(target or tuning))
    family = registry.get("mla_decode_sm80")
    cfg = sm80_decode_config(dtype, 576, 512, 64, rows, arch.tuning)
    binary = build(family.source(cfg, arch))
    for entry in family.entry_points(cfg):
        report = binary.log.split(f"Function properties for {entry}")[1].splitlines()[1]
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    # Shared memory is checked against the arch's per-block limit by a static_assert in the header.
    sass = sass_of(binary.cubin, tmp_path)
    assert "HMMA.16816" in sass and "LDGSTS" in sass
    assert "LDL" not in sass and "STL" not in sass
    assert ("F2FP.F16.E4M3.UNPACK_B" in sass) == (cfg.fp8_cvt and tuning == "sm_89"), cfg


@pytest.mark.slow
@pytest.mark.parametrize("d,page", [(576, 64), (512, 16)])
def test_ws_fences_the_previous_p_while_s_runs(d, page, cache_root, tmp_path):
    """WG0 fences P(n - 1)'s stores for the async proxy between issuing S(n) and waiting for it, so
    the fence's latency hides behind the wgmmas: ptxas must not move the waits above the fence."""
    import re
    family = registry.get("mla_decode_sm90")
    binary = build(family.source(decode_config("bf16", d, 512, page, SM90.tuning, "ws"), SM90))
    sass = sass_of(binary.cubin, tmp_path)
    ops = re.findall(r"(HGMMA\.64x64x16\.F32\.BF16|WARPGROUP\.DEPBAR\.LE gsb0, 0x[01]|FENCE\.VIEW\.ASYNC\.S)", sass)
    # The tile loop: S's 64 x 64 wgmmas (two commit groups), the fence, the wait for the first
    # group (P(n - 1) is published after it), then the wait for the rest.
    assert any(ops[i:i + 4] == ["HGMMA.64x64x16.F32.BF16", "FENCE.VIEW.ASYNC.S", "WARPGROUP.DEPBAR.LE gsb0, 0x1",
                                "WARPGROUP.DEPBAR.LE gsb0, 0x0"] for i in range(len(ops) - 3)), ops


@pytest.mark.slow
def test_clustered_ws_arrives_without_gpu_scope_fences(cache_root, tmp_path):
    """The P V warps tell every CTA of the cluster that a stage is free with remote mbarrier
    arrives once per tile; with .release.cluster each one cost a MEMBAR.ALL.GPU (ncu: warps stalled
    on membar, H200). The unfused kernel has no other GPU-scope fence than the two cluster
    barriers (after barrier init, before exit)."""
    import re
    family = registry.get("mla_decode_sm90")
    binary = build(family.source(decode_config("bf16", 576, 512, 64, SM90.tuning, "ws_unfused", 2), SM90))
    sass = sass_of(binary.cubin, tmp_path)
    splitkv = sass.split("Function : mla_jit_decode_splitkv")[1].split("Function :")[0]
    assert len(re.findall(r"MEMBAR\.ALL\.GPU", splitkv)) == 2, re.findall(r"MEMBAR[.\w]*", splitkv)
    assert "UTMALDG.4D.MULTICAST" in splitkv  # each group of tile chunks loaded once for the cluster


@pytest.mark.slow
def test_trace_builds_are_keyed_apart_and_export_their_tables(cache_root, monkeypatch):
    """MLA_JIT_TRACE=1 compiles the per-CTA timestamp tables in (bench/trace_decode.py reads them
    by name); without it the kernels hold no trace code, under another cache key."""
    family = registry.get("mla_decode_sm90")
    cfg = decode_config("bf16", 576, 512, 64, SM90.tuning, "ws_unfused")
    monkeypatch.setenv("MLA_JIT_TRACE", "1")
    traced = build(family.source(cfg, SM90))
    assert b"mla_jit_trace_splitkv" in traced.cubin and b"mla_jit_trace_combine" in traced.cubin
    monkeypatch.setenv("MLA_JIT_TRACE", "0")
    plain = build(family.source(cfg, SM90))
    assert plain.key != traced.key and b"mla_jit_trace" not in plain.cubin


def test_sm80_smem_limit_is_enforced_at_compile_time(cache_root):
    import dataclasses

    import mla_jit
    from mla_jit.configs.decode_sm80 import sm80_decode_config
    from mla_jit.jit.arch import resolve_for_build
    arch = resolve_for_build("sm_89")
    family = registry.get("mla_decode_sm80")
    cfg = dataclasses.replace(sm80_decode_config("bf16", 576, 512, 64, 64, arch.tuning), smem_limit=48 * 1024)
    with pytest.raises(mla_jit.CompileError, match="static assert|static_assert"):
        build(family.source(cfg, arch))


def test_sm80_residency_model_matches_header(cache_root):
    """ctas_per_sm_for plans CTAs from a Python mirror of SplitKVSm80Config's smem map and min blocks
    per SM, and the combine grid from mirrors of combine.cuh's geometry: pin the mirrors to the
    headers (static_asserts, front end only) and the plan per GPU."""
    import itertools

    from mla_jit.configs.decode import COMBINE_ROWS_PER_CTA, COMBINE_THREADS
    from mla_jit.configs.decode_sm80 import (_sm80_min_blocks, _sm80_tiles, ctas_per_sm_for, sm80_decode_config,
                                             sm80_resident_ctas)
    from mla_jit.jit.arch import parse_arch, resolve_for_build
    from mla_jit.jit.build import KernelSource
    checks = []
    h200, a100, l40 = 233472, 167936, 102400
    cpp_of = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t", "e4m3": "cutlass::float_e4m3_t"}
    for arch_name, rows, (d, dv), (dtype, kv) in itertools.product(
            ("sm_80", "sm_86", "sm_89"), (1, 16, 17, 32, 33, 64, 128), SUPPORTED_HEAD_DIMS,
            (("bf16", None), ("e4m3", None), ("bf16", "e4m3"), ("fp16", "e4m3"))):
        arch = parse_arch(arch_name)
        cfg = sm80_decode_config(dtype, d, dv, 64, rows, arch, kv)
        kv_fp8 = (2 if cfg.fp8_cvt else 1) if cfg.kv_fp8 else 0
        out = "bf16" if dtype == "e4m3" else dtype
        cpp = (f"mla_jit::decode::SplitKVSm80Config<{cpp_of[cfg.mma_dtype]}, {d}, {dv}, 64, {cfg.block_m}, "
               f"{cfg.block_n}, {cfg.num_stages}, {cfg.num_warps}, {cfg.smem_limit}, 0, {kv_fp8}, {cpp_of[dtype]}, "
               f"{cpp_of[out]}, {cfg.fp8_k_stages}>")
        checks.append(f"static_assert({cpp}::kSmemBytes == {cfg.smem_bytes}, \"smem\");\n"
                      f"static_assert({cpp}::kMinBlocksPerSm == {_sm80_min_blocks(cfg.block_m)}, \"min blocks\");")
        if cfg.kv_fp8:   # the schedule is planned from the bf16 kernel: same rows a CTA, as many CTAs an SM
            assert cfg.block_m == _sm80_tiles(rows, arch)[0]
            for smem in (h200, a100, l40):
                assert sm80_resident_ctas(cfg.smem_bytes, cfg.num_warps, cfg.block_m, smem) >= \
                    ctas_per_sm_for(rows, arch, smem), (cfg, smem)
    # The sparse kernels (FP8 records; bf16 rows, whose tiles grow with the heads).
    from mla_jit.configs.decode import SPARSE_KV
    from mla_jit.configs.sparse import BF16_ROWS, FP8_RECORDS, SparseNarrowConfig, SparseWsConfig, sparse_config
    for arch_name, h_q, (kv, d) in itertools.product(("sm_80", "sm_89", "sm_90a"), (16, 32, 128),
                                                      ((FP8_RECORDS, 576), (BF16_ROWS, 576), (BF16_ROWS, 512))):
        cfg = sparse_config(kv, d, 64, parse_arch(arch_name), h_q)
        if isinstance(cfg, (SparseWsConfig, SparseNarrowConfig)):   # the wgmma kernels (sm_90a): not this family
            continue
        cpp = (f"mla_jit::decode::SplitKVSm80Config<cutlass::bfloat16_t, {d}, 512, 64, {cfg.block_m}, {cfg.block_n}, "
               f"{cfg.num_stages}, {cfg.num_warps}, {cfg.smem_limit}, {SPARSE_KV[kv]}>")
        checks.append(f"static_assert({cpp}::kSmemBytes == {cfg.smem_bytes}, \"smem\");\n"
                      f"static_assert({cpp}::kMinBlocksPerSm == {_sm80_min_blocks(cfg.block_m)}, \"min blocks\");")
    checks.append(f"static_assert(mla_jit::decode::kCombineRowsPerCta == {COMBINE_ROWS_PER_CTA}, \"combine rows\");\n"
                  f"static_assert(mla_jit::decode::kCombineThreads == {COMBINE_THREADS}, \"combine threads\");")
    source = ('#include "mla_jit/decode/splitkv_sm80.cuh"\n#include "mla_jit/decode/combine.cuh"\n'
              + "\n".join(dict.fromkeys(checks))
              + '\nextern "C" __global__ void residency_check() {}\n')
    build(KernelSource("sm80_residency_check", source, ("residency_check",), resolve_for_build("sm_80"), "none"))
    for arch_name, rows, want in (("sm_80", 16, (3, 2)), ("sm_80", 32, (2, 1)), ("sm_80", 64, (1, 1)),
                                  ("sm_89", 16, (3, 2, 1)), ("sm_89", 32, (2, 1, 1)), ("sm_89", 128, (2, 1, 1))):
        arch = parse_arch(arch_name)
        assert tuple(ctas_per_sm_for(rows, arch, smem) for smem in (h200, a100, l40)[:len(want)]) == want
        assert _sm80_tiles(rows, arch)[0] == (16 if rows <= 16 else 32 if arch_name != "sm_80" or rows <= 32 else 64)

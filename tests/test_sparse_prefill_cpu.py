"""flash_mla_sparse_fwd without a GPU: configs and their shared memory, the typed errors of the argument
checks, the packed launch of a plan (GPU stubbed), the prewarm list and a compile check of the
bf16-rows kernel."""
import pytest
import torch

from mla_jit.configs.sparse import (BF16_ROWS, FP8_RECORDS, SparseNarrowConfig, SparseWsConfig, family_of, sparse_config,
                                    sparse_decode_config)
from mla_jit.errors import InvalidArgumentError
from mla_jit.jit.arch import ArchPair, parse_arch
from mla_jit.jit.build import build
from mla_jit.ops import sparse_prefill, validate
from mla_jit.presets import PRESETS
from mla_jit.runtimes import registry
from mla_jit.runtimes.decode import DECODE_PARAMS, METADATA_PARAMS

from .helpers import sass_of


@pytest.mark.parametrize("arch,d,smem", [("sm_80", 576, 77_888), ("sm_89", 576, 77_888), ("sm_89", 512, 69_696)])
def test_bf16_rows_config_has_no_landing_slots(arch, d, smem):
    cfg = sparse_config(BF16_ROWS, d, 16, parse_arch(arch))
    # 4 stages of 16 bf16 rows, their valid flags and the S exchange; the page size is a placeholder.
    assert (cfg.sparse, cfg.num_stages, cfg.page_size, cfg.smem_bytes) == (BF16_ROWS, 4, 64, smem)
    assert sparse_config(FP8_RECORDS, 576, 64, parse_arch(arch)) == sparse_decode_config(64, parse_arch(arch))


@pytest.mark.parametrize("arch,h_q,tiles", [("sm_80", 16, (16, 16, 4, 4)), ("sm_80", 20, (32, 16, 3, 4)),
                                           ("sm_80", 32, (32, 16, 3, 4)), ("sm_80", 128, (64, 32, 2, 8)),
                                           ("sm_89", 128, (32, 16, 3, 4)), ("sm_86", 8, (16, 16, 4, 4))])
def test_bf16_rows_tiles_grow_with_the_heads(arch, h_q, tiles):
    """Above 16 heads a gathered row feeds 32 or 64 heads' MMAs (the dense family's Q-in-smem tiles)."""
    cfg = sparse_config(BF16_ROWS, 576, 64, parse_arch(arch), h_q)
    assert (cfg.block_m, cfg.block_n, cfg.num_stages, cfg.num_warps) == tiles and cfg.smem_bytes <= cfg.smem_limit
    # FP8 records on the mma.sync kernel: 16-row tiles, above 16 heads two of them a CTA (8 warps)
    fp8 = sparse_config(FP8_RECORDS, 576, 64, parse_arch(arch), h_q)
    expected = (16, 16, 4) if h_q <= 16 else (32, 16, 8)
    assert (fp8.block_m, fp8.block_n, fp8.num_warps) == expected and fp8.smem_bytes <= fp8.smem_limit


@pytest.mark.parametrize("h_q", [1, 8, 16, 17, 32, 64, 100, 128])
@pytest.mark.parametrize("d", [576, 512])
def test_every_head_count_takes_the_wgmma_kernel_on_hopper(h_q, d):
    cfg = sparse_config(BF16_ROWS, d, 64, parse_arch("sm_90a"), h_q)
    assert cfg == SparseWsConfig(d, 3) and family_of(cfg) == "mla_sparse_sm90"
    assert (cfg.block_m, cfg.num_threads, cfg.sparse_kv) == (64, 384, 2)
    # FP8 records (any page size): up to 16 heads the narrow kernel (8- or 16-head groups), above
    # 2 bf16 stages and a record slot; not on the other arches.
    fp8 = sparse_config(FP8_RECORDS, 576, 16, parse_arch("sm_90a"), h_q)
    if h_q <= 16:
        assert fp8 == SparseNarrowConfig(8 if h_q <= 8 else 16, 2, 16)
        assert family_of(fp8) == "mla_sparse_narrow_sm90" and (fp8.block_m, fp8.num_threads) == (fp8.heads, 128)
    else:
        # Two head tiles (65-128 heads): the pair as a cluster sharing each tile's de-quantization.
        pair = 2 if h_q > 64 else 1
        assert fp8 == SparseWsConfig(576, 2, FP8_RECORDS, 16, cluster_m=pair)
        assert fp8.cluster == ((1, 1, 2) if pair == 2 else None)
    assert family_of(sparse_config(BF16_ROWS, d, 64, parse_arch("sm_80"), h_q)) == "mla_sparse_decode"
    assert family_of(sparse_config(FP8_RECORDS, 576, 64, parse_arch("sm_89"), h_q)) == "mla_sparse_decode"
    with pytest.raises(InvalidArgumentError, match="SparseWsConfig.head_dim"):
        SparseWsConfig(192, 3)
    with pytest.raises(InvalidArgumentError, match="SparseWsConfig.num_stages"):
        SparseWsConfig(576, 3, FP8_RECORDS)
    with pytest.raises(InvalidArgumentError, match="SparseWsConfig.cluster_m"):
        SparseWsConfig(576, 3, cluster_m=2)


def _args(**kw):
    args = dict(q=torch.zeros((4, 16, 576), dtype=torch.bfloat16), kv=torch.zeros((100, 1, 576), dtype=torch.bfloat16),
                indices=torch.zeros((4, 1, 128), dtype=torch.int32), d_v=512, attn_sink=None)
    args.update(kw)
    return args


@pytest.mark.parametrize("change,name", [
    (dict(q=torch.zeros((4, 16, 192), dtype=torch.bfloat16)), "q"),
    (dict(q=torch.zeros((4, 129, 576), dtype=torch.bfloat16)), "q"),
    (dict(q=torch.zeros((4, 16, 576), dtype=torch.float16)), "q"),
    (dict(kv=torch.zeros((100, 1, 512), dtype=torch.bfloat16)), "kv"),
    (dict(kv=torch.zeros((100, 2, 576), dtype=torch.bfloat16)), "kv"),
    (dict(kv=torch.zeros((4, 64, 1, 576), dtype=torch.uint8)), "kv"),
    (dict(kv=torch.zeros((4, 48, 1, 656), dtype=torch.uint8)), "kv"),
    (dict(kv=torch.zeros((4, 64, 1, 656), dtype=torch.uint8), q=torch.zeros((4, 16, 512), dtype=torch.bfloat16)),
     "kv"),
    (dict(indices=torch.zeros((4, 2, 128), dtype=torch.int32)), "indices"),
    (dict(indices=torch.zeros((4, 1, 128), dtype=torch.int64)), "indices"),
    (dict(d_v=576), "d_v"),
    (dict(attn_sink=torch.zeros(15)), "attn_sink"),
])
def test_bad_layouts_name_the_argument(change, name, monkeypatch):
    monkeypatch.setattr(validate, "on_gpu", lambda tensor: True)
    with pytest.raises(InvalidArgumentError) as err:
        sparse_prefill._check_layout(**_args(**change))
    assert name in str(err.value)


def test_layout_checks_tell_the_kv_format(monkeypatch):
    monkeypatch.setattr(validate, "on_gpu", lambda tensor: True)
    assert sparse_prefill._check_layout(**_args()) == BF16_ROWS
    assert sparse_prefill._check_layout(**_args(kv=torch.zeros((4, 64, 1, 656), dtype=torch.uint8))) == FP8_RECORDS


class _Recorder:
    def __init__(self):
        self.launches = []

    def __call__(self, stream, *args):
        self.launches.append(args)


class _Plan:
    """SparsePrefillPlan's fields without building kernels."""
    kv_format, parts, h_q, block_n, fixed_overhead_blocks, device_index = BF16_ROWS, 33, 20, 64, 5, 0


def test_plan_packs_a_whole_rows_schedule_and_max_logits(monkeypatch):
    from mla_jit.runtimes import sparse_prefill_plan as runtime
    monkeypatch.setattr(runtime, "current_stream", lambda device: 7)
    plan = runtime.SparsePrefillPlan.__new__(runtime.SparsePrefillPlan)
    for name in ("kv_format", "parts", "h_q", "block_n", "fixed_overhead_blocks", "device_index"):
        setattr(plan, name, getattr(_Plan, name))
    plan.metadata, plan.splitkv = _Recorder(), _Recorder()
    q = torch.zeros((6, 20, 576), dtype=torch.bfloat16)
    kv = torch.zeros((300, 1, 576), dtype=torch.bfloat16)
    indices, length = torch.zeros((6, 1, 256), dtype=torch.int32), torch.ones(6, dtype=torch.int32)
    out, max_logits, lse = q.new_empty((6, 20, 512)), torch.empty(6, 20), torch.empty(6, 20)
    plan.run(q, kv, indices, 0.5, length, None, out, max_logits, lse)
    (meta,), = plan.metadata.launches
    # (seqlens, metadata, num_splits, b, parts, block_n, overhead, fixed_length = topk, whole_rows)
    assert METADATA_PARAMS.unpack(meta)[3:] == (6, 33, 64, 5, 256, 1)
    (params, kv_ptr), = plan.splitkv.launches
    fields = DECODE_PARAMS.unpack(params)
    assert fields[0] == q.data_ptr() and fields[1] == out.data_ptr() and fields[2] == lse.data_ptr()
    assert fields[-1] == max_logits.data_ptr() and fields[-3:-1] == (256, 300) and fields[-4] == 576 * 2
    assert fields[-6] == length.data_ptr() and fields[-5] == 0 and kv_ptr == kv.data_ptr()
    plan.run(q[:0], kv, indices[:0], 0.5, None, None, out[:0], max_logits[:0], lse[:0])
    assert len(plan.splitkv.launches) == 1   # no tokens: nothing launched


def test_prewarm_lists_the_prefill_kernels(monkeypatch):
    monkeypatch.delenv("MLA_JIT_SM90_CLUSTER", raising=False)
    family = registry.get("mla_sparse_decode")
    v32 = [p for p in PRESETS.values() if p.indexer_heads and p.head_dim == 576]
    assert v32, "a preset with DeepSeek sparse attention"
    configs = family.prewarm_configs(parse_arch("sm_89"), v32)
    assert {c.sparse for c in configs} == {FP8_RECORDS, BF16_ROWS}
    # the kernels of the presets' head counts (128 / 64 / 32 / 16 heads at TP 1 / 2 / 4 / 8): on Ada
    # 16-row tiles (FP8 records; bf16 rows at 16 heads) and 32-row ones (bf16 rows above)
    assert {c.block_m for c in configs} == {16, 32}
    # Hopper: the wgmma kernel above 16 heads and for bf16 rows; at 128 heads as cluster pairs only
    # with MLA_JIT_SM90_CLUSTER=2 (configs/sparse.py head_tile_pairs)
    assert family.prewarm_configs(parse_arch("sm_90a"), v32) == []
    wide = registry.get("mla_sparse_sm90")
    assert set(wide.prewarm_configs(parse_arch("sm_90a"), v32)) == {
        SparseWsConfig(576, 2, FP8_RECORDS, 64), SparseWsConfig(576, 3)}
    monkeypatch.setenv("MLA_JIT_SM90_CLUSTER", "2")
    assert set(wide.prewarm_configs(parse_arch("sm_90a"), v32)) == {
        SparseWsConfig(576, 2, FP8_RECORDS, 64), SparseWsConfig(576, 2, FP8_RECORDS, 64, cluster_m=2),
        SparseWsConfig(576, 3)}
    monkeypatch.delenv("MLA_JIT_SM90_CLUSTER")
    # (16 heads at TP 8: the narrow kernel)
    assert set(registry.get("mla_sparse_narrow_sm90").prewarm_configs(parse_arch("sm_90a"), v32)) == {
        SparseNarrowConfig(16, 2, 64)}
    assert registry.get("mla_sparse_sm90").prewarm_configs(parse_arch("sm_90a"), []) == []
    # `mla-jit prewarm --op flash_mla_sparse_fwd` warms the scheduler kernel it launches too
    assert "flash_mla_sparse_fwd" in registry.get("mla_metadata").ops


@pytest.mark.slow
def test_bf16_rows_kernel_compiles_without_spills(cache_root, monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    arch = ArchPair(parse_arch("sm_89"), parse_arch("sm_89"))
    family = registry.get("mla_sparse_decode")
    cfg = sparse_config(BF16_ROWS, 512, 64, arch.tuning, 32)   # Q in shared memory, 32 x 16 tiles
    binary = build(family.source(cfg, arch))
    report = binary.log.split(f"Function properties for {family.SPLITKV}")[1].splitlines()[1]
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    sass = sass_of(binary.cubin, tmp_path)
    assert "HMMA.16816" in sass and "LDGSTS" in sass


@pytest.mark.slow
def test_bf16_rows_wgmma_kernel_compiles_without_spills(cache_root, monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    arch = ArchPair(parse_arch("sm_90a"), parse_arch("sm_90a"))
    family = registry.get("mla_sparse_sm90")
    binary = build(family.source(SparseWsConfig(576, 3), arch))
    report = binary.log.split(f"Function properties for {family.SPLITKV}")[1].splitlines()[1]
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    assert "C75" not in binary.log, binary.log   # no wgmma serialization warnings
    sass = sass_of(binary.cubin, tmp_path)
    assert "HGMMA" in sass and "LDGSTS" in sass


@pytest.mark.slow
@pytest.mark.parametrize("heads", [8, 16])
def test_narrow_fp8_records_kernel_compiles(heads, cache_root, monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    arch = ArchPair(parse_arch("sm_90a"), parse_arch("sm_90a"))
    family = registry.get("mla_sparse_narrow_sm90")
    binary = build(family.source(SparseNarrowConfig(heads, 2, 64), arch))
    report = binary.log.split(f"Function properties for {family.SPLITKV}")[1].splitlines()[1]
    assert "C75" not in binary.log, binary.log   # no wgmma serialization warnings
    spilled = int(report.split(" bytes spill stores")[0].rsplit(" ", 1)[1])
    assert spilled <= 64, binary.log   # (a few loop invariants at 16 heads)
    sass = sass_of(binary.cubin, tmp_path)
    assert f"HGMMA.64x{heads}x16.F32.BF16" in sass and "STSM" in sass


@pytest.mark.slow
@pytest.mark.parametrize("cluster_m", [1, 2])
def test_fp8_records_wgmma_kernel_compiles_without_spills(cluster_m, cache_root, monkeypatch):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    arch = ArchPair(parse_arch("sm_90a"), parse_arch("sm_90a"))
    family = registry.get("mla_sparse_sm90")
    binary = build(family.source(SparseWsConfig(576, 2, FP8_RECORDS, 16, cluster_m=cluster_m), arch))
    report = binary.log.split(f"Function properties for {family.SPLITKV}")[1].splitlines()[1]
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    assert "C75" not in binary.log, binary.log

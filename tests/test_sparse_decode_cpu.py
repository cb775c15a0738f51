"""The sparse (DSA) decode without a GPU: configs, the shared memory mirror, argument checks and a
compile check of the kernel for Hopper and Ada."""
import pytest
import torch

from mla_jit.configs.decode_sm80 import Sm80DecodeConfig
from mla_jit.configs.sparse import ctas_per_sm, num_sm_parts, sparse_decode_config
from mla_jit.errors import FeatureNotAvailableError, InvalidArgumentError
from mla_jit.jit.arch import ArchPair, parse_arch
from mla_jit.jit.build import build
from mla_jit.ops import sparse_decode, validate
from mla_jit.runtimes import registry

from .helpers import sass_of


@pytest.mark.parametrize("arch,stages,smem", [("sm_80", 4, 111_680), ("sm_89", 3, 84_784), ("sm_86", 3, 84_784)])
def test_config_fits_each_arch(arch, stages, smem):
    cfg = sparse_decode_config(64, parse_arch(arch))
    assert (cfg.block_m, cfg.block_n, cfg.num_stages, cfg.sparse) == (16, 16, stages, "fp8_records")
    assert cfg.smem_bytes == smem <= cfg.smem_limit


def test_config_rejects_what_the_kernel_does_not_serve():
    with pytest.raises(InvalidArgumentError, match="sparse"):
        Sm80DecodeConfig("bf16", 512, 512, 64, 16, 16, 3, 4, 163 * 1024, sparse="fp8_records")
    with pytest.raises(InvalidArgumentError, match="sparse"):
        Sm80DecodeConfig("fp16", 576, 512, 64, 32, 16, 3, 4, 163 * 1024, sparse="bf16_rows")
    with pytest.raises(InvalidArgumentError, match="sparse"):
        Sm80DecodeConfig("bf16", 576, 512, 64, 16, 16, 2, 4, 163 * 1024, sparse="fp8_records")
    with pytest.raises(InvalidArgumentError, match="sparse"):
        Sm80DecodeConfig("bf16", 576, 512, 64, 16, 16, 2, 4, 163 * 1024, sparse=True)


def test_schedule_parts_cover_one_wave():
    ampere = parse_arch("sm_80")
    assert ctas_per_sm(sparse_decode_config(64, ampere), 233_472) == 2   # 2 x (111.7 + 1) KB of a 228 KB SM
    assert num_sm_parts(132, 2, 16) == 264 and num_sm_parts(132, 2, 128) == 33 and num_sm_parts(1, 1, 128) == 1


def _args(**kw):
    q = torch.zeros((2, 2, 16, 576), dtype=torch.bfloat16)
    args = dict(q=q, k_cache=torch.zeros((4, 64, 1, 656), dtype=torch.uint8),
                indices=torch.zeros((2, 2, 128), dtype=torch.int32),
                tile_scheduler_metadata=torch.zeros((8, 8), dtype=torch.int32),
                num_splits=torch.zeros(5, dtype=torch.int32), head_dim_v=512, topk_length=None, attn_sink=None)
    args.update(kw)
    return args


@pytest.mark.parametrize("change,name", [
    (dict(q=torch.zeros((2, 2, 16, 512), dtype=torch.bfloat16)), "q"),
    (dict(q=torch.zeros((2, 2, 129, 576), dtype=torch.bfloat16)), "q"),
    (dict(q=torch.zeros((2, 2, 16, 576), dtype=torch.float16)), "q"),
    (dict(q=torch.zeros((4, 2, 16, 576), dtype=torch.bfloat16)[::2]), "q"),
    (dict(k_cache=torch.zeros((4, 64, 1, 576), dtype=torch.uint8)), "k_cache"),
    (dict(k_cache=torch.zeros((4, 64, 1, 656), dtype=torch.bfloat16)), "k_cache"),
    (dict(k_cache=torch.zeros((4, 48, 1, 656), dtype=torch.uint8)), "k_cache"),
    (dict(indices=torch.zeros((2, 2, 128), dtype=torch.int64)), "indices"),
    (dict(indices=torch.zeros((2, 1, 128), dtype=torch.int32)), "indices"),
    (dict(topk_length=torch.zeros(3, dtype=torch.int32)), "topk_length"),
    (dict(attn_sink=torch.zeros(16, dtype=torch.float16)), "attn_sink"),
    (dict(num_splits=torch.zeros(3, dtype=torch.int32)), "num_splits"),
    (dict(head_dim_v=128), "head_dim_v"),
])
def test_bad_arguments_name_the_argument(change, name, monkeypatch):
    monkeypatch.setattr(validate, "on_gpu", lambda tensor: True)
    with pytest.raises(InvalidArgumentError) as err:
        sparse_decode._check_args(**_args(**change))
    assert name in str(err.value)


def test_op_level_rejections():
    a = _args()
    call = dict(q=a["q"], k_cache=a["k_cache"], indices=a["indices"], head_dim_v=512,
                tile_scheduler_metadata=a["tile_scheduler_metadata"], num_splits=a["num_splits"], softmax_scale=None,
                topk_length=None, attn_sink=None, descale_q=None, descale_k=None)
    with pytest.raises(InvalidArgumentError, match="causal"):
        sparse_decode.sparse_decode(**call, causal=True, is_fp8_kvcache=True)
    with pytest.raises(FeatureNotAvailableError, match="is_fp8_kvcache"):
        sparse_decode.sparse_decode(**call, causal=False, is_fp8_kvcache=False)
    with pytest.raises(InvalidArgumentError, match="descale_k"):
        sparse_decode.sparse_decode(**{**call, "descale_k": torch.ones(1)}, causal=False, is_fp8_kvcache=True)


@pytest.mark.slow
@pytest.mark.parametrize("arch_name", ["sm_80", "sm_89"])
def test_sparse_kernel_compiles_without_spills(arch_name, cache_root, monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    arch = ArchPair(parse_arch(arch_name), parse_arch(arch_name))
    family = registry.get("mla_sparse_decode")
    cfg = sparse_decode_config(64, arch.tuning)
    binary = build(family.source(cfg, arch))
    for entry in family.entry_points(cfg):
        report = binary.log.split(f"Function properties for {entry}")[1].splitlines()[1]
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    sass = sass_of(binary.cubin, tmp_path)
    assert "HMMA.16816" in sass and "LDGSTS" in sass and "PRMT" in sass


def _covered(meta, num_splits, lengths, block_n):
    """Each sequence's tokens as the parts' ranges cover them, and the split count of each."""
    tokens = [[] for _ in lengths]
    pieces = [0] * len(lengths)
    for begin_b, begin_tok, end_b, end_tok, *_ in meta:
        if (begin_b, begin_tok, end_b, end_tok) == (0, 0, 0, 0):
            continue
        for i in range(begin_b, end_b + 1):
            lo, hi = begin_tok if i == begin_b else 0, end_tok if i == end_b else lengths[i]
            if lengths[i] > 0:
                tokens[i].append((lo, hi))
                pieces[i] += 1
    return tokens, pieces


@pytest.mark.parametrize("seed", range(6))
def test_host_schedule_covers_every_sequence_once(seed):
    """runtimes/decode_schedule.greedy_schedule (the metadata kernel's split, on the host; a GPU test
    compares the two): each non-empty sequence's tokens covered once, in order, by as many pieces
    as num_splits gives it; empty ones get none."""
    from mla_jit.runtimes.decode_schedule import greedy_schedule
    gen = torch.Generator().manual_seed(seed)
    b = int(torch.randint(1, 300, (1,), generator=gen))
    lengths = torch.randint(0, 5000, (b,), generator=gen)
    lengths[torch.rand(b, generator=gen) < 0.2] = 0
    lengths = lengths.tolist()
    parts = int(torch.randint(1, 140, (1,), generator=gen))
    meta, num_splits = greedy_schedule(lengths, parts, 64, 5)
    assert len(meta) == parts and num_splits[0] == 0 and len(num_splits) == b + 1
    tokens, pieces = _covered(meta, num_splits, lengths, 64)
    for i, n in enumerate(lengths):
        assert num_splits[i + 1] - num_splits[i] == (pieces[i] if n > 0 else 0)
        if n > 0:
            ranges = tokens[i]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == c[0] and a[0] < a[1] for a, c in zip(ranges, ranges[1:] + [(n, n)]))


def test_host_schedule_of_the_benchmark_rows():
    """b 128 (and 256 rows), topk 2048 (32 tiles): every part holds whole rows, so the plan launches
    no combine; 100 rows of 8192 keys on 132 parts are cut."""
    from mla_jit.configs.decode import metadata_config
    from mla_jit.runtimes.decode_schedule import greedy_schedule, splits_a_row
    cfg = metadata_config()
    assert (cfg.block_n, cfg.fixed_overhead_blocks) == (64, 5)   # (the figures below assume them)
    assert (num_sm_parts(132, 1, 64, 64), num_sm_parts(132, 1, 128, 64)) == (132, 66)
    meta, num_splits = greedy_schedule([2048] * 128, 132, 64, 5)
    assert meta[5][:5] == [5, 0, 5, 2048, 0] and meta[128] == [0] * 8 and num_splits == list(range(129))
    assert not any(splits_a_row(rows, 2048, parts, 64, 5) for rows, parts in ((128, 132), (256, 132), (128, 66),
                                                                              (256, 66)))
    assert splits_a_row(100, 8192, 132, 64, 5) and splits_a_row(3, 2048, 132, 64, 5)


def test_closed_form_split_test_matches_the_greedy():
    from mla_jit.runtimes.decode_schedule import greedy_schedule, splits_a_row
    gen = torch.Generator().manual_seed(3)
    for _ in range(3000):
        rows, length, parts, overhead = (int(torch.randint(lo, hi, (1,), generator=gen))
                                         for lo, hi in ((1, 400), (1, 9000), (1, 300), (0, 9)))
        _, num_splits = greedy_schedule([length] * rows, parts, 64, overhead)
        cut = any(num_splits[i + 1] - num_splits[i] > 1 for i in range(rows))
        assert splits_a_row(rows, length, parts, 64, overhead) == cut, (rows, length, parts, overhead)


@pytest.mark.parametrize("resident,choice,paired", [(66, "2", True), (65, "2", False), (66, "1", False),
                                                    (66, "auto", False)])
def test_head_tile_pairs_fall_back_unpaired_when_not_all_resident(resident, choice, paired, monkeypatch):
    """128 heads on sm_90a: the two head tiles as cluster pairs (66 of them on 66 parts) when the GPU
    keeps them all resident at once and MLA_JIT_SM90_CLUSTER is 2 (`auto` leaves them unpaired until
    the pair kernel's ordering fix has run on a GPU), else the unpaired kernel: no cluster, no second
    wave. Prewarm builds what the plan picks."""
    from mla_jit.presets import PRESETS
    from mla_jit.runtimes import decode_plan, sparse_decode_plan
    monkeypatch.setenv("MLA_JIT_SM90_CLUSTER", choice)
    monkeypatch.setattr(decode_plan, "read_global_int32", lambda binary, symbol, device: 1234)
    monkeypatch.setattr(decode_plan, "_smem_bytes", {})
    monkeypatch.setattr(decode_plan, "max_active_clusters", lambda kernel, grid, block, smem, cluster: resident)
    family = registry.get("mla_sparse_sm90")
    calls = []
    monkeypatch.setattr(family, "binary", lambda cfg, arch: None)
    monkeypatch.setattr(family, "kernel", lambda *a: None)
    monkeypatch.setattr(family, "launcher", lambda *a, **k: calls.append((a, k)) or len(calls))
    arch = ArchPair(parse_arch("sm_90a"), parse_arch("sm_90a"))
    _, cfg = sparse_decode_plan.splitkv_launcher("fp8_records", 576, 64, 128, 66, arch, 0)
    ((args, kwargs),) = calls
    assert cfg.cluster_m == (2 if paired else 1) and args[0] == cfg
    assert args[5:7] == ((66, 1, 2), (384, 1, 1))
    assert kwargs["cluster"] == ((1, 1, 2) if paired else None) and kwargs["dynamic_smem"] == 1234
    v32 = [p for p in PRESETS.values() if p.indexer_heads and p.head_dim == 576 and p.num_heads_q == 128]
    assert v32, "a 128-head preset with DeepSeek sparse attention"
    warm = {c.cluster_m for c in family.prewarm_configs(parse_arch("sm_90a"), v32) if c.sparse == "fp8_records"}
    assert warm == ({2} if choice == "2" else {1})

"""GPU-free checks of the V3.2 indexer: configs, parameter layouts against the headers, the float32
references against naive loops, the schedule contract, compile-only SASS of representative kernels
(no local memory, and the wgmma pipeline kept asynchronous), and the ops' typed errors."""
from pathlib import Path

import pytest
import torch

import mla_jit
from mla_jit.configs.indexer import (INDEXER_HEADS, SM80_SMEM_LIMITS, LogitsConfig, PagedConfig, logits_chunk_keys,
                                     logits_config, logits_sm80_config, paged_config, paged_sm80_config)
from mla_jit.jit.arch import resolve_for_build
from mla_jit.jit.build import build
from mla_jit.ops import validate
from mla_jit.runtimes import registry
from mla_jit.runtimes.indexer import (LOGITS_PARAMS, LOGITS_SM80_PARAMS, METADATA_PARAMS, PAGED_PARAMS,
                                      PAGED_SM80_PARAMS)

from .helpers import sass_of
from .indexer_reference import expected_schedule, mqa_logits_reference, paged_cache, paged_logits_reference

REPO = Path(__file__).resolve().parent.parent
SM90 = resolve_for_build("sm_90a")


def test_params_structs_match_header():
    header = (REPO / "mla_jit/include/mla_jit/indexer/common.cuh").read_text()
    assert f"static_assert(sizeof(LogitsParams) == {LOGITS_PARAMS.size}," in header
    assert f"static_assert(sizeof(PagedParams) == {PAGED_PARAMS.size}," in header
    assert f"static_assert(sizeof(MetadataParams) == {METADATA_PARAMS.size}," in header
    sm80 = (REPO / "mla_jit/include/mla_jit/indexer/mma_sm80.cuh").read_text()
    assert f"static_assert(sizeof(LogitsSm80Params) == {LOGITS_SM80_PARAMS.size}," in sm80
    assert f"static_assert(sizeof(PagedSm80Params) == {PAGED_SM80_PARAMS.size}," in sm80


def test_configs():
    for h in INDEXER_HEADS:
        assert logits_config(h, 128, SM90.tuning).smem_bytes <= 227 * 1024
        for next_n in (1, 2, 3, 4):
            assert paged_config(h, 128, next_n, 64, SM90.tuning).smem_bytes <= 227 * 1024
    assert logits_config(64, 128, SM90.tuning).unit_rows == 4
    with pytest.raises(mla_jit.InvalidArgumentError, match="heads"):
        LogitsConfig(48, 128)
    with pytest.raises(mla_jit.InvalidArgumentError, match="linear_on_mma"):
        LogitsConfig(16, 128, linear_on_mma=True)
    assert logits_config(64, 128, SM90.tuning).linear_on_mma and not logits_config(16, 128, SM90.tuning).linear_on_mma
    with pytest.raises(mla_jit.InvalidArgumentError, match="next_n"):
        PagedConfig(64, 128, 5, 64)
    # Paged: three math warpgroups where a tile's columns allow (next_n x heads <= 128), two load warps,
    # and a stage count both divide (each stage serves one warpgroup and is filled by one load warp;
    # 16 stages with 3 math warpgroups hung on the H200).
    for h in INDEXER_HEADS:
        for next_n in (1, 2, 3, 4):
            cfg = paged_config(h, 128, next_n, 64, SM90.tuning)
            assert cfg.math_warpgroups == (3 if next_n * h <= 128 else 2)
            assert cfg.load_warps == 2 and cfg.num_stages % cfg.math_warpgroups == 0 == cfg.num_stages % cfg.load_warps
            assert cfg.linear_on_mma == (h == 64 and next_n == 2) and cfg.smem_bytes <= 227 * 1024
    with pytest.raises(mla_jit.InvalidArgumentError, match="linear_on_mma"):
        PagedConfig(64, 128, 4, 64, 12, 2, 2, True)   # 256 + 16 columns: more than one wgmma N
    with pytest.raises(mla_jit.InvalidArgumentError, match="linear_on_mma"):
        PagedConfig(32, 128, 3, 64, 12, 3, 2, True)   # an odd next_n: 4 q' columns a token, 8 a group
    with pytest.raises(mla_jit.InvalidArgumentError, match="load_warps"):
        PagedConfig(64, 128, 1, 64, 12, 3, 3)         # only two load warps have run on a GPU
    with pytest.raises(mla_jit.InvalidArgumentError, match="num_stages"):
        PagedConfig(64, 128, 1, 64, 16, 3)
    with pytest.raises(mla_jit.InvalidArgumentError, match="num_stages"):
        PagedConfig(64, 128, 4, 64, 7, 2)
    with pytest.raises(mla_jit.InvalidArgumentError, match="load_warps"):
        PagedConfig(64, 128, 1, 64, 9, 3, 2)
    # Units: at least min_keys (4096 unless given); about 64 an SM when there is that much work.
    assert logits_chunk_keys(4096, 1024, 132) == 4096
    assert logits_chunk_keys(4096, 1024, 132, logits_config(64, 128, SM90.tuning).min_chunk_keys) == 16384
    assert logits_chunk_keys(131072, 512, 132) == 7936
    # sm_90a: 16384 keys, halved while that leaves fewer than two units an SM.
    assert logits_chunk_keys(32768, 512, 132, 16384) == 16384
    assert logits_chunk_keys(131072, 8, 132, 16384) == 4096      # 8 q blocks: 256 units, not 64
    assert logits_chunk_keys(131072, 24, 132, 16384) == 8192     # 384 units, not 192
    assert logits_chunk_keys(40000, 88, 132, 16384) == 16384     # (the GPU test's shapes)
    assert logits_chunk_keys(40000, 56, 132, 16384) == 8192
    assert logits_chunk_keys(40000, 8, 132, 12288) == 4096       # halving stays on 64-key tiles, >= 4096
    assert logits_chunk_keys(40000, 8, 132, 16448) % 64 == 0


def test_references_against_naive_loops():
    torch.manual_seed(0)
    m, n, h, d = 5, 9, 8, 16
    q = torch.randn(m, h, d).to(torch.float8_e4m3fn)
    k = torch.randn(n, d).to(torch.float8_e4m3fn)
    k_scale, w = torch.rand(n) + 0.1, torch.randn(m, h)
    ks, ke = torch.tensor([0, 2, 5, 9, 3], dtype=torch.int32), torch.tensor([4, 2, 9, 9, 7], dtype=torch.int32)
    ref, _ = mqa_logits_reference(q, k, k_scale, w, ks, ke)
    for i in range(m):
        for j in range(n):
            if not ks[i] <= j < ke[i]:
                assert ref[i, j] == float("-inf")
                continue
            want = sum(max(float(q[i, hh].float() @ (k[j].float() * k_scale[j])), 0.0) * float(w[i, hh])
                       for hh in range(h))
            assert abs(float(ref[i, j]) - want) < 1e-4 * (1 + abs(want))
    # Paged: the cache round trip and the 1-D visibility (row j sees keys <= len - next_n + j).
    keys = torch.randn(100, d)
    cache = paged_cache(keys, 32, 6, torch.tensor([4, 0, 2, 5]))
    table = torch.tensor([[4, 0, 2, 5]], dtype=torch.int32)
    pq, pw = torch.randn(1, 2, h, d).to(torch.float8_e4m3fn), torch.randn(2, h)
    logits, _, limits = paged_logits_reference(pq, cache, pw, torch.tensor([100], dtype=torch.int32), table, 128)
    assert limits.tolist() == [99, 100]
    assert torch.isneginf(logits[0, 99:]).all() and not torch.isneginf(logits[1, :100]).any()
    qk = (keys.float() / keys.abs().amax(1, keepdim=True) * 448).to(torch.float8_e4m3fn).float() \
        * (keys.abs().amax(1, keepdim=True) / 448)
    want = (torch.einsum("hd,nd->hn", pq[0, 1].float(), qk).relu() * pw[1][:, None]).sum(0)
    assert torch.allclose(logits[1, :100], want, rtol=1e-4, atol=1e-4)


def test_expected_schedule():
    assert expected_schedule(torch.tensor([0, 0]), 4) == [(2, 0)] * 5
    # 3 + 1 + 2 = 6 tiles over 4 CTAs: 2, 2, 1, 1.
    assert expected_schedule(torch.tensor([130, 64, 0, 65]), 4) == [(0, 0), (0, 2), (3, 0), (3, 1), (4, 0)]
    assert expected_schedule(torch.tensor([[1, 70], [0, 0]]), 2) == [(0, 0), (0, 1), (2, 0)]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [LogitsConfig(64, 128, linear_on_mma=True), LogitsConfig(32, 64, linear_on_mma=True),
                                 LogitsConfig(16, 128), LogitsConfig(8, 64), PagedConfig(64, 128, 1, 64, 12),
                                 PagedConfig(64, 128, 4, 32, 12), PagedConfig(8, 128, 3, 128, 12),
                                 PagedConfig(64, 128, 2, 64, 12, 3, 2, True)],
                         ids=lambda c: registry.get("indexer_logits_sm90" if isinstance(c, LogitsConfig)
                                                    else "indexer_paged_sm90").kernel_name(c))
def test_sm90_kernels_compile_without_local_memory(cfg, cache_root, monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    family = registry.get("indexer_logits_sm90" if isinstance(cfg, LogitsConfig) else "indexer_paged_sm90")
    binary = build(family.source(cfg, SM90))
    report = binary.log.split(f"Function properties for {family.ENTRY}")[1].splitlines()[1]
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    assert "C7514" not in binary.log, "ptxas serialized the wgmma pipeline"
    if cfg == LogitsConfig(64, 128, linear_on_mma=True):   # 128 head columns + 8 of q' terms
        sass = sass_of(binary.cubin, tmp_path)
        assert "QGMMA.64x136x32.F32.E4M3.E4M3" in sass and "LDL" not in sass and "STL" not in sass
        assert "UTMALDG.2D" in sass


def test_sm80_configs_fit_each_arch():
    for name, limit in SM80_SMEM_LIMITS.items():
        arch = resolve_for_build(name).tuning
        for h in INDEXER_HEADS:
            for d in (64, 128):
                cfg = logits_sm80_config(h, d, arch)
                assert cfg.smem_bytes <= limit and cfg.fp8_mma == (name == "sm_89")
                assert (256 // h) % cfg.unit_rows == 0   # the op's row padding covers every unit
                for next_n in (1, 2, 3, 4):
                    paged = paged_sm80_config(h, d, next_n, 64, arch)
                    assert paged.smem_bytes <= limit and paged.num_threads <= 512


# The mma.sync kernels of each arch: the largest register users (H 64, next_n 4), both page splits.
_SM80_BUILDS = [("sm_89", "logits", (64, 128)), ("sm_89", "logits", (8, 64)), ("sm_80", "logits", (64, 128)),
                ("sm_86", "logits", (16, 128)), ("sm_89", "paged", (64, 128, 4, 32)),
                ("sm_89", "paged", (64, 64, 4, 64)), ("sm_80", "paged", (64, 128, 4, 64)),
                ("sm_80", "paged", (8, 128, 1, 128)), ("sm_86", "paged", (64, 128, 3, 64))]


@pytest.mark.slow
@pytest.mark.parametrize("arch,kind,shape", _SM80_BUILDS, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple)
                         else str(v))
def test_sm80_kernels_compile_without_local_memory(arch, kind, shape, cache_root, monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    pair = resolve_for_build(arch)
    family = registry.get(f"indexer_{kind}_sm80")
    cfg = (logits_sm80_config if kind == "logits" else paged_sm80_config)(*shape, pair.tuning)
    binary = build(family.source(cfg, pair))
    report = binary.log.split(f"Function properties for {family.ENTRY}")[1].splitlines()[1]
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    sass = sass_of(binary.cubin, tmp_path)
    assert "LDL" not in sass and "STL" not in sass
    assert ("QMMA.16832.F32.E4M3.E4M3" if cfg.fp8_mma else "HMMA.16816.F32") in sass, "the mma.sync instruction"
    assert "LDGSTS" in sass, "cp.async loads"


@pytest.mark.slow
def test_metadata_compiles_for_every_arch(cache_root):
    family = registry.get("indexer_metadata")
    for arch in ("sm_90a", "sm_80", "sm_89"):
        build(family.source(family.config_type(), resolve_for_build(arch)))


@pytest.fixture
def gpu_stub(monkeypatch):
    monkeypatch.setattr(validate, "on_gpu", lambda tensor: True)


def test_bad_arguments_raise_typed_errors(gpu_stub):
    q = torch.zeros(8, 64, 128, dtype=torch.float8_e4m3fn)
    k, k_scale = torch.zeros(32, 128, dtype=torch.float8_e4m3fn), torch.ones(32)
    w = torch.zeros(8, 64)
    ks = ke = torch.zeros(8, dtype=torch.int32)
    cases = [
        (dict(q=q.float()), "q: expected dtype"),
        (dict(q=torch.zeros(8, 48, 128, dtype=torch.float8_e4m3fn), w=torch.zeros(8, 48)), "q: expected heads"),
        (dict(q=torch.zeros(8, 64, 96, dtype=torch.float8_e4m3fn)), "q: expected head dim"),
        (dict(kv=(k[:, :64].contiguous(), k_scale)), "kv\\[0\\]: expected shape"),
        (dict(kv=(k, k_scale[:5])), "kv\\[1\\]: expected shape"),
        (dict(kv=(k,)), "kv: expected a tuple"),
        (dict(w=torch.zeros(8, 64)[:, ::2].repeat(1, 2).t().contiguous().t()), "weights"),
        (dict(ke=ke.long()), "cu_seq_len_k_end: expected dtype"),
        (dict(ks=ks[:4]), "cu_seq_len_k_start: expected shape"),
        (dict(max_seqlen_k=5), "clean_logits: expected False"),
        (dict(max_seqlen_k=-1, clean=False), "max_seqlen_k"),
        (dict(q=(q, torch.ones(1))), "q: expected a tensor, or \\(tensor, None\\)"),
    ]
    for change, message in cases:
        args = dict(q=q, kv=(k, k_scale), w=w, ks=ks, ke=ke, clean=True, max_seqlen_k=0)
        args.update(change)
        with pytest.raises(mla_jit.InvalidArgumentError, match=message):
            mla_jit.fp8_mqa_logits(args["q"], args["kv"], args["w"], args["ks"], args["ke"], args["clean"],
                                   args["max_seqlen_k"])
    pq = torch.zeros(2, 1, 64, 128, dtype=torch.float8_e4m3fn)
    cache = torch.zeros(4, 64, 1, 132, dtype=torch.uint8)
    lens = torch.zeros(2, dtype=torch.int32)
    table = torch.zeros(2, 3, dtype=torch.int32)
    sched = torch.zeros(5, 2, dtype=torch.int32)
    pw = torch.zeros(2, 64)
    cases = [
        (dict(q=torch.zeros(2, 5, 64, 128, dtype=torch.float8_e4m3fn), w=torch.zeros(10, 64)), "q: expected next_n"),
        (dict(cache=torch.zeros(4, 64, 1, 130, dtype=torch.uint8)), "kv_cache: expected shape"),
        (dict(cache=torch.zeros(4, 48, 1, 132, dtype=torch.uint8)), "kv_cache: expected shape"),
        (dict(cache=torch.zeros(4 * 8452 + 4, dtype=torch.uint8)[4:].as_strided((4, 64, 1, 132), (8452, 132, 132, 1))),
         "kv_cache: expected a page stride"),
        (dict(lens=torch.zeros(3, dtype=torch.int32)), "context_lens: expected shape"),
        (dict(table=torch.zeros(3, 3, dtype=torch.int32)), "block_table"),
        (dict(sched=torch.zeros(5, 3, dtype=torch.int32)), "schedule_meta"),
        (dict(max_len=-5), "max_context_len"),
        (dict(w=torch.zeros(2, 32)), "weights: expected shape"),
    ]
    for change, message in cases:
        args = dict(q=pq, cache=cache, w=pw, lens=lens, table=table, sched=sched, max_len=100)
        args.update(change)
        with pytest.raises(mla_jit.InvalidArgumentError, match=message):
            mla_jit.fp8_paged_mqa_logits(args["q"], args["cache"], args["w"], args["lens"], args["table"],
                                         args["sched"], args["max_len"])
    with pytest.raises(mla_jit.InvalidArgumentError, match="block_kv"):
        mla_jit.get_paged_mqa_logits_metadata(lens, 16, 132)
    with pytest.raises(mla_jit.InvalidArgumentError, match="num_sms"):
        mla_jit.get_paged_mqa_logits_metadata(lens, 64, 0)


def test_torch_ops_registered_with_fakes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(300, 64, 128, dtype=torch.float8_e4m3fn, device="cuda")
        k = torch.empty(1000, 128, dtype=torch.float8_e4m3fn, device="cuda")
        out = torch.ops.mla_jit.fp8_mqa_logits(q, k, torch.empty(1000, device="cuda"),
                                               torch.empty(300, 64, device="cuda"),
                                               torch.empty(300, dtype=torch.int32, device="cuda"),
                                               torch.empty(300, dtype=torch.int32, device="cuda"))
        assert out.shape == (300, 1000) and out.stride() == (1280, 1)
        pq = torch.empty(4, 2, 64, 128, dtype=torch.float8_e4m3fn, device="cuda")
        logits = torch.ops.mla_jit.fp8_paged_mqa_logits(
            pq, torch.empty(10, 64, 1, 132, dtype=torch.uint8, device="cuda"), torch.empty(8, 64, device="cuda"),
            torch.empty(4, dtype=torch.int32, device="cuda"), torch.empty(4, 3, dtype=torch.int32, device="cuda"),
            torch.empty(133, 2, dtype=torch.int32, device="cuda"), 1000)
        assert logits.shape == (8, 1000) and logits.stride() == (1024, 1)


def test_paged_warm_path_launch_values(gpu_stub, monkeypatch):
    """The paged op's warm path (runtimes/indexer_plan.PagedCall) with the kernel's launch recorded:
    the packed PagedParams of each call, the TMA descriptors built once per (q, weights, cache)
    pointers and reused, a misaligned pointer named, an empty batch cleaned without a launch."""
    from mla_jit.runtimes import indexer_plan as rt
    launches, built = [], []

    def fake_init(self, heads, head_dim, next_n, page, device_index):
        self.heads, self.head_dim, self.next_n, self.page, self.device_index = heads, head_dim, next_n, page, -1
        self.tma, self.cfg = True, None
        self.launch = lambda stream, params, *descs, grid: launches.append((PAGED_PARAMS.unpack(params), descs, grid))

    def fake_descriptors(self, q, weights, kv_cache):
        built.append((q.data_ptr(), weights.data_ptr(), kv_cache.data_ptr()))
        return tuple(object() for _ in range(4))

    monkeypatch.setattr(rt.PagedPlan, "__init__", fake_init)
    monkeypatch.setattr(rt.PagedPlan, "descriptors", fake_descriptors)
    monkeypatch.setattr(rt, "current_stream", lambda device_index: 7)
    rt.reset()
    q = torch.zeros(3, 2, 64, 128, dtype=torch.float8_e4m3fn)
    cache = torch.zeros(5, 64, 1, 132, dtype=torch.uint8)
    w = torch.zeros(6, 64)
    lens = torch.zeros(3, 2, dtype=torch.int32)
    table = torch.zeros(3, 4, dtype=torch.int32)
    sched = torch.zeros(9, 2, dtype=torch.int32)
    try:
        logits = mla_jit.fp8_paged_mqa_logits(q, cache, w, lens, table, sched, 300, clean_logits=True)
        assert logits.shape == (6, 300) and logits.stride(0) == 512
        params, descs, grid = launches[-1]
        assert params == (lens.data_ptr(), table.data_ptr(), sched.data_ptr(), logits.data_ptr(), 512, 4, 3, 2, 4, 1,
                          300, 1)
        assert grid == (8, 1, 1) and len(built) == 1
        mla_jit.fp8_paged_mqa_logits(q, cache, w, lens, table, sched, 70)
        same = lambda a, b: all(x is y for x, y in zip(a, b))  # noqa: E731
        assert same(launches[-1][1], descs) and len(built) == 1   # same pointers: the same descriptors
        assert launches[-1][0][4] == 256 and launches[-1][0][10:] == (70, 0)
        none = mla_jit.fp8_paged_mqa_logits(q, cache, w, lens, table, sched, 0)   # no column: stride 0, nothing written
        assert none.shape == (6, 0) and launches[-1][0][4] == 0 and launches[-1][0][10] == 0
        q2 = q.clone()
        mla_jit.fp8_paged_mqa_logits(q2, cache, w, lens, table, sched, 70)
        assert built[-1] == (q2.data_ptr(), w.data_ptr(), cache.data_ptr()) and not same(launches[-1][1], descs)
        odd = torch.zeros(q.numel() + 16, dtype=torch.uint8)[1:1 + q.numel()].view(torch.float8_e4m3fn).view(q.shape)
        with pytest.raises(mla_jit.InvalidArgumentError, match="q: expected a 16-byte aligned"):
            mla_jit.fp8_paged_mqa_logits(odd, cache, w, lens, table, sched, 70)
        count = len(launches)
        empty = mla_jit.fp8_paged_mqa_logits(q[:0], cache, w[:0], lens[:0], table[:0], sched, 70, clean_logits=True)
        assert empty.shape == (0, 70) and len(launches) == count
        no_pages = mla_jit.fp8_paged_mqa_logits(q, cache[:0], w, lens, table, sched, 70, clean_logits=True)
        assert torch.isneginf(no_pages).all() and len(launches) == count
    finally:
        rt.reset()

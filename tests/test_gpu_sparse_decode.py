"""The sparse (DSA) decode over FlashMLA's FP8 records on a Hopper GPU (the wgmma kernel; also the mma.sync one
with the Ampere/Ada tunings forced), against a float32 reference of the de-quantized records.

Bounds: the kernel's K and V are exactly the reference's (e4m3 x scale rounded once to bf16), so
only its own rounding counts: P rounded to bf16 before P V (2^-9 relative, summed in fp32; twice
that, as the dense FP8 tests allow) and out's bf16 rounding: |out - ref| <= 2^-8 max|v| + 2 ulps,
1 - cos < 1e-5, lse within 1.25e-4 relative."""
import pytest
import torch

import mla_jit
from mla_jit.configs.decode import metadata_config
from mla_jit.errors import FeatureNotAvailableError, InvalidArgumentError
from mla_jit.runtimes.decode_schedule import greedy_schedule

from .decode_inputs import case_seed
from .helpers import call_with_poisoned_outputs
from .sparse_inputs import SparseCase, assert_out_within, make_sparse_inputs, sparse_reference

pytestmark = pytest.mark.gpu


def _run(case: SparseCase, q, records, indices, topk_length, attn_sink, api: str = "lazy"):
    """One call (schedule included), its outputs starting as NaN (call_with_poisoned_outputs)."""
    def call():
        if api == "lazy":
            metadata, num_splits = mla_jit.get_mla_metadata()
        else:
            metadata, num_splits = mla_jit.get_mla_metadata(torch.zeros(case.b, dtype=torch.int32, device="cuda"),
                                                            case.s_q * case.h_q, 1, case.h_q, True, case.topk)
        return mla_jit.flash_mla_with_kvcache(q, records, None, None, 512, metadata, num_splits, is_fp8_kvcache=True,
                                              indices=indices, topk_length=topk_length, attn_sink=attn_sink)

    return call_with_poisoned_outputs(call)


def assert_sparse_close(out, lse, ref_out, ref_lse, v_max):
    out = out.float()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    inf_ref = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), inf_ref) and (lse[inf_ref] > 0).all(), "lse infinities differ"
    assert_out_within(out, ref_out, v_max[..., None, None])
    finite = ~inf_ref
    close = ((lse - ref_lse).abs() <= 1e-6) | ((lse - ref_lse).abs() <= 1.25e-4 * ref_lse.abs())
    assert close[finite].all(), f"lse max abs err {(lse - ref_lse)[finite].abs().max():.3g}"


def _check(case: SparseCase, api: str = "lazy"):
    q, records, deq, indices, topk_length, attn_sink = make_sparse_inputs(case, seed=case_seed(case))
    out, lse = _run(case, q, records, indices, topk_length, attn_sink, api)
    assert out.shape == (case.b, case.s_q, case.h_q, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (case.b, case.h_q, case.s_q)
    assert_sparse_close(out, lse, *sparse_reference(q, deq, indices, topk_length, attn_sink))


def _grid() -> list[SparseCase]:
    cases = []
    for n, h_q in enumerate((1, 8, 16, 32, 64, 128, 20)):
        cases.append(SparseCase([3, 8, 2, 5, 2, 1, 4][n], 1 + n % 4, h_q, [64, 2048, 128, 512, 256, 2048, 192][n],
                                topk_length=n % 2 == 1, sink=n % 3 == 0))
    cases += [SparseCase(2, 1, 16, 8192, s_k=32768, topk_length=True, sink=True),
              SparseCase(4, 2, 64, 64, page=16, invalid=0.5), SparseCase(3, 1, 16, 320, page=256),
              SparseCase(5, 2, 16, 128, topk_length=True, zero_lengths=True, sink=True),
              SparseCase(2, 1, 16, 256, invalid=1.0), SparseCase(2, 2, 64, 512, pow2_scales=False),
              SparseCase(64, 2, 128, 2048, s_k=8192), SparseCase(128, 1, 16, 2048, s_k=32768, sink=True),
              # empty rows, long topk, page 256
              SparseCase(5, 2, 64, 128, topk_length=True, zero_lengths=True, sink=True),
              SparseCase(2, 1, 100, 8192, s_k=32768, page=256, topk_length=True, sink=True),
              # Invalid indices of extreme values (-2, INT32_MIN, INT32_MAX, past the cache), also past topk_length.
              SparseCase(3, 2, 64, 512, invalid=0.4, topk_length=True, extreme=True),
              SparseCase(2, 1, 128, 256, page=16, invalid=0.6, extreme=True),
              # the narrow sm_90a kernel (<= 16 heads): 8-head groups (5, 8), a partial 16-head group
              # (12), float32 scales, long walks cut into many splits
              SparseCase(4, 2, 5, 320, page=16, invalid=0.4, topk_length=True, sink=True, extreme=True),
              SparseCase(6, 3, 8, 192, page=256, topk_length=True, zero_lengths=True),
              SparseCase(3, 1, 12, 512, invalid=0.5, pow2_scales=False, sink=True),
              SparseCase(96, 2, 8, 2048, s_k=32768, topk_length=True)]
    return cases


@pytest.mark.parametrize("case", _grid(), ids=str)
def test_sparse_decode_matches_reference(case):
    _check(case)


# 128 heads (and 100: a partial second tile) on sm_90a: two 64-head tiles walking the same tokens,
# with invalid indices and topk_length in both halves, small pages, empty rows, all-invalid rows.
# With MLA_JIT_SM90_CLUSTER=2 they run as a cluster pair sharing each tile's de-quantization: walks of
# 1, 2 and 3 tiles (the pipeline's prologue), 65 heads (one real head in the second tile), float32 scales.
_TWO_HEAD_TILES = [SparseCase(3, 2, 128, 512, page=16, invalid=0.5, topk_length=True, sink=True),
           SparseCase(4, 1, 100, 320, topk_length=True, zero_lengths=True),
           SparseCase(2, 1, 128, 256, invalid=1.0),
           SparseCase(3, 1, 65, 64, invalid=0.3), SparseCase(2, 2, 128, 128, page=16, topk_length=True),
           SparseCase(5, 1, 96, 192, pow2_scales=False, sink=True)]


@pytest.mark.parametrize("cluster", ["auto", "2"])   # 2: the pairs (configs/sparse.py head_tile_pairs)
@pytest.mark.parametrize("case", _TWO_HEAD_TILES, ids=str)
def test_sparse_decode_two_head_tiles(case, cluster, monkeypatch):
    monkeypatch.setenv("MLA_JIT_SM90_CLUSTER", cluster)
    _check(case)


@pytest.mark.parametrize("tuning", ["sm_80", "sm_89"])
@pytest.mark.parametrize("case", [SparseCase(3, 2, 16, 512, topk_length=True, sink=True),
                                  SparseCase(2, 1, 128, 2048), SparseCase(4, 1, 8, 64, page=16),
                                  SparseCase(2, 2, 16, 512, pow2_scales=False),
                                  # two 16-head groups a CTA: a partial second group (24), a CTA whose
                                  # second group is all padding (40), float32 scales at 64
                                  SparseCase(3, 1, 24, 512, invalid=0.5, topk_length=True, sink=True),
                                  SparseCase(3, 2, 40, 320, page=16, topk_length=True, zero_lengths=True),
                                  SparseCase(2, 1, 64, 1024, invalid=0.3, pow2_scales=False)], ids=str)
def test_sparse_decode_ampere_ada_tunings(tuning, case, monkeypatch):
    """The Ampere/Ada tunings (sm_89: 3 stages in 99 KB; above 16 heads two 16-head groups a CTA),
    forced on the Hopper GPU."""
    monkeypatch.setenv("MLA_JIT_ARCH", tuning)
    _check(case)


@pytest.mark.parametrize("b,s_q,h_q,topk", [(128, 1, 64, 2048), (128, 2, 128, 2048), (100, 1, 16, 8192),
                                             (3, 2, 32, 256), (700, 3, 8, 64)])
def test_host_schedule_matches_the_metadata_kernel(b, s_q, h_q, topk):
    """runtimes/decode_schedule.greedy_schedule, from which the sparse plan decides whether to launch the
    combine, against the metadata kernel's schedule: the sparse form (every row topk keys) and the dense
    decode's over random lengths with empty ones."""
    gen = torch.Generator(device="cuda").manual_seed(b + topk)
    lens = torch.randint(0, 5000, (b,), dtype=torch.int32, device="cuda", generator=gen)
    lens[::4] = 0
    cfg = metadata_config()
    for metadata, num_splits, lengths in (
            (*mla_jit.get_mla_metadata(lens, s_q * h_q, 1, h_q, True, topk), [topk] * (b * s_q)),
            (*mla_jit.get_mla_metadata(lens, s_q * h_q, 1), lens.tolist())):
        meta, splits = greedy_schedule(lengths, metadata.shape[0], cfg.block_n, cfg.fixed_overhead_blocks)
        assert metadata.tolist() == meta and num_splits.tolist() == splits


def test_sparse_decode_schedule_tensors():
    """get_mla_metadata(cache_seqlens, s_q * h_q, 1, h_q, True, topk): FlashMLA's tensor schedule."""
    _check(SparseCase(3, 2, 32, 256, topk_length=True, sink=True), api="tensors")


@pytest.mark.parametrize("h_q,cluster", [(16, "auto"), (64, "auto"), (128, "auto"), (128, "2")])
def test_sparse_decode_graph_replay_with_new_indices(h_q, cluster, monkeypatch):
    monkeypatch.setenv("MLA_JIT_SM90_CLUSTER", cluster)   # 2: 128 heads as cluster pairs
    case = SparseCase(4, 2, h_q, 256, topk_length=True, sink=True)
    q, records, deq, indices, topk_length, attn_sink = make_sparse_inputs(case, seed=5)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    _run(case, q, records, indices, topk_length, attn_sink)  # warm: kernels built, plans made
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        metadata, _ = mla_jit.get_mla_metadata()
        out, lse = mla_jit.flash_mla_with_kvcache(q, records, None, None, 512, metadata, None, is_fp8_kvcache=True,
                                                  indices=indices, topk_length=topk_length, attn_sink=attn_sink)
    for seed in (6, 7):
        q2, records2, deq2, indices2, topk_length2, sink2 = make_sparse_inputs(case, seed=seed)
        for dst, src in ((q, q2), (records, records2), (indices, indices2), (topk_length, topk_length2),
                         (attn_sink, sink2)):
            dst.copy_(src)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_sparse_close(out, lse, *sparse_reference(q2, deq2, indices2, topk_length2, sink2))


@pytest.mark.parametrize("h_q", [16, 64])
def test_sparse_decode_under_torch_compile(h_q):
    case = SparseCase(2, 1, h_q, 128, sink=True)
    q, records, deq, indices, topk_length, attn_sink = make_sparse_inputs(case, seed=11)

    @torch.compile(fullgraph=True)
    def step(q, records, indices, attn_sink):
        metadata, num_splits = mla_jit.get_mla_metadata()
        return mla_jit.flash_mla_with_kvcache(q, records, None, None, 512, metadata, num_splits,
                                              is_fp8_kvcache=True, indices=indices, attn_sink=attn_sink)

    out, lse = step(q, records, indices, attn_sink)
    assert_sparse_close(out, lse, *sparse_reference(q, deq, indices, None, attn_sink))


def test_sparse_decode_bad_arguments_raise_typed_errors():
    case = SparseCase(2, 1, 16, 128)
    q, records, _, indices, _, _ = make_sparse_inputs(case, seed=3)

    def call(**kw):
        args = dict(q=q, k_cache=records, block_table=None, cache_seqlens=None, head_dim_v=512,
                    tile_scheduler_metadata=mla_jit.get_mla_metadata()[0], is_fp8_kvcache=True, indices=indices)
        args.update(kw)
        return mla_jit.flash_mla_with_kvcache(**args)

    for kw, name in ((dict(q=q.float()), "q"), (dict(k_cache=records[..., :640]), "k_cache"),
                     (dict(indices=indices.long()), "indices"), (dict(indices=indices[:1]), "indices"),
                     (dict(head_dim_v=256), "head_dim_v"), (dict(causal=True), "causal"),
                     (dict(topk_length=torch.ones(3, dtype=torch.int32, device="cuda")), "topk_length"),
                     (dict(attn_sink=torch.zeros(8, device="cuda")), "attn_sink"),
                     (dict(q=q.expand(2, 1, 16, 576)[:, :, :, :512]), "q")):
        with pytest.raises(InvalidArgumentError) as err:
            call(**kw)
        assert name in str(err.value), (name, str(err.value))
    with pytest.raises(FeatureNotAvailableError):
        call(is_fp8_kvcache=False)
    with pytest.raises(FeatureNotAvailableError):
        call(extra_k_cache=records)

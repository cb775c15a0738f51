"""flash_attn_varlen_func on a Hopper GPU against the float32 reference: fixed and variable lengths
(0 and 1 token included), chunked context (more keys than queries), causal bottom-right, every head
count, GQA, fp16 and bf16, v as a strided view, out=, NaN past the sequences, CUDA graphs, and the
merge of a chunked context against one call over all keys."""
import math

import pytest
import torch

import mla_jit

from .prefill_reference import prefill_reference

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["sm_90a", "sm_80", "sm_89"])
def family(request, monkeypatch):
    """The Hopper kernel, and the Ampere/Ada (mma.sync) family forced on this GPU through MLA_JIT_ARCH
    (its sm_80 tuning: 163 KB of shared memory, Q in its own area; sm_89: 99 KB, Q through the stages)."""
    if request.param != "sm_90a":
        monkeypatch.setenv("MLA_JIT_ARCH", request.param)
    return request.param

# Max abs error of out against the float32 reference (outputs are averages of N(0, 1) values, |o| < ~1).
_OUT_TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
_LSE_TOL = 2e-3


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _inputs(lens_q, lens_k, h, h_k, d, dv, dtype, seed, v_view=False, tail=0):
    """q, k, v with `tail` extra NaN rows past the last sequence (nothing may read them into a result);
    v_view: v is the second half of a (total_k, h_k, 2 dv) buffer, as engines split kv."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total_q, total_k = sum(lens_q), sum(lens_k)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    q = rand(total_q + tail, h, d)
    k = rand(total_k + tail, h_k, d)
    if v_view:
        v = rand(total_k + tail, h_k, 2 * dv)[..., dv:]
    else:
        v = rand(total_k + tail, h_k, dv)
    if tail:
        for t in (q, k, v):
            t[-tail:] = float("nan")
    return q, k, v


def _check(out, lse, q, k, v, cu_q, cu_k, scale, causal, total_q):
    ref_out, ref_lse = prefill_reference(q[:total_q], k, v, cu_q, cu_k, scale, causal)
    got = out[:total_q].float()
    assert not torch.isnan(got).any(), "NaN in out"
    err = (got - ref_out).abs().max().item() if got.numel() else 0.0
    assert err <= _OUT_TOL[q.dtype], f"out max abs err {err}"
    if lse is not None:
        got_lse = lse[:, :total_q]
        inf_ref = torch.isinf(ref_lse)
        assert torch.equal(torch.isinf(got_lse), inf_ref), "rows without keys: lse +inf exactly there"
        assert (got_lse[inf_ref] > 0).all()
        if (~inf_ref).any():
            lerr = (got_lse[~inf_ref] - ref_lse[~inf_ref]).abs().max().item()
            assert lerr <= _LSE_TOL * max(1.0, ref_lse[~inf_ref].abs().max().item()), f"lse max abs err {lerr}"


def _run(lens_q, lens_k, h=16, h_k=None, d=192, dv=128, dtype=torch.bfloat16, causal=True, seed=0, v_view=False,
         tail=0, use_out=False, scale=None):
    h_k = h_k or h
    q, k, v = _inputs(lens_q, lens_k, h, h_k, d, dv, dtype, seed, v_view, tail)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    total_q = sum(lens_q)
    kwargs = {}
    out_buf = None
    if use_out:
        out_buf = torch.full((q.shape[0], h, dv), float("nan"), dtype=dtype, device="cuda")
        kwargs["out"] = out_buf
    out, lse = mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q, default=0), max(lens_k, default=0),
                                              softmax_scale=scale, causal=causal, return_softmax_lse=True, **kwargs)
    if use_out:
        assert out is out_buf
    assert out.shape == (q.shape[0], h, dv) and lse.shape == (h, q.shape[0]) and lse.dtype == torch.float32
    _check(out, lse, q, k, v, cu_q, cu_k, scale if scale is not None else d ** -0.5, causal, total_q)
    return out, lse


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lens", [[300, 300], [128], [1], [0, 1, 129, 0, 513, 64], [2048], [127, 255, 1000]])
def test_self_attention_lengths(lens, causal, dtype, family):
    _run(lens, lens, causal=causal, dtype=dtype, seed=len(lens))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lens_q,lens_k", [([100, 300], [1000, 1000]), ([2048], [16384]), ([1, 5], [4097, 63]),
                                           ([300, 64], [100, 10]), ([200], [0]), ([0, 7], [50, 0])])
def test_more_or_fewer_keys(lens_q, lens_k, causal, family):
    """Chunked context (keys > queries, causal bottom-right) and keys < queries (causal rows that see
    no key: out 0, lse +inf)."""
    _run(lens_q, lens_k, causal=causal, seed=3)


@pytest.mark.parametrize("h,h_k", [(1, 1), (16, 16), (32, 32), (64, 64), (128, 128), (16, 4), (128, 1), (3, 3)])
def test_head_counts(h, h_k, family):
    _run([257, 31], [257, 31], h=h, h_k=h_k, causal=True, seed=h)


@pytest.mark.parametrize("d,dv", [(128, 128), (64, 64)])
@pytest.mark.parametrize("causal", [True, False])
def test_standard_head_dims(d, dv, causal, family):
    _run([333, 1024, 5], [333, 1024, 5], d=d, dv=dv, causal=causal, seed=d)


def test_strided_v_out_and_nan_tails(family):
    """v a split view (token stride h * 256), out= poisoned with NaN, NaN rows past cu_seqlens[-1]
    in q, k and v: none may reach a result."""
    out, _ = _run([129, 70], [1000, 333], v_view=True, tail=37, use_out=True, causal=True, seed=5)
    assert torch.isnan(out[-37:].float()).all(), "rows past cu_seqlens_q[-1] are not written"


def test_softmax_scale_and_no_lse():
    lens = [200, 77]
    q, k, v = _inputs(lens, lens, 8, 8, 192, 128, torch.bfloat16, 11)
    cu = _cu(lens)
    out = mla_jit.flash_attn_varlen_func(q, k, v, cu, cu, 200, 200, softmax_scale=0.05, causal=True)
    assert isinstance(out, torch.Tensor)
    _check(out, None, q, k, v, cu, cu, 0.05, True, sum(lens))


def test_varlen_batch_of_64(family):
    gen = torch.Generator().manual_seed(7)
    lens = torch.randint(1, 4097, (64,), generator=gen).tolist()
    _run(lens, lens, h=16, causal=True, seed=7)


def test_chunked_context_merge_matches_one_call():
    """New tokens (causal) plus two context chunks (non-causal, lse) merged with merge_attn_states
    equal one causal call over context + new keys."""
    h, new, ctx = 16, [300, 64], [[1000, 0], [500, 2048]]
    q, kn, vn = _inputs(new, new, h, h, 192, 128, torch.bfloat16, 21)
    cu_new = _cu(new)
    acc, acc_lse = mla_jit.flash_attn_varlen_func(q, kn, vn, cu_new, cu_new, max(new), max(new), causal=True,
                                                  return_softmax_lse=True)
    chunks = []
    for i, lens in enumerate(ctx):
        _, kc, vc = _inputs(new, lens, h, h, 192, 128, torch.bfloat16, 30 + i)
        chunks.append((lens, kc, vc))
        o, l = mla_jit.flash_attn_varlen_func(q, kc, vc, cu_new, _cu(lens), max(new), max(lens), causal=False,
                                              return_softmax_lse=True)
        merged, merged_lse = torch.empty_like(acc), torch.empty_like(acc_lse)
        mla_jit.merge_attn_states(merged, o, l, acc, acc_lse, merged_lse)
        acc, acc_lse = merged, merged_lse
    # One call: per sequence, keys = chunk 0, chunk 1, then the new tokens (causal bottom-right).
    ks, vs, lens_all = [], [], []
    for b in range(len(new)):
        parts_k, parts_v = [], []
        for i, (lens, kc, vc) in enumerate(chunks):
            s = sum(lens[:b])
            parts_k.append(kc[s:s + lens[b]])
            parts_v.append(vc[s:s + lens[b]])
        s = sum(new[:b])
        parts_k.append(kn[s:s + new[b]])
        parts_v.append(vn[s:s + new[b]])
        ks.append(torch.cat(parts_k))
        vs.append(torch.cat(parts_v))
        lens_all.append(ks[-1].shape[0])
    k_all, v_all = torch.cat(ks), torch.cat(vs)
    ref, ref_lse = prefill_reference(q, k_all, v_all, cu_new, _cu(lens_all), 192 ** -0.5, True)
    assert (acc.float() - ref).abs().max().item() <= 3e-2
    assert (acc_lse - ref_lse).abs().max().item() <= 5e-3


def test_cuda_graph_replay(family):
    lens = [500, 3, 1200]
    q, k, v = _inputs(lens, lens, 16, 16, 192, 128, torch.bfloat16, 9)
    cu = _cu(lens)
    out = torch.empty(q.shape[0], 16, 128, dtype=q.dtype, device="cuda")
    mla_jit.flash_attn_varlen_func(q, k, v, cu, cu, 1200, 1200, causal=True, out=out)   # warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = mla_jit.flash_attn_varlen_func(q, k, v, cu, cu, 1200, 1200, causal=True, out=out,
                                                return_softmax_lse=True)
    # New values, then new sequence boundaries over the same tokens within the captured max_seqlen (an
    # engine's next step: the captured kernels read cu_seqlens on the GPU), one of them empty.
    for seed, new_lens in ((1, lens), (2, [1, 1200, 502]), (3, [1200, 0, 503])):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda"))
        cu.copy_(_cu(new_lens))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, lse, q, k, v, cu, cu, 192 ** -0.5, True, sum(lens))


def test_torch_compile_fullgraph():
    lens = [100, 260]
    q, k, v = _inputs(lens, lens, 16, 16, 192, 128, torch.bfloat16, 13)
    cu = _cu(lens)

    def step(q, k, v):
        out, lse = mla_jit.flash_attn_varlen_func(q * 1.0, k, v, cu, cu, 260, 260, causal=True,
                                                  return_softmax_lse=True)
        return out.float().sum(-1), lse

    eager = step(q, k, v)
    compiled = torch.compile(step, fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled[0], eager[0], atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(compiled[1], eager[1])


def test_bad_inputs_on_gpu():
    lens = [64]
    q, k, v = _inputs(lens, lens, 4, 4, 192, 128, torch.bfloat16, 1)
    cu = _cu(lens)
    with pytest.raises(mla_jit.InvalidArgumentError, match="k"):
        mla_jit.flash_attn_varlen_func(q, k[:, :3], v[:, :3], cu, cu, 64, 64)
    with pytest.raises(mla_jit.InvalidArgumentError, match="cu_seqlens_q"):
        mla_jit.flash_attn_varlen_func(q, k, v, cu.long(), cu, 64, 64)
    with pytest.raises(mla_jit.InvalidArgumentError, match="out"):
        mla_jit.flash_attn_varlen_func(q, k, v, cu, cu, 64, 64, out=torch.empty(64, 4, 192, dtype=q.dtype,
                                                                                device="cuda"))
    with pytest.raises(mla_jit.InvalidArgumentError, match="out"):
        mla_jit.flash_attn_varlen_func(q, k, v, cu, cu, 64, 64, out=q[..., :128])
    with pytest.raises(mla_jit.FeatureNotAvailableError, match="window_size"):
        mla_jit.flash_attn_varlen_func(q, k, v, cu, cu, 64, 64, window_size=(128, 0))
    buf = torch.randn(q.numel() + 8, device="cuda").to(q.dtype)
    misaligned = buf[1:1 + q.numel()].view(q.shape)   # 2 bytes past a 16-byte boundary
    with pytest.raises(mla_jit.InvalidArgumentError, match="q"):
        mla_jit.flash_attn_varlen_func(misaligned, k, v, cu, cu, 64, 64)

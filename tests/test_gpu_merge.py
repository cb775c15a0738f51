"""merge_attn_states on a Hopper GPU (and the kernel built for the Ampere/Ada tunings) against the
float32 reference: empty states, strided views, every dtype and head dim, CUDA graphs."""
import math

import pytest
import torch

import mla_jit

from .merge_reference import merge_reference

pytestmark = pytest.mark.gpu

_TOL = {torch.bfloat16: (1e-3, 1 / 128), torch.float16: (1e-4, 1 / 1024), torch.float32: (1e-5, 1e-5)}


def _states(num_tokens, num_heads, head_dim, dtype, seed, empty_fraction=0.1, wide=False):
    """prefix, prefix_lse, suffix, suffix_lse on the GPU. Empty states (lse +inf or -inf) get NaN
    values, which must not reach the output. `wide`: outputs are views into wider buffers (token
    stride 2 * h * d, as engines slice them) and lse views with a token stride of 2."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def values():
        full = torch.randn(num_tokens, num_heads, 2 * head_dim if wide else head_dim, generator=gen)
        return full[..., :head_dim]

    def lse():
        full = torch.randn(num_heads, 2 * num_tokens if wide else num_tokens, generator=gen) * 4
        return full[:, ::2] if wide else full

    prefix, suffix, plse, slse = values(), values(), lse(), lse()
    for v, l in ((prefix, plse), (suffix, slse)):
        empty = torch.rand(l.shape, generator=gen) < empty_fraction
        sign = torch.where(torch.rand(l.shape, generator=gen) < 0.5, math.inf, -math.inf)
        l[empty] = sign[empty]
        v[empty.T] = float("nan")
    # Some rows where both states are empty.
    plse[:, ::7] = math.inf
    slse[:, ::7] = -math.inf
    prefix[::7] = suffix[::7] = float("nan")
    to = lambda t: t.to(dtype).cuda() if t.dim() == 3 else t.cuda()  # noqa: E731
    if wide:  # keep the strided views: build them on the GPU from wide buffers
        return tuple(_wide_view(t, dtype) for t in (prefix, plse, suffix, slse))
    return to(prefix), to(plse), to(suffix), to(slse)


def _wide_view(t, dtype):
    if t.dim() == 3:
        buf = torch.full((*t.shape[:2], 2 * t.shape[2]), float("nan"), dtype=dtype, device="cuda")
        buf[..., :t.shape[2]] = t.to(dtype)
        return buf[..., :t.shape[2]]
    buf = torch.full((t.shape[0], 2 * t.shape[1]), float("nan"), device="cuda")
    buf[:, ::2] = t
    return buf[:, ::2]


def _check(out, out_lse, prefix, plse, suffix, slse):
    ref_out, ref_lse = merge_reference(prefix, plse, suffix, slse)
    atol, rtol = _TOL[out.dtype]
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), ref_out, atol=atol, rtol=rtol)
    if out_lse is not None:
        assert torch.equal(out_lse == -math.inf, ref_lse == -math.inf) and not torch.isnan(out_lse).any()
        assert not (out_lse == math.inf).any()   # both empty: -inf, as vLLM's
        finite = torch.isfinite(ref_lse)
        torch.testing.assert_close(out_lse[finite], ref_lse[finite], atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 512])
@pytest.mark.parametrize("shape", [(1, 1), (3, 16), (1000, 128), (4097, 5)])
@pytest.mark.parametrize("with_lse", [True, False])
def test_merge_matches_reference(dtype, head_dim, shape, with_lse):
    num_tokens, num_heads = shape
    prefix, plse, suffix, slse = _states(num_tokens, num_heads, head_dim, dtype, seed=num_tokens + head_dim)
    out = torch.full_like(prefix, float("nan"))
    out_lse = torch.full_like(plse, float("nan")) if with_lse else None
    mla_jit.merge_attn_states(out, prefix, plse, suffix, slse, out_lse)
    torch.cuda.synchronize()
    _check(out, out_lse, prefix, plse, suffix, slse)


@pytest.mark.parametrize("arch", ["", "sm_80", "sm_89"])
def test_strided_views_and_forced_tunings(arch, monkeypatch):
    """Outputs sliced from wider buffers and lse views with a token stride of 2 (FlashAttention's
    lse of a larger batch); also the kernel as the Ampere/Ada tunings build it."""
    monkeypatch.setenv("MLA_JIT_ARCH", arch)
    prefix, plse, suffix, slse = _states(777, 32, 128, torch.bfloat16, seed=5, wide=True)
    assert prefix.stride(0) == 2 * 32 * 128 and plse.stride(1) == 2
    out = _wide_view(torch.zeros(777, 32, 128), torch.bfloat16)
    out_lse = _wide_view(torch.zeros(32, 777), torch.float32)
    mla_jit.merge_attn_states(out, prefix, plse, suffix, slse, out_lse)
    torch.cuda.synchronize()
    _check(out, out_lse, prefix, plse, suffix, slse)
    # The other halves of the wide buffers are untouched (still the NaN they were filled with).
    assert torch.isnan(out.as_strided((777, 32, 128), out.stride(), out.storage_offset() + 128)).all()


def test_empty_token_count_and_bad_inputs():
    prefix, plse, suffix, slse = _states(0, 8, 128, torch.float16, seed=1)
    mla_jit.merge_attn_states(torch.empty_like(prefix), prefix, plse, suffix, slse)
    prefix, plse, suffix, slse = _states(10, 8, 128, torch.float16, seed=2)
    out = torch.empty_like(prefix)
    with pytest.raises(mla_jit.InvalidArgumentError, match="suffix_output"):
        mla_jit.merge_attn_states(out, prefix, plse, suffix.float(), slse)
    with pytest.raises(mla_jit.InvalidArgumentError, match="prefix_lse"):
        mla_jit.merge_attn_states(out, prefix, plse.T.contiguous(), suffix, slse)
    with pytest.raises(mla_jit.InvalidArgumentError, match="prefix_output"):
        mla_jit.merge_attn_states(prefix, prefix, plse, suffix, slse)   # output aliases an input


def test_cuda_graph_replays_with_new_states():
    prefix, plse, suffix, slse = _states(300, 16, 512, torch.bfloat16, seed=9)
    out, out_lse = torch.empty_like(prefix), torch.empty_like(plse)
    mla_jit.merge_attn_states(out, prefix, plse, suffix, slse, out_lse)  # warm
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=stream):
        mla_jit.merge_attn_states(out, prefix, plse, suffix, slse, out_lse)
    for seed in (10, 11):
        new = _states(300, 16, 512, torch.bfloat16, seed=seed)
        for dst, src in zip((prefix, plse, suffix, slse), new):
            dst.copy_(src)
        out.fill_(float("nan"))
        out_lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, out_lse, prefix, plse, suffix, slse)


def test_torch_compile_and_opcheck():
    prefix, plse, suffix, slse = _states(64, 8, 128, torch.float16, seed=3, empty_fraction=0.0)

    def step(a, la, b, lb):
        out, out_lse = torch.empty_like(a), torch.empty_like(la)
        mla_jit.merge_attn_states(out, a * 1, la, b, lb, out_lse)
        return out, out_lse

    eager = step(prefix, plse, suffix, slse)
    compiled = torch.compile(step, fullgraph=True)(prefix, plse, suffix, slse)
    torch.cuda.synchronize()
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    torch.library.opcheck(torch.ops.mla_jit.merge_attn_states.default,
                          (torch.empty_like(prefix), prefix, plse, suffix, slse, torch.empty_like(plse)))

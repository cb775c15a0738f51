"""The decode ops as engines call them on a Hopper GPU: torch.compile over a decode step, the torch
custom ops' schemas and fake implementations (opcheck), and CUDA graphs of FlashMLA's lazy schedule
API with padded batches."""
import pytest
import torch

import mla_jit

from .decode_inputs import DecodeCase, case_seed, make_inputs
from .decode_reference import mla_decode_reference
from .test_gpu_decode import assert_decode_close

pytestmark = pytest.mark.gpu

_LAYERS = 3


def _decode_step(x, w_q, k_caches, block_table, lens, lazy: bool):
    """A model's decode step: q from a projection, attention in every layer over its own cache,
    the schedule computed once and reused: by get_mla_metadata(...) (FlashMLA's long-standing API)
    or, `lazy`, by the first layer's call filling get_mla_metadata()'s empty FlashMLASchedMeta."""
    b, s_q, h_q = x.shape[0], x.shape[1], w_q.shape[1] // 576
    meta, splits = mla_jit.get_mla_metadata() if lazy else mla_jit.get_mla_metadata(lens, s_q * h_q, 1)
    outs, lses = [], []
    for k_cache in k_caches:
        q = (x @ w_q).view(b, s_q, h_q, 576)
        out, lse = mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits, causal=True)
        outs.append(out)
        lses.append(lse)
        x = x + out.float().mean(dim=(2, 3), keepdim=True).squeeze(-1).to(x.dtype)
    return torch.stack(outs), torch.stack(lses)


def _step_tensors(*args):
    return _decode_step(*args, lazy=False)


def _step_lazy(*args):
    return _decode_step(*args, lazy=True)


def _step_inputs(b=6, s_q=2, h_q=64, s_k=3000, seed=3):
    case = DecodeCase(b, s_q, s_k, h_q, 1, True, True)
    _, k_cache, block_table, lens = make_inputs(case, seed=seed, poison=False)  # caches rolled below
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(b, s_q, 256, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
    w_q = (torch.randn(256, h_q * 576, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    k_caches = [k_cache] + [k_cache.roll(shifts=7 * i, dims=0).contiguous() for i in range(1, _LAYERS)]
    return x, w_q, k_caches, block_table, lens


@pytest.mark.parametrize("step", [_step_tensors, _step_lazy], ids=["tensors", "lazy"])
def test_torch_compile_fullgraph_matches_eager(step):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    inputs = _step_inputs()
    eager_out, eager_lse = step(*inputs)
    compiled = torch.compile(step, fullgraph=True)
    out, lse = compiled(*inputs)
    torch.cuda.synchronize()
    assert dict(counters["graph_break"]) == {}
    # The projection may be fused differently by inductor: compare within bf16 rounding; the
    # attention of the first layer sees the same q and must agree closely.
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse[torch.isfinite(eager_lse)]).all()
    torch.testing.assert_close(out.float(), eager_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, eager_lse, atol=1e-2, rtol=1e-3)
    # New lengths, same shapes: the compiled step recomputes the schedule (no recompilation).
    lens = inputs[-1]
    lens.copy_(torch.clamp(lens // 2, min=2))
    out2, _ = compiled(*inputs)
    ref2, _ = step(*inputs)
    torch.testing.assert_close(out2.float(), ref2.float(), atol=2e-2, rtol=2e-2)


def test_torch_compile_without_fullgraph_makes_one_graph():
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    inputs = _step_inputs(b=2, h_q=16)
    torch.compile(_step_lazy)(*inputs)
    torch.cuda.synchronize()
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1


def test_opcheck_schemas_and_fake_implementations():
    case = DecodeCase(3, 2, 700, 32, 1, True, True)
    q, k_cache, block_table, lens = make_inputs(case, seed=case_seed(case))
    torch.library.opcheck(torch.ops.mla_jit.get_mla_metadata.default, (lens, case.s_q * case.h_q, 1))
    meta, splits = mla_jit.get_mla_metadata(lens, case.s_q * case.h_q, 1)
    torch.library.opcheck(torch.ops.mla_jit.flash_mla_with_kvcache.default,
                          (q, k_cache, block_table, lens, 512, meta, splits), {"softmax_scale": None, "causal": True})


def test_torch_ops_call_gives_the_python_api_result():
    case = DecodeCase(4, 1, 900, 16, 1, True, False)
    q, k_cache, block_table, lens = make_inputs(case, seed=case_seed(case))
    meta, splits = torch.ops.mla_jit.get_mla_metadata(lens, 16, 1)
    out, lse = torch.ops.mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits, 0.05)
    ref_out, ref_lse = mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits,
                                                      softmax_scale=0.05)
    torch.cuda.synchronize()
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("schedule", ["auto", "ws"])
def test_lazy_schedule_graph_replays_with_new_lengths_and_padded_rows(schedule, monkeypatch):
    """An engine's full CUDA graph: captured once at a padded batch size (rows past the live batch
    have length 0), with get_mla_metadata() and two layers inside; replayed with new lengths, new q
    and another number of live rows."""
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", schedule)
    graph_batch = 8
    case = DecodeCase(graph_batch, 2, 2000, 64, 1, True, True)
    q, k_cache, block_table, lens = make_inputs(case, seed=11, poison=False)  # lengths grow on replay
    k_cache2 = k_cache.roll(shifts=5, dims=0).contiguous()
    lens[5:] = 0  # padded rows
    static_q = q.clone()

    def step():
        sched, _ = mla_jit.get_mla_metadata()
        out1, lse1 = mla_jit.flash_mla_with_kvcache(static_q, k_cache, block_table, lens, 512, sched, None,
                                                    causal=True)
        out2, lse2 = mla_jit.flash_mla_with_kvcache(static_q, k_cache2, block_table, lens, 512, sched, None,
                                                    causal=True)
        return out1, lse1, out2, lse2

    step()  # warm every kernel outside the capture
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outputs = step()
    gen = torch.Generator(device="cpu").manual_seed(12)
    max_len = block_table.shape[1] * case.page
    for live in (5, 8, 3):
        new_lens = torch.randint(2, max_len + 1, (graph_batch,), generator=gen, dtype=torch.int32)
        new_lens[live:] = 0
        lens.copy_(new_lens)
        static_q.copy_((torch.randn(q.shape, generator=gen) * 0.1).clamp(-1, 1).to(q.dtype))
        for t in outputs:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for out, lse, cache in ((outputs[0], outputs[1], k_cache), (outputs[2], outputs[3], k_cache2)):
            ref_out, ref_lse = mla_decode_reference(static_q, cache, block_table, lens, 512, causal=True)
            assert_decode_close(out, lse, ref_out, ref_lse)
        assert torch.equal(outputs[0][live:], torch.zeros_like(outputs[0][live:]))
        assert torch.isinf(outputs[1][live:]).all()

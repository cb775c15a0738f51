"""FP8 (e4m3 q and cache, per-tensor descales, bf16 out) dense paged MLA decode on a Hopper GPU
against a float32 torch reference of the de-quantized inputs."""
import pytest
import torch

import mla_jit

from .decode_inputs import DecodeCase, case_seed, env_grid_ids, make_fp8_inputs, set_env
from .decode_reference import fp8_p_error_terms, mla_decode_reference
from .closeness import assert_cosine_close
from .test_gpu_decode import _capture_replays_eager, _run

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn



# ---- FP8: e4m3 q and cache with per-tensor descales, bf16 out --------------------------------------
# Bounds against the float32 reference computed from the de-quantized inputs (q8 * descale_q,
# k8 * descale_k), so only the kernel's own rounding counts. The kernel computes S = q8 . k8 on FP8
# tensor cores (Hopper's FP8 wgmma accumulates with reduced precision, ~2^-13 relative per partial
# sum: with these inputs, logits of std ~1, sum_i |q_i k_i| * scale ~ 15, an error of ~2e-3 in a logit) and P V with P
# rounded to e4m3, a relative error of at most 2^-4 per element (P >= 0). P below 2^-6 of the running
# max is subnormal in e4m3, an absolute error of at most 2^-10 each: within the bound below while such
# keys number fewer than 64 times the row's sum of P, as on these inputs (the simulation includes them).
# - out, elementwise: |sum_j (P8_j - P_j) v_jc| / sum_j P_j <= 2^-4 sum_j p_j |v_jc| (p the softmax
#   weights; e4m3's relative rounding of a normal P_j is at most 2^-4) plus 2^-10 per subnormal P_j
#   (below 2^-6) times its |v_jc| / sum_j P_j (decode_reference.fp8_p_error_terms bounds which keys
#   those are), plus S's error (~2e-3 in a logit: 2^-7 sum_j p_j |v_jc| covers it twice over) and 2
#   bf16 ulps of the reference (out's rounding and the fp32 combine). The denominator is summed from
#   the fp32 P (as FlashAttention-style kernels do); summed from the rounded P the worst case doubles.
#   (Until session 34 the bound was 2^-4 max_j |v_jc|, ~5x looser at 4096 keys.)
# - out, cosine difference over the whole output (assert_decode_close's form): P's rounding errors
#   (~2.7% RMS relative for e4m3's 3 mantissa bits) give 1 - cos ~ 2.7%^2 / 2 ~ 3.5e-4 for random
#   signs. A float32 simulation of this grid's calls (torch's round-to-nearest e4m3 of P, P relative
#   to the row max, fp32 sum, bf16 out; S exact) gives 1.4e-6 (one key) and 6e-5 to 3.2e-4 (the
#   rest); it meets the elementwise bound at <= 0.29 of it. (Near-uniform attention, logits of std
#   0.1, reaches 1e-3 at 4096 keys and 2e-3 at 16384: P's rounding then correlates with v, part of k.)
#   FlashMLA's bf16 bound, 5e-6, and vLLM's FP8 one, 1e-4, are below what e4m3's P allows here.
# - lse: S's error (~1e-4) plus fp32 exp / log; FP8 rounding of P does not enter (the sum is fp32).
# - Rows that see no key: out exactly 0, lse exactly +inf.
# Measured on an H100 (2026-11-26, the kernel side still in progress) over this grid: 1 - cos <= 2.6e-4,
# out at <= 0.37 of its elementwise bound, lse <= 4.2e-4 relative.
FP8_OUT_REL = 2.0 ** -4 + 2.0 ** -7   # of sum_j p_j |v_jc * descale_k| over the visible keys
FP8_SUBNORMAL_ABS = 2.0 ** -10         # of each subnormal P_j (decode_reference.fp8_p_error_terms)
FP8_OUT_ULPS = 2              # bf16 ulps of the reference, on top
FP8_COS_DIFF = 1e-3           # 1 - cos over the whole output (the simulation's worst, 3.2e-4, times ~3)
# 1 - cos of one row: P's e4m3 errors average over fewer keys; at most 2^-4 relative (P >= 0), 1 - cos
# ~2e-3 if every one were off that far; a wrong row (another head's, a lost tile) is far above.
FP8_ROW_COS_DIFF = 1e-2
FP8_LSE_REL = 2e-3            # |lse - ref| <= FP8_LSE_REL * max(1, |ref|)


def _fp8_v_max(k_deq, block_table, lens, case: DecodeCase) -> torch.Tensor:
    """(b, s_q, h_q, dv): max_j |v_jc| over the keys each query row sees (0 for a row that sees none)."""
    v_max = torch.zeros(case.b, case.s_q, case.h_q, case.dv, device=k_deq.device)
    for i, L in enumerate(lens.tolist()):
        if L <= 0:
            continue
        blocks = block_table[i, :-(-L // case.page)].long()
        v = k_deq[blocks].reshape(-1, case.h_kv, case.d)[:L, :, :case.dv].abs()
        running = torch.cummax(v, dim=0).values                        # (L, h_kv, dv): max over keys 0 .. j
        # The last key each query sees: L - s_q + i for query i, causal (bottom-right), else L - 1.
        last = torch.arange(case.s_q, device=v.device) + (L - case.s_q) if case.causal else \
            torch.full((case.s_q,), L - 1, device=v.device)
        seen = running[last.clamp(min=0)] * (last >= 0).view(-1, 1, 1)
        v_max[i] = seen.repeat_interleave(case.h_q // case.h_kv, dim=1)
    return v_max


def fp8_out_bound(q_deq, k_deq, block_table, lens, case: DecodeCase) -> torch.Tensor:
    """(b, s_q, h_q, dv): the elementwise bound on |out - ref| of the e4m3 kernel, without out's ulps."""
    weighted, small = fp8_p_error_terms(q_deq, k_deq, block_table, lens, case.dv, causal=case.causal)
    return FP8_OUT_REL * weighted + FP8_SUBNORMAL_ABS * small


def assert_fp8_decode_close(out, lse, ref_out, ref_lse, p_bound):
    """p_bound: fp8_out_bound's (the part of the bound P's rounding and S's error account for)."""
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    out = out.float()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    inf_ref = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), inf_ref) and (lse[inf_ref] > 0).all(), "lse infinities differ"
    empty = inf_ref.transpose(1, 2)   # (b, s_q, h_q): rows that see no key
    assert (out[empty] == 0).all(), "a row that sees no key is not 0"
    ulp = torch.ldexp(torch.ones_like(ref_out), torch.frexp(ref_out).exponent - 8)   # bf16: 8 significant bits
    err, bound = (out - ref_out).abs(), p_bound + FP8_OUT_ULPS * ulp
    assert (err <= bound).all(), (f"out: {(err > bound).sum().item()} elements off, worst at "
                                  f"{(err / bound).max().item():.3g} of the bound, max abs err {err.max():.3g}")
    assert_cosine_close(out, ref_out, FP8_COS_DIFF, FP8_ROW_COS_DIFF)
    finite = ~inf_ref
    lse_err = (lse - ref_lse)[finite].abs()
    assert (lse_err <= FP8_LSE_REL * ref_lse[finite].abs().clamp(min=1)).all(), f"lse max abs err {lse_err.max():.3g}"


def _check_fp8(case: DecodeCase, api: str = "tensors", inputs=None, **call):
    """One call on the case's seeded e4m3 inputs (or `inputs`) against the float32 reference of the
    de-quantized inputs; `call` overrides the descales. Returns the inputs and the call's result."""
    q8, k8, block_table, lens, descale_q, descale_k = inputs or make_fp8_inputs(case, seed=case_seed(case))
    descales = {"descale_q": descale_q, "descale_k": descale_k, **call}
    out, lse = _run(case, q8, k8, block_table, lens, api, **descales)
    torch.cuda.synchronize()
    dq, dk = (1.0 if d is None else d for d in (descales["descale_q"], descales["descale_k"]))
    q_deq, k_deq = q8.float() * dq, k8.float() * dk
    ref_out, ref_lse = mla_decode_reference(q_deq, k_deq, block_table, lens, case.dv, causal=case.causal)
    assert out.shape == (case.b, case.s_q, case.h_q, case.dv) and lse.shape == (case.b, case.h_q, case.s_q)
    assert_fp8_decode_close(out, lse, ref_out, ref_lse, fp8_out_bound(q_deq, k_deq, block_table, lens, case))
    return (q8, k8, block_table, lens, descale_q, descale_k), (out, lse)


def _fp8(*args, **kwargs) -> DecodeCase:
    return DecodeCase(*args, **kwargs, dtype=FP8)


_WS, _UNFUSED, _NO_CLUSTER = ({"MLA_JIT_SM90_DECODE_SCHEDULE": "ws"}, {"MLA_JIT_SM90_DECODE_SCHEDULE": "ws_unfused"},
                              {"MLA_JIT_SM90_CLUSTER": "1"})
# (case, schedule API, environment): heads 1-128 per KV head and 1, 2 or 8 KV heads, s_q 1-16 (causal
# and not), lengths 1 to ~12k (varlen), zero lengths, pages 16 / 64 / 256, d 576 and 512, the fused
# (ws) and unfused schedules and "auto", clusters of 2 row tiles (auto) and none.
_FP8_GRID = [
    (_fp8(2, 1, 140, 1, 1, True), "tensors", {}), (_fp8(6, 1, 4096, 16, 1, True), "lazy", {}),
    (_fp8(64, 1, 20, 64, 1, True), "tensors", _WS), (_fp8(2, 1, 4096, 128), "lazy", _UNFUSED),
    (_fp8(3, 1, 5000, 128), "tensors", {**_UNFUSED, **_NO_CLUSTER}),
    (_fp8(6, 2, 140, 128, 1, True, True), "tensors", _WS), (_fp8(6, 4, 4096, 64, 1, True, True), "lazy", _UNFUSED),
    (_fp8(128, 1, 4096, 16, 1, True, zero_lens=True), "tensors", {}),
    (_fp8(128, 2, 140, 128, 1, True, True, zero_lens=True), "lazy", _WS),
    (_fp8(6, 2, 140, 16, 8, True, True), "tensors", _UNFUSED), (_fp8(2, 2, 4096, 126, 2, True, True), "lazy", _WS),
    (_fp8(6, 1, 140, 128, 1, True, page=16), "tensors", _UNFUSED),
    (_fp8(6, 2, 4096, 64, 1, True, True, page=16), "lazy", _WS),
    (_fp8(6, 1, 4096, 16, 1, True, page=256), "tensors", _WS),
    (_fp8(6, 4, 140, 128, 1, True, True, page=256), "lazy", _UNFUSED),
    (_fp8(6, 1, 140, 16, 1, True, d=512), "tensors", {}),
    (_fp8(2, 2, 4096, 128, 2, True, True, d=512), "lazy", _UNFUSED),
    (_fp8(6, 16, 140, 16, 1, True, True), "tensors", _WS), (_fp8(2, 8, 4096, 128, 1, True, True), "lazy", _UNFUSED),
    (_fp8(64, 16, 1024, 16, 1, True, True), "tensors", {}), (_fp8(4, 16, 4096, 128, 1, False, True), "lazy", _WS),
    (_fp8(6, 12, 140, 64, 2, True), "tensors", _UNFUSED),
    (_fp8(128, 16, 64, 128, 1, True, True, zero_lens=True), "lazy", {}),
    # Sequences ending in a tile's last slot, one past it, and one key.
    (_fp8(1, 1, 63, 16), "tensors", _WS), (_fp8(1, 1, 65, 16), "lazy", _UNFUSED), (_fp8(1, 1, 1, 16), "tensors", {}),
    # Compact rows (9 .. 32 query rows a KV head: rows past 8 sit in other warps' row halves), causal
    # and not, long sequences of a small batch (splits: the fused combine and o_accum).
    (_fp8(2, 1, 9000, 32, 1, True), "tensors", _WS), (_fp8(2, 2, 9000, 16, 1, True, True), "lazy", _UNFUSED),
    (_fp8(6, 2, 140, 32, 2, True, True), "tensors", _WS), (_fp8(5, 3, 4096, 9, 1, True, True), "lazy", {}),
    # Sequences shorter than s_q (causal: their first rows see no key).
    (_fp8(9, 4, 140, 64, 1, True, True, short_lens=True), "tensors", _WS),
    (_fp8(9, 16, 20, 16, 1, True, True, short_lens=True), "lazy", _UNFUSED),
]


@pytest.mark.parametrize("case,api,env", _FP8_GRID,
                         ids=env_grid_ids(_FP8_GRID))
def test_fp8_decode_matches_reference(case, api, env, monkeypatch):
    set_env(monkeypatch, env)
    _check_fp8(case, api)


def test_fp8_long_walks_repeat():
    """~60 tiles a CTA (16 x 32768 tokens, one row tile, 132 parts) and two row tiles clustered, three
    calls each on fresh inputs: a missing ordering between the warpgroups shows as a wrong tile."""
    for seed_case in (_fp8(16, 1, 32768, 16, 1, False, False), _fp8(8, 1, 16384, 128, 1, True, False)):
        for _ in range(3):
            _check_fp8(seed_case)


def test_fp8_descales_are_read_on_the_gpu_every_call():
    """New descale values in the same tensors (the same plan): the next call uses them. SGLang's
    unscaled e4m3 (the values themselves in e4m3; flash_mla_with_kvcache with descales of ones, or
    None) gives the same result every way."""
    case = _fp8(6, 2, 700, 64, 1, True, True)
    inputs, _ = _check_fp8(case)
    q8, k8, block_table, lens, descale_q, descale_k = inputs
    descale_q.mul_(0.5)   # in place: a warm call reads them through the same pointers
    descale_k.mul_(3.0)
    _check_fp8(case, inputs=inputs)
    q_raw, k_raw = ((x.float() * d).to(FP8) for x, d in ((q8, descale_q), (k8, descale_k)))   # NaN stays NaN
    _, (out, lse) = _check_fp8(case, inputs=(q_raw, k_raw, block_table, lens, None, None))
    ones = torch.ones(1, device="cuda")
    _, (ones_out, ones_lse) = _check_fp8(case, inputs=(q_raw, k_raw, block_table, lens, ones, ones.clone()))
    metadata, num_splits = mla_jit.get_mla_metadata(lens, case.s_q * case.h_q, 1)
    sglang = mla_jit.flash_mla_with_kvcache(q_raw, k_raw, block_table, lens, case.dv, metadata, num_splits,
                                            causal=True, descale_q=ones, descale_k=ones)
    torch.cuda.synchronize()
    for other_out, other_lse in ((ones_out, ones_lse), sglang):
        assert torch.equal(other_out, out) and torch.equal(other_lse, lse)


@pytest.mark.parametrize("schedule", ["auto", "ws"])  # ws: the fused combine's counters in the graph
def test_fp8_cuda_graph_replays_with_new_lengths_and_descales(schedule, monkeypatch):
    """get_mla_metadata + SGLang's call captured with descale tensors: a replay reads the descales'
    current values and the new lengths."""
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", schedule)
    case = _fp8(16, 2, 1024, 64, 1, True, True)
    check_graph_replay(case, *_check_fp8(case), assert_fp8_decode_close, fp8_out_bound)


def check_graph_replay(case: DecodeCase, inputs, eager, assert_close, bound_of=None) -> None:
    """The call on `inputs` (warm, giving `eager`) captured, then replayed with a third of the
    lengths and new descale values: checked against the reference by assert_close, whose last
    argument is bound_of(q_deq, k_deq, block_table, lens, case) (default: max |v| over the keys seen)."""
    q8, k8, block_table, lens, descale_q, descale_k = inputs
    graph, g_out, g_lse = _capture_replays_eager(case, eager, q8, k8, block_table, lens, descale_q=descale_q,
                                                 descale_k=descale_k)
    lens.copy_(torch.clamp(lens // 3, min=case.s_q))
    descale_q.mul_(2.0)
    descale_k.mul_(0.25)
    graph.replay()
    torch.cuda.synchronize()
    q_deq, k_deq = q8.float() * descale_q, k8.float() * descale_k
    ref_out, ref_lse = mla_decode_reference(q_deq, k_deq, block_table, lens, case.dv, causal=True)
    bound = (bound_of(q_deq, k_deq, block_table, lens, case) if bound_of is not None
             else _fp8_v_max(k_deq, block_table, lens, case))
    assert_close(g_out, g_lse, ref_out, ref_lse, bound)


@pytest.mark.parametrize("api", ["tensors", "lazy"])
def test_fp8_torch_compile_fullgraph_matches_eager(api):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    case = _fp8(6, 2, 3000, 64, 1, True, True)
    inputs = make_fp8_inputs(case, seed=case_seed(case))

    def layer(q8, k8, block_table, lens, descale_q, descale_k):
        if api == "lazy":
            metadata, num_splits = mla_jit.get_mla_metadata()
        else:
            metadata, num_splits = mla_jit.get_mla_metadata(lens, case.s_q * case.h_q, 1)
        return mla_jit.flash_mla_with_kvcache_fp8(q8, k8, block_table, lens, case.dv, metadata, num_splits, None,
                                                  True, descale_q, descale_k)

    eager_out, eager_lse = layer(*inputs)
    out, lse = torch.compile(layer, fullgraph=True)(*inputs)
    torch.cuda.synchronize()
    assert dict(counters["graph_break"]) == {}
    assert out.dtype == torch.bfloat16 and torch.equal(out, eager_out) and torch.equal(lse, eager_lse)


def test_fp8_typed_errors_on_the_gpu():
    """A descale on the CPU (q on the GPU) and descale_q with a bf16 q (over the FP8 cache): typed
    errors naming the argument, before any decode kernel."""
    case = _fp8(2, 1, 128, 16)
    q8, k8, block_table, lens, descale_q, descale_k = make_fp8_inputs(case)
    metadata, num_splits = mla_jit.get_mla_metadata(lens, 16, 1)
    args = (q8, k8, block_table, lens, 512, metadata, num_splits)
    mla_jit.flash_mla_with_kvcache_fp8(*args, descale_q=descale_q, descale_k=descale_k)   # warm
    with pytest.raises(mla_jit.InvalidArgumentError) as info:
        mla_jit.flash_mla_with_kvcache_fp8(*args, descale_q=descale_q.cpu(), descale_k=descale_k)
    assert info.value.argument == "descale_q"
    with pytest.raises(mla_jit.InvalidArgumentError) as info:
        mla_jit.flash_mla_with_kvcache(q8.to(torch.bfloat16), *args[1:], descale_q=descale_q, descale_k=descale_k)
    assert info.value.argument == "descale_q"

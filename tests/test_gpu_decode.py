"""Dense paged MLA decode on a Hopper GPU against a float32 torch reference (FlashMLA's bounds)."""
import itertools
import os

import pytest
import torch

import mla_jit

from .decode_inputs import DecodeCase, case_seed, make_inputs
from .decode_reference import mla_decode_reference
from .closeness import assert_cosine_close
from .helpers import call_with_poisoned_outputs

pytestmark = pytest.mark.gpu


def _grid() -> list[DecodeCase]:
    heads = [(1, 1), (3, 1), (9, 3), (63, 1), (64, 1), (126, 2), (128, 1), (16, 8), (64, 2), (128, 8)]
    batches = [1, 2, 6, 64]
    cases = []
    full = os.environ.get("MLA_JIT_FULL_GRID") == "1"
    combos = itertools.product([1, 2, 4], [20, 140, 4096], [False, True], [False, True])
    for n, (s_q, s_k, causal, varlen) in enumerate(combos):
        head_list = heads if full else [heads[n % len(heads)], heads[(n * 7 + 3) % len(heads)]]
        for h_q, h_kv in head_list:
            b = batches[(n + h_q) % len(batches)]
            if s_k == 4096 and b == 64 and not full:
                b = 6
            cases.append(DecodeCase(b, s_q, s_k, h_q, h_kv, varlen, causal))
    for page in (16, 256):
        for s_q, s_k, h_q, causal in ((1, 140, 128, False), (2, 4096, 64, True), (4, 20, 9, True)):
            cases.append(DecodeCase(6, s_q, s_k, h_q, 1, True, causal, page=page))
    # Every supported page size (configs/decode.py): 32 and 128 too, one case each.
    cases += [DecodeCase(6, 2, 4096, 64, 1, True, True, page=32), DecodeCase(6, 1, 140, 128, 1, True, False, page=128)]
    cases += [DecodeCase(6, 2, 140, 64, 1, True, True, dtype=torch.float16),
              DecodeCase(2, 1, 4096, 128, 1, False, False, dtype=torch.float16),
              DecodeCase(6, 1, 140, 16, 1, True, False, d=512),
              DecodeCase(2, 2, 4096, 128, 2, True, True, d=512),
              DecodeCase(128, 1, 4096, 16, 1, True, False, zero_lens=True),
              DecodeCase(128, 2, 140, 128, 1, True, True, zero_lens=True),
              DecodeCase(2, 1, 131072, 16, 1, False, False),
              DecodeCase(1, 4, 65536, 128, 1, False, True),
              # The largest batch, with the most rows (8 row tiles), and with 2 KV heads.
              DecodeCase(1024, 4, 64, 128, 1, True, True),
              DecodeCase(1024, 1, 64, 128, 2, True, False, zero_lens=True),
              # Speculative decoding: 5 to 16 query tokens a sequence (causal bottom-right), up to
              # 2048 rows (32 row tiles) a KV head.
              DecodeCase(6, 5, 140, 16, 1, True, True), DecodeCase(2, 8, 4096, 128, 1, True, True),
              DecodeCase(64, 16, 1024, 16, 1, True, True), DecodeCase(6, 16, 20, 9, 3, True, True),
              DecodeCase(4, 16, 4096, 128, 1, False, True), DecodeCase(6, 12, 140, 64, 2, True, False),
              DecodeCase(128, 16, 64, 128, 1, True, True, zero_lens=True),
              # Sequences shorter than s_q: causal, their first s_q - L rows see no key (out 0, lse +inf).
              DecodeCase(6, 4, 140, 64, 1, True, True, short_lens=True),
              DecodeCase(9, 16, 20, 16, 1, True, True, short_lens=True),
              DecodeCase(6, 12, 140, 128, 2, True, True, zero_lens=True, short_lens=True),
              DecodeCase(6, 4, 140, 9, 3, True, False, short_lens=True)]
    return cases


def _run(case: DecodeCase, q, k_cache, block_table, lens, api: str = "tensors", **descales):
    """One call through FlashMLA's long-standing API ("tensors": get_mla_metadata(...) returns the
    schedule) or its current one ("lazy": get_mla_metadata() returns an empty FlashMLASchedMeta
    that the call fills). With `descales` (e4m3 q and cache), through vLLM's flash_mla_with_kvcache_fp8.
    The outputs start as NaN (call_with_poisoned_outputs: the call runs twice, schedule included)."""
    decode = mla_jit.flash_mla_with_kvcache_fp8 if descales else mla_jit.flash_mla_with_kvcache

    def call():
        if api == "lazy":
            metadata, num_splits = mla_jit.get_mla_metadata()
        else:
            metadata, num_splits = mla_jit.get_mla_metadata(lens, case.s_q * case.h_q // case.h_kv, case.h_kv)
        return decode(q, k_cache, block_table, lens, case.dv, metadata, num_splits, causal=case.causal, **descales)

    return call_with_poisoned_outputs(call)


def assert_decode_close(out, lse, ref_out, ref_lse):
    out = out.float()
    assert torch.equal(torch.isnan(out), torch.isnan(ref_out)) and not torch.isnan(out).any()
    close = ((out - ref_out).abs() <= 8e-4) | ((out - ref_out).abs() <= 2 / 128 * ref_out.abs())
    assert close.all(), f"out: {(~close).sum().item()} elements off, max abs err {(out - ref_out).abs().max():.3g}"
    # FlashMLA's whole-tensor bound; a row's own (P and out rounded to bf16: ~1e-6) far inside 1e-4.
    assert_cosine_close(out, ref_out, 5e-6, 1e-4)
    inf_ref = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), inf_ref), "lse infinities differ from the reference"
    assert torch.equal(lse[inf_ref], ref_lse[inf_ref]), "lse: +inf (no key) expected"
    assert not torch.isnan(lse).any()
    # Rows without a key: exactly zero (lse (b, h, s) against out (b, s, h, dv)).
    assert (out[inf_ref.transpose(1, 2)] == 0).all(), "out of a row without keys is not 0"
    finite = ~inf_ref
    lse_close = ((lse - ref_lse).abs() <= 1e-6) | ((lse - ref_lse).abs() <= 1.25e-4 * ref_lse.abs())
    assert lse_close[finite].all(), f"lse max abs err {(lse - ref_lse)[finite].abs().max():.3g}"


@pytest.mark.parametrize("api", ["tensors", "lazy"])
@pytest.mark.parametrize("case", _grid(), ids=str)
def test_decode_matches_reference(case, api):
    q, k_cache, block_table, lens = make_inputs(case, seed=case_seed(case))
    out, lse = _run(case, q, k_cache, block_table, lens, api)
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, lens, case.dv, causal=case.causal)
    assert out.shape == (case.b, case.s_q, case.h_q, case.dv) and out.dtype == case.dtype
    assert lse.shape == (case.b, case.h_q, case.s_q) and lse.dtype == torch.float32
    assert_decode_close(out, lse, ref_out, ref_lse)


@pytest.mark.parametrize("api", ["tensors", "lazy"])
def test_empty_batch(api):
    """b = 0 (an engine's step with no decode requests): empty outputs of the right shapes, no kernel."""
    case = DecodeCase(0, 2, 64, 16)
    q = torch.randn(0, 2, 16, 576, device="cuda").to(torch.bfloat16)
    k_cache = torch.randn(4, 64, 1, 576, device="cuda").to(torch.bfloat16)
    block_table = torch.zeros(0, 4, dtype=torch.int32, device="cuda")
    lens = torch.zeros(0, dtype=torch.int32, device="cuda")
    out, lse = _run(case, q, k_cache, block_table, lens, api)
    torch.cuda.synchronize()
    assert out.shape == (0, 2, 16, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (0, 16, 2) and lse.dtype == torch.float32


def _check_case(case: DecodeCase) -> None:
    """One call on the case's seeded inputs against the float32 reference."""
    q, k_cache, block_table, lens = make_inputs(case, seed=case_seed(case))
    out, lse = _run(case, q, k_cache, block_table, lens)
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, lens, case.dv, causal=case.causal)
    assert_decode_close(out, lse, ref_out, ref_lse)


def test_all_sequences_empty():
    case = DecodeCase(4, 2, 64, 16)
    q, k_cache, block_table, _ = make_inputs(case)
    k_cache.fill_(float("nan"))        # nothing may be read ...
    block_table.fill_(1 << 30)         # ... nor any page looked up
    lens = torch.zeros(4, dtype=torch.int32, device="cuda")
    out, lse = _run(case, q, k_cache, block_table, lens)
    torch.cuda.synchronize()
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isinf(lse).all() and (lse > 0).all()


def _capture(case: DecodeCase, q, k_cache, block_table, lens, **descales):
    """(graph, out, lse) of get_mla_metadata + flash_mla_with_kvcache (with `descales`: SGLang's
    FP8 call) captured on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        metadata, num_splits = mla_jit.get_mla_metadata(lens, case.s_q * case.h_q // case.h_kv, case.h_kv)
        out, lse = mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, case.dv, metadata, num_splits,
                                                  causal=case.causal, **descales)
    return graph, out, lse


def _capture_replays_eager(case: DecodeCase, eager, q, k_cache, block_table, lens, **descales):
    """_capture's (graph, out, lse), after checking that a replay (outputs poisoned first) gives the
    eager call's `(out, lse)` bit for bit."""
    graph, g_out, g_lse = _capture(case, q, k_cache, block_table, lens, **descales)
    g_out.fill_(float("nan"))
    g_lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(g_out, eager[0]) and torch.equal(g_lse, eager[1])
    return graph, g_out, g_lse


@pytest.mark.parametrize("schedule", ["auto", "ws"])  # ws: the fused combine's counters in the graph
def test_cuda_graph_capture_and_replay_match_eager(schedule, monkeypatch):
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", schedule)
    case = DecodeCase(16, 2, 1024, 64, 1, True, True)
    q, k_cache, block_table, lens = make_inputs(case)
    eager = _run(case, q, k_cache, block_table, lens)  # warms every kernel
    torch.cuda.synchronize()
    graph, g_out, g_lse = _capture_replays_eager(case, eager, q, k_cache, block_table, lens)
    # Same graph, new lengths: the captured metadata kernel recomputes the schedule.
    lens.copy_(torch.clamp(lens // 3, min=case.s_q))
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, lens, case.dv, causal=case.causal)
    assert_decode_close(g_out, g_lse, ref_out, ref_lse)


@pytest.mark.parametrize("case", [DecodeCase(1, 1, 8192, 2, 1, True, False),
                                  DecodeCase(2, 1, 8192, 8, 8, True, False)], ids=str)
def test_graph_capture_with_fused_combine_and_small_scratch(case, monkeypatch):
    """Captured calls whose partials scratch is small (< 1 MB): the fused combine's counters must
    not share a block of the graph's pool with the partials (they did once: NaN on replay)."""
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", "ws")
    q, k_cache, block_table, lens = make_inputs(case, seed=case_seed(case))
    _run(case, q, k_cache, block_table, lens)  # warm
    torch.cuda.synchronize()
    graph, g_out, g_lse = _capture(case, q, k_cache, block_table, lens)
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, lens, case.dv)
    for _ in range(2):
        g_out.fill_(float("nan"))
        g_lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_decode_close(g_out, g_lse, ref_out, ref_lse)


def test_scratch_reuse_across_calls_streams_and_graphs():
    """The split-KV scratch is cached per stream: back-to-back calls of different sizes on one
    stream, a concurrent call on a second stream and a concurrent graph replay stay correct."""
    big, small = DecodeCase(32, 2, 4096, 64, 1, True, True), DecodeCase(4, 1, 700, 16, 1, True, False)
    big_in, small_in = make_inputs(big, seed=1), make_inputs(small, seed=2)
    big_ref = mla_decode_reference(*big_in, big.dv, causal=big.causal)
    small_ref = mla_decode_reference(*small_in, small.dv, causal=small.causal)
    _run(big, *big_in)  # warm
    torch.cuda.synchronize()
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        g_out, g_lse = _run(big, *big_in)
    side = torch.cuda.Stream()
    results = []
    for _ in range(3):
        results.append((small_ref, _run(small, *small_in)))
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            side_result = _run(big, *big_in)
        graph.replay()
        results.append((big_ref, _run(big, *big_in)))
        torch.cuda.current_stream().wait_stream(side)
        results.append((big_ref, side_result))
    torch.cuda.synchronize()
    for (ref_out, ref_lse), (out, lse) in results + [(big_ref, (g_out, g_lse))]:
        assert_decode_close(out, lse, ref_out, ref_lse)
    mla_jit.release_workspaces()
    out, lse = _run(small, *small_in)
    torch.cuda.synchronize()
    assert_decode_close(out, lse, *small_ref)


def test_metadata_is_a_valid_partition():
    lens = torch.tensor([0, 1, 64, 65, 4096, 131072, 7, 0, 300], dtype=torch.int32, device="cuda")
    metadata, num_splits = mla_jit.get_mla_metadata(lens, 64, 1)
    torch.cuda.synchronize()
    meta, splits = metadata.cpu().tolist(), num_splits.cpu().tolist()
    covered = {i: [] for i in range(len(lens))}
    for begin_b, begin_t, end_b, end_t, _, *_ in meta:
        if (begin_b, begin_t) == (end_b, end_t):
            continue
        for i in range(begin_b, end_b + 1):
            lo = begin_t if i == begin_b else 0
            hi = end_t if i == end_b else int(lens[i])
            if hi > lo:
                covered[i].append((lo, hi))
    for i, L in enumerate(lens.tolist()):
        spans = sorted(covered[i])
        assert sum(h - l for l, h in spans) == L, (i, spans)
        assert all(spans[k][1] == spans[k + 1][0] for k in range(len(spans) - 1))
        assert splits[i + 1] - splits[i] == (len(spans) if L else 0)


def test_bad_arguments_raise_typed_errors():
    case = DecodeCase(2, 1, 128, 16)
    q, k_cache, block_table, lens = make_inputs(case)
    metadata, num_splits = mla_jit.get_mla_metadata(lens, 16, 1)
    good = dict(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=lens, head_dim_v=512,
                tile_scheduler_metadata=metadata, num_splits=num_splits)
    bad = [("q", q.float(), "q"), ("k_cache", k_cache.half(), "k_cache"), ("head_dim_v", 256, "head_dim_v"),
           ("block_table", block_table.long(), "block_table"), ("cache_seqlens", lens[:1], "cache_seqlens"),
           ("num_splits", num_splits[:-1], "num_splits"), ("q", q[..., :512], "k_cache"),
           ("k_cache", k_cache.view(-1, 32, 1, 576)[:, :24], "k_cache"),
           ("q", q.expand(2, 17, 16, 576), "s_q"), ("tile_scheduler_metadata", metadata[:, :4],
                                                   "tile_scheduler_metadata")]
    for name, value, match in bad:
        with pytest.raises(mla_jit.InvalidArgumentError, match=match):
            mla_jit.flash_mla_with_kvcache(**{**good, name: value})
    with pytest.raises(mla_jit.InvalidArgumentError, match="num_heads_k"):
        mla_jit.get_mla_metadata(lens, 16, 0)


def _sm80_grid() -> list[DecodeCase]:
    cases = []
    for n, (s_q, s_k, causal, varlen) in enumerate(itertools.product([1, 2], [20, 140, 4096], [False, True],
                                                                      [False, True])):
        h_q, h_kv = [(16, 1), (128, 1), (9, 3), (64, 2)][n % 4]
        cases.append(DecodeCase([1, 6, 2, 64][n % 4], s_q, s_k, h_q, h_kv, varlen, causal))
    cases += [DecodeCase(6, 2, 140, 64, 1, True, True, page=16), DecodeCase(6, 1, 4096, 16, 1, True, False, page=256),
              DecodeCase(6, 2, 140, 64, 1, True, True, dtype=torch.float16), DecodeCase(6, 1, 140, 16, d=512),
              DecodeCase(64, 2, 140, 128, 1, True, True, zero_lens=True),
              DecodeCase(6, 16, 140, 16, 1, True, True), DecodeCase(2, 8, 1024, 128, 1, True, True)]
    return cases


@pytest.mark.parametrize("tuning", ["sm_80", "sm_89"])
@pytest.mark.parametrize("case", _sm80_grid(), ids=str)
def test_sm80_family_matches_reference(tuning, case, monkeypatch):
    """The Ampere/Ada family, forced on a Hopper GPU through MLA_JIT_ARCH (its cubin targets sm_90a)."""
    monkeypatch.setenv("MLA_JIT_ARCH", tuning)
    _check_case(case)


def _growing_scores_inputs(case: DecodeCase, rise: float):
    """Seeded inputs whose q . k grows along each sequence by about `rise` (natural units, at
    softmax_scale 1): q and every key get a shared direction, keys in proportion to their position.
    The running row max then moves many times, across tiles and splits."""
    q, k_cache, block_table, lens = make_inputs(case, seed=case_seed(case))
    u = torch.full((case.d,), case.d ** -0.5, device="cuda")
    q = (q.float() + 4.0 * u).to(case.dtype)
    flat = k_cache.view(-1, case.h_kv, case.d)  # NaN slots stay NaN
    for i in range(case.b):
        n = int(lens[i])
        t = torch.arange(n, device="cuda")
        phys = block_table[i, t // case.page].long() * case.page + t % case.page
        ramp = (rise / 4.0) * t.float() / max(n, 1)
        flat[phys] = (flat[phys].float() + ramp[:, None, None] * u).to(case.dtype)
    return q, k_cache, block_table, lens


@pytest.mark.parametrize("schedule", ["auto", "ws", "ws_unfused"])
@pytest.mark.parametrize("case", [DecodeCase(3, 1, 5000, 64, 1, True, False), DecodeCase(2, 2, 3000, 128, 1, False, True),
                                  DecodeCase(5, 1, 700, 16, 1, True, False, page=16)], ids=str)
def test_scores_growing_along_the_sequence(schedule, case, monkeypatch):
    """The online softmax's rescaling paths (a row max that keeps growing, by 60 natural units over
    a sequence) against the reference, with an explicit softmax_scale of 1."""
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", schedule)
    q, k_cache, block_table, lens = _growing_scores_inputs(case, rise=60.0)

    def call():
        metadata, num_splits = mla_jit.get_mla_metadata(lens, case.s_q * case.h_q // case.h_kv, case.h_kv)
        return mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, case.dv, metadata, num_splits,
                                              softmax_scale=1.0, causal=case.causal)

    out, lse = call_with_poisoned_outputs(call)
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, lens, case.dv, softmax_scale=1.0,
                                            causal=case.causal)
    assert_decode_close(out, lse, ref_out, ref_lse)


def test_fused_combine_leaves_its_counters_zero(monkeypatch):
    """The fused combine's arrival counters (one per batch, KV head and row tile) are zero again
    after every call: the next call on the stream relies on it. Many splits per batch, two row
    tiles and two KV heads, three calls in a row."""
    from mla_jit.runtimes import workspace
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", "ws")  # "auto" would not fuse this shape
    case = DecodeCase(3, 2, 20000, 128, 2, True, True)
    inputs = make_inputs(case, seed=5)
    ref_out, ref_lse = mla_decode_reference(*inputs, case.dv, causal=case.causal)
    for _ in range(3):
        out, lse = _run(case, *inputs)
        torch.cuda.synchronize()
        assert_decode_close(out, lse, ref_out, ref_lse)
    counters = list(workspace._counters.values())
    assert counters, "the ws schedule should use the fused combine"
    assert all(int(c.count_nonzero()) == 0 for c in counters)

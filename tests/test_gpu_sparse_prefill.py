"""flash_mla_sparse_fwd (the sparse DSA prefill) on a Hopper GPU, over bf16 kv rows (d_qk 576 and 512)
and straight over FlashMLA's FP8 records, also with the Ampere/Ada tunings forced, against a float32
reference (FlashMLA's tests/ref.py semantics: max_logits -inf and lse +inf for a token with no valid
key, out 0 there; the attention sink scales out only).

Bounds: K and V are the reference's own values (bf16 rows, or the records de-quantized exactly), so
only the kernel's rounding counts (P in bf16 before P V, out's bf16 rounding): |out - ref| <= 2^-8
max|v| + 2 ulps, 1 - cos < 1e-5; lse and max_logits within 1.25e-4 relative (1e-5 absolute near 0)."""
import dataclasses

import pytest
import torch

import mla_jit
from mla_jit.errors import InvalidArgumentError

from .decode_inputs import case_seed
from .helpers import call_with_poisoned_outputs
from .sparse_inputs import SparseCase, assert_out_within, extreme_invalid, make_sparse_inputs

pytestmark = pytest.mark.gpu


@dataclasses.dataclass(frozen=True)
class PrefillCase:
    s_q: int
    h_q: int
    topk: int
    s_kv: int
    d: int = 576
    invalid: float = 0.1
    topk_length: bool = False
    sink: bool = False
    zero_lengths: bool = False
    extreme: bool = False   # invalid entries of extreme values (sparse_inputs.extreme_invalid)

    def __str__(self) -> str:
        flags = "".join(f"-{n}" for n in ("topk_length", "sink", "zero_lengths", "extreme") if getattr(self, n))
        return f"sq{self.s_q}-hq{self.h_q}-topk{self.topk}-skv{self.s_kv}-d{self.d}-inv{self.invalid}{flags}"


def make_rows_inputs(case: PrefillCase, seed: int):
    """q (s_q, h_q, d) bf16, kv (s_kv, 1, d) bf16 (NaN in rows no counted index selects), indices
    (s_q, 1, topk) int32 with -1 and >= s_kv entries, topk_length (s_q,) or None, attn_sink or None."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((case.s_q, case.h_q, case.d), generator=gen, device="cuda").to(torch.bfloat16)
    kv = torch.randn((case.s_kv, 1, case.d), generator=gen, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, case.s_kv, (case.s_q, 1, case.topk), generator=gen, device="cuda")
    r = torch.rand(idx.shape, generator=gen, device="cuda")
    idx = torch.where(r < case.invalid / 2, -1, idx)
    idx = torch.where((r >= case.invalid / 2) & (r < case.invalid), case.s_kv + idx % 5, idx).int()
    topk_length = None
    if case.topk_length:
        topk_length = torch.randint(1, case.topk + 1, (case.s_q,), generator=gen, device="cuda").int()
        if case.zero_lengths:
            topk_length[::3] = 0
    if case.extreme:
        idx = extreme_invalid(idx, r < case.invalid, None if topk_length is None else topk_length.view(-1, 1, 1),
                              case.s_kv)
    sink = torch.randn((case.h_q,), generator=gen, device="cuda") * 2 if case.sink else None
    counted = _counted(idx[:, 0], topk_length, case.s_kv)
    used = torch.zeros(case.s_kv, dtype=torch.bool, device="cuda")
    used[idx[:, 0].long()[counted]] = True
    kv[~used] = float("nan")
    return q, kv, idx, topk_length, sink


def _counted(indices, topk_length, rows):
    valid = (indices >= 0) & (indices < rows)
    if topk_length is not None:
        valid &= torch.arange(indices.shape[-1], device=indices.device) < topk_length.view(-1, 1)
    return valid


def prefill_reference(q, rows, indices, topk_length, sink, scale):
    """(out (s_q, h_q, 512), max_logits, lse (s_q, h_q), max |v| per token) in float32; rows (n, d)."""
    idx = indices[:, 0]
    counted = _counted(idx, topk_length, rows.shape[0])
    k = torch.where(counted[..., None], rows[idx.long().clamp(0, rows.shape[0] - 1)].float(), 0.0)
    s = torch.einsum("shd,std->sht", q.float(), k) * scale
    s = s.masked_fill(~counted[:, None, :], float("-inf"))
    max_logits = s.amax(-1)
    lse = torch.logsumexp(s, -1)
    lonely = torch.isinf(lse)
    p = torch.exp(s - torch.where(lonely, 0.0, lse)[..., None])
    out = torch.einsum("sht,std->shd", p, k[..., :512])
    if sink is not None:
        out = out / (1 + torch.exp(sink.view(1, -1) - lse))[..., None]
    out[lonely] = 0.0
    v_max = k[..., :512].abs().amax((-1, -2))
    return out, max_logits, torch.where(lonely, float("inf"), lse), v_max


def assert_prefill_close(got, want):
    out, max_logits, lse = got
    ref_out, ref_max, ref_lse, v_max = want
    out = out.float()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any() and not torch.isnan(max_logits).any()
    lonely = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), lonely) and (lse[lonely] > 0).all(), "lse infinities differ"
    assert torch.equal(torch.isinf(max_logits), lonely) and (max_logits[lonely] < 0).all(), "max_logits infinities"
    assert_out_within(out, ref_out, v_max[:, None, None])
    for name, a, b in (("lse", lse, ref_lse), ("max_logits", max_logits, ref_max)):
        d = (a - b)[~lonely].abs()
        assert ((d <= 1e-5) | (d <= 1.25e-4 * b[~lonely].abs())).all(), f"{name} max abs err {d.max():.3g}"


def _check_rows(case: PrefillCase, out_arg: bool = False):
    q, kv, indices, topk_length, sink = make_rows_inputs(case, case_seed(case))
    scale = case.d ** -0.5 * 1.25
    out = torch.full((case.s_q, case.h_q, 512), float("nan"), dtype=torch.bfloat16, device="cuda") if out_arg else None
    got = call_with_poisoned_outputs(lambda: mla_jit.flash_mla_sparse_fwd(q, kv, indices, scale, 512, attn_sink=sink,
                                                                          topk_length=topk_length, out=out))
    assert got[0].shape == (case.s_q, case.h_q, 512) and got[1].shape == got[2].shape == (case.s_q, case.h_q)
    if out_arg:
        assert got[0] is out
    assert_prefill_close(got, prefill_reference(q, kv[:, 0], indices, topk_length, sink, scale))


ROWS_GRID = [
    PrefillCase(37, 128, 2048, 8192, topk_length=True, sink=True),
    PrefillCase(5, 1, 64, 300),
    PrefillCase(64, 16, 512, 1000, invalid=0.5),
    PrefillCase(19, 20, 192, 700, sink=True),
    PrefillCase(12, 64, 128, 64, topk_length=True, zero_lengths=True),
    PrefillCase(3, 8, 256, 256, invalid=1.0),
    PrefillCase(300, 32, 64, 131072, sink=True),
    PrefillCase(33, 64, 1024, 4096, d=512),
    PrefillCase(7, 128, 2048, 4096, d=512, topk_length=True, sink=True),
    PrefillCase(9, 3, 80, 500, d=512, invalid=0.3),
    PrefillCase(5, 100, 320, 2000, topk_length=True, sink=True),
    PrefillCase(260, 128, 96, 5000, invalid=0.2),
    # topk past V3.2's 2048 (any multiple of 64 up to 32768), and invalid entries of extreme values.
    PrefillCase(9, 64, 4096, 20000, topk_length=True, sink=True),
    PrefillCase(4, 16, 8192, 40000, invalid=0.3),
    PrefillCase(6, 128, 32768, 70000, topk_length=True),
    PrefillCase(23, 32, 320, 3000, invalid=0.5, topk_length=True, extreme=True),
]


@pytest.mark.parametrize("case", ROWS_GRID, ids=str)
def test_sparse_prefill_bf16_rows(case):
    _check_rows(case)


def test_sparse_prefill_writes_out():
    _check_rows(PrefillCase(21, 16, 256, 2000, topk_length=True, sink=True), out_arg=True)


@pytest.mark.parametrize("tuning", ["sm_80", "sm_89"])
@pytest.mark.parametrize("case", [PrefillCase(11, 64, 512, 3000, topk_length=True, sink=True),
                                  PrefillCase(6, 24, 256, 900, d=512)], ids=str)
def test_sparse_prefill_ampere_ada_tunings(tuning, case, monkeypatch):
    monkeypatch.setenv("MLA_JIT_ARCH", tuning)
    _check_rows(case)


def _check_records(case: SparseCase, tuning=None, monkeypatch=None):
    """Over the FP8 cache: the decode tests' records with b = s_q query tokens of one position each."""
    if tuning:
        monkeypatch.setenv("MLA_JIT_ARCH", tuning)
    q, records, deq, indices, topk_length, sink = make_sparse_inputs(case, seed=case_seed(case))
    q = q.view(case.b, case.h_q, 576)
    got = call_with_poisoned_outputs(lambda: mla_jit.flash_mla_sparse_fwd(q, records, indices, 576 ** -0.5,
                                                                          attn_sink=sink, topk_length=topk_length))
    assert_prefill_close(got, prefill_reference(q, deq.view(-1, 576), indices, topk_length, sink, 576 ** -0.5))


@pytest.mark.parametrize("case", [SparseCase(40, 1, 128, 2048, sink=True),
                                  SparseCase(17, 1, 128, 448, page=16, invalid=0.5, topk_length=True, zero_lengths=True),
                                  SparseCase(9, 1, 16, 320, page=16, topk_length=True, zero_lengths=True),
                                  SparseCase(13, 1, 5, 192, page=128, invalid=0.4),
                                  SparseCase(11, 1, 64, 4096, s_k=16384, invalid=0.3, topk_length=True, extreme=True)],
                         ids=str)
def test_sparse_prefill_fp8_records(case):
    _check_records(case)


# 128 heads over the FP8 cache as cluster pairs (MLA_JIT_SM90_CLUSTER=2, configs/sparse.py head_tile_pairs).
@pytest.mark.parametrize("case", [SparseCase(40, 1, 128, 2048, sink=True),
                                  SparseCase(17, 1, 100, 448, page=16, invalid=0.5, topk_length=True, zero_lengths=True)],
                         ids=str)
def test_sparse_prefill_fp8_records_head_tile_pairs(case, monkeypatch):
    monkeypatch.setenv("MLA_JIT_SM90_CLUSTER", "2")
    _check_records(case)


@pytest.mark.parametrize("tuning", ["sm_80", "sm_89"])
def test_sparse_prefill_fp8_records_ampere_ada(tuning, monkeypatch):
    _check_records(SparseCase(10, 1, 32, 512, topk_length=True, sink=True), tuning, monkeypatch)


def test_sparse_prefill_no_tokens():
    q, kv, indices, _, _ = make_rows_inputs(PrefillCase(4, 16, 64, 100), seed=1)
    out, max_logits, lse = mla_jit.flash_mla_sparse_fwd(q[:0], kv, indices[:0], 0.1)
    assert out.shape == (0, 16, 512) and max_logits.shape == lse.shape == (0, 16)


def test_sparse_prefill_graph_replay():
    case = PrefillCase(24, 32, 256, 1500, topk_length=True, sink=True)
    q, kv, indices, topk_length, sink = make_rows_inputs(case, seed=21)
    mla_jit.flash_mla_sparse_fwd(q, kv, indices, 0.07, attn_sink=sink, topk_length=topk_length)   # warm
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        got = mla_jit.flash_mla_sparse_fwd(q, kv, indices, 0.07, attn_sink=sink, topk_length=topk_length)
    for seed in (22, 23):
        q2, kv2, indices2, topk_length2, sink2 = make_rows_inputs(case, seed=seed)
        for dst, src in ((q, q2), (kv, kv2), (indices, indices2), (topk_length, topk_length2), (sink, sink2)):
            dst.copy_(src)
        for t in got:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_prefill_close(got, prefill_reference(q2, kv2[:, 0], indices2, topk_length2, sink2, 0.07))


def test_sparse_prefill_under_torch_compile():
    case = PrefillCase(10, 16, 128, 600, sink=True)
    q, kv, indices, _, sink = make_rows_inputs(case, seed=31)
    out = torch.full((10, 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")   # (every element written)

    @torch.compile(fullgraph=True)
    def step(q, kv, indices, sink, out):
        a = mla_jit.flash_mla_sparse_fwd(q, kv, indices, 0.05, attn_sink=sink)
        b = mla_jit.flash_mla_sparse_fwd(q, kv, indices, 0.05, attn_sink=sink, out=out)
        return a, b[1], b[2]

    a, max_logits, lse = step(q, kv, indices, sink, out)
    want = prefill_reference(q, kv[:, 0], indices, None, sink, 0.05)
    assert_prefill_close(a, want)
    assert_prefill_close((out, max_logits, lse), want)


def test_sparse_prefill_bad_arguments_raise_typed_errors():
    q, kv, indices, topk_length, _ = make_rows_inputs(PrefillCase(4, 16, 64, 100, topk_length=True), seed=2)
    records = torch.zeros((4, 64, 1, 656), dtype=torch.uint8, device="cuda")
    for kw, name in ((dict(q=q.float()), "q"), (dict(q=q[..., :448]), "q"), (dict(kv=kv[..., :512]), "kv"),
                     (dict(kv=records, q=q[..., :512].contiguous()), "kv"), (dict(indices=indices[:3]), "indices"),
                     (dict(indices=indices.long()), "indices"), (dict(d_v=256), "d_v"),
                     (dict(topk_length=topk_length[:2]), "topk_length"), (dict(sm_scale=float("nan")), "sm_scale"),
                     (dict(attn_sink=torch.zeros(8, device="cuda")), "attn_sink"),
                     (dict(out=torch.empty((4, 16, 256), dtype=torch.bfloat16, device="cuda")), "out"),
                     (dict(out=q[..., :512]), "out")):
        args = dict(q=q, kv=kv, indices=indices, sm_scale=0.1, topk_length=topk_length)
        args.update(kw)
        with pytest.raises(InvalidArgumentError) as err:
            mla_jit.flash_mla_sparse_fwd(**args)
        assert name in str(err.value), (name, str(err.value))

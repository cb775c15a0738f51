"""Inputs and the float32 reference of the sparse (DSA) decode tests and benchmark: FlashMLA's V3.2
FP8 cache records (written here from their published layout), index lists with invalid entries,
and a reference that de-quantizes the records the way FlashMLA's own tests do."""
from __future__ import annotations

import dataclasses

import torch

try:
    from .closeness import assert_cosine_close
except ImportError:  # imported top-level (bench/ puts tests/ on sys.path)
    from closeness import assert_cosine_close

RECORD_BYTES, NOPE, ROPE, GROUP = 656, 512, 64, 128
D, DV = NOPE + ROPE, 512
FP8 = torch.float8_e4m3fn
INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1


def extreme_invalid(idx, invalid_mask, counted_len, kv_tokens: int):
    """idx with its invalid entries spread over -1, -2, INT32_MIN, INT32_MAX, kv_tokens and kv_tokens +
    63 (by position), and every entry at or past counted_len (topk_length, broadcast; None: none)
    INT32_MAX or INT32_MIN: values whose address arithmetic overflows if a kernel used them."""
    pos = torch.arange(idx.shape[-1], device=idx.device).expand_as(idx)
    bad = torch.tensor([-1, -2, INT32_MIN, INT32_MAX, kv_tokens, kv_tokens + 63], device=idx.device)
    idx = torch.where(invalid_mask, bad[pos % bad.numel()], idx.long())
    if counted_len is not None:
        idx = torch.where(pos >= counted_len, torch.where(pos % 2 == 0, INT32_MAX, INT32_MIN), idx)
    return idx.int()


@dataclasses.dataclass(frozen=True)
class SparseCase:
    b: int
    s_q: int
    h_q: int
    topk: int
    s_k: int = 4096          # cache tokens per sequence (indices pick among them)
    page: int = 64
    invalid: float = 0.1     # fraction of -1 / out-of-range entries
    topk_length: bool = False
    sink: bool = False
    zero_lengths: bool = False   # some topk_length entries 0 (with topk_length)
    pow2_scales: bool = True     # FlashMLA's quantizer: ue8m0 scales (powers of two)
    extreme: bool = False        # invalid entries of extreme values (extreme_invalid)

    def __str__(self) -> str:
        flags = "".join(f"-{n}" for n in ("topk_length", "sink", "zero_lengths", "extreme") if getattr(self, n))
        return (f"b{self.b}-sq{self.s_q}-hq{self.h_q}-topk{self.topk}-sk{self.s_k}-p{self.page}{flags}"
                f"{'' if self.pow2_scales else '-f32scales'}")


def quantize_records(kv: torch.Tensor, pow2_scales: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(records (num_blocks, page, 1, 656) uint8, the de-quantized cache (num_blocks, page, 576) float32,
    each value as FlashMLA's kernels see it: e4m3 x scale rounded once to bf16, rope as bf16; the sm_80 /
    sm_89 kernel multiplies the exact e4m3 values and applies the scales to S and P, closer to the float32
    values than this, so the bounds hold for it too)."""
    num_blocks, page, _ = kv.shape
    # (a slot of gap after each page, 0xFF: NaN scales and values, which a read past a page would show)
    rec = torch.full((num_blocks, page + 1, RECORD_BYTES), 0xFF, dtype=torch.uint8, device=kv.device)[:, :page]
    deq = torch.empty((num_blocks, page, D), dtype=torch.float32, device=kv.device)
    scales = rec[..., NOPE:NOPE + 16].view(torch.float32)
    for g in range(NOPE // GROUP):
        part = kv[..., g * GROUP:(g + 1) * GROUP].float()
        scale = part.abs().amax(-1).clamp_min(1e-4) / 448.0
        if pow2_scales:
            scale = torch.exp2(torch.ceil(torch.log2(scale)))
        q8 = (part / scale[..., None]).to(FP8)
        rec[..., g * GROUP:(g + 1) * GROUP] = q8.view(torch.uint8)
        scales[..., g] = scale
        deq[..., g * GROUP:(g + 1) * GROUP] = (q8.float() * scale[..., None]).to(torch.bfloat16).float()
    rope = kv[..., NOPE:].to(torch.bfloat16)
    rec[..., NOPE + 16:] = rope.view(torch.uint8)
    deq[..., NOPE:] = rope.float()
    return rec.unsqueeze(2), deq


def make_sparse_inputs(case: SparseCase, seed: int = 0):
    """q (b, s_q, h_q, 576) bf16, records, de-quantized cache, indices (b, s_q, topk) int32 (random
    tokens of each sequence's pages, some -1 and some past the cache), topk_length (b,) or None,
    attn_sink (h_q,) or None. Records that no counted index selects are NaN."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages_per_seq = -(-case.s_k // case.page)
    num_blocks = case.b * pages_per_seq + 3
    kv = torch.randn((num_blocks, case.page, D), generator=gen, device="cuda")
    records, deq = quantize_records(kv, case.pow2_scales)
    q = torch.randn((case.b, case.s_q, case.h_q, D), generator=gen, device="cuda").to(torch.bfloat16)
    block_table = torch.randperm(num_blocks, generator=gen, device="cuda")[:case.b * pages_per_seq]
    block_table = block_table.view(case.b, pages_per_seq).int()
    pos = torch.randint(0, case.s_k, (case.b, case.s_q, case.topk), generator=gen, device="cuda")
    idx = torch.gather(block_table, 1, (pos // case.page).view(case.b, -1)).view_as(pos) * case.page + pos % case.page
    r = torch.rand(idx.shape, generator=gen, device="cuda")
    idx = torch.where(r < case.invalid / 2, -1, idx)
    idx = torch.where((r >= case.invalid / 2) & (r < case.invalid), num_blocks * case.page + (pos % 7), idx)
    indices = idx.int()
    topk_length = None
    if case.topk_length:
        topk_length = torch.randint(0, case.topk + 1, (case.b,), generator=gen, device="cuda").int()
        if not case.zero_lengths:
            topk_length.clamp_(min=1)
        else:
            topk_length[0] = 0
    if case.extreme:
        indices = extreme_invalid(indices, r < case.invalid,
                                  None if topk_length is None else topk_length.view(-1, 1, 1), num_blocks * case.page)
    attn_sink = torch.randn((case.h_q,), generator=gen, device="cuda") * 2 if case.sink else None
    # NaN in every record no counted index selects (the kernel may not read them).
    counted = _counted(indices, topk_length, num_blocks * case.page)
    used = torch.zeros(num_blocks * case.page, dtype=torch.bool, device="cuda")
    used[indices.long()[counted]] = True
    records[~used.view(num_blocks, case.page)] = 0xFF   # e4m3 NaN, NaN scales, NaN bf16 rope
    return q, records, deq, indices, topk_length, attn_sink


def _counted(indices, topk_length, kv_tokens):
    """Mask of the index entries that count: valid and within topk_length."""
    valid = (indices >= 0) & (indices < kv_tokens)
    if topk_length is not None:
        pos = torch.arange(indices.shape[-1], device=indices.device)
        valid &= pos < topk_length.view(-1, 1, 1)
    return valid


def sparse_reference(q, deq, indices, topk_length, attn_sink, scale=None):
    """(out (b, s_q, h_q, 512) float32, lse (b, h_q, s_q) float32) as FlashMLA's reference computes
    them: lse without the sink, out scaled by exp(lse) / (exp(lse) + exp(sink)), rows with no key:
    out 0, lse +inf. Also max |v| over each query token's keys (b, s_q) for the error bounds."""
    b, s_q, h_q, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    flat = deq.view(-1, D)
    counted = _counted(indices, topk_length, flat.shape[0])
    k = flat[indices.long().clamp(0, flat.shape[0] - 1)]          # (b, s_q, topk, 576)
    k = torch.where(counted[..., None], k, 0.0)
    s = torch.einsum("bshd,bstd->bsht", q.float(), k) * scale
    s = s.masked_fill(~counted[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1)                                    # (b, s_q, h_q)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.einsum("bsht,bstd->bshd", p, k[..., :DV])
    if attn_sink is not None:
        out = out / (1 + torch.exp(attn_sink.view(1, 1, h_q) - lse))[..., None]
    lonely = torch.isinf(lse)
    out[lonely] = 0.0
    lse = torch.where(lonely, float("inf"), lse)
    v_max = torch.where(counted[..., None], k[..., :DV].abs(), 0.0).amax((-1, -2))   # (b, s_q)
    return out, lse.transpose(1, 2).contiguous(), v_max


def assert_out_within(out, ref_out, v_max):
    """out (float32) against the reference: |out - ref| <= 2^-8 max|v| + 2 bf16 ulps of the reference
    (v_max broadcast to out's shape), and 1 - cos < 1e-5 (< 1e-4 for every row)."""
    ulp = torch.ldexp(torch.ones_like(ref_out), torch.frexp(ref_out).exponent - 8)
    err, bound = (out - ref_out).abs(), 2.0 ** -8 * v_max + 2 * ulp
    assert (err <= bound).all(), (f"out: {(err > bound).sum().item()} elements off, worst at "
                                  f"{(err / bound).max().item():.3g} of the bound, max abs err {err.max():.3g}")
    assert_cosine_close(out, ref_out, 1e-5, 1e-4)

"""Float32 torch reference of FlashMLA-style paged MLA decode (runs on the inputs' device)."""
import math

import torch


def _batch_scores(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal):
    """Per batch i with keys: (i, scores (h_q, s_q, L) with invisible keys -inf, v (L, h_q, dv)), in
    float32. Only the first ceil(L / page) block_table entries and tokens < L are read."""
    b, s_q, h_q, d = q.shape
    _, page, h_kv, d_k = k_cache.shape
    assert d_k == d and h_q % h_kv == 0
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    qpk = h_q // h_kv
    for i, L in enumerate(int(x) for x in cache_seqlens.tolist()):
        if L <= 0:
            continue
        nblk = (L + page - 1) // page
        blocks = block_table[i, :nblk].long()
        kv = k_cache[blocks].reshape(nblk * page, h_kv, d)[:L].float()  # (L, h_kv, d)
        k = kv.repeat_interleave(qpk, dim=1)  # (L, h_q, d): head h uses kv head h // qpk
        scores = torch.einsum("shd,lhd->hsl", q[i].float(), k) * scale  # (h_q, s_q, L)
        if causal:
            key = torch.arange(L, device=q.device).view(1, L)
            lim = (L - s_q + torch.arange(s_q, device=q.device)).view(s_q, 1)  # query s sees keys <= L - s_q + s
            scores = scores.masked_fill((key > lim).unsqueeze(0), -math.inf)
        yield i, scores, k[..., :head_dim_v]


def mla_decode_reference(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=False):
    """q (b, s_q, h_q, d); k_cache (num_blocks, page, h_kv, d); V = k_cache[..., :head_dim_v].

    Only the first ceil(L / page) block_table entries and tokens < L are read, so NaN pages and
    garbage table entries beyond the sequence never matter. Rows that see no key (L == 0, or causal
    with s_q > L) give out = 0 and lse = +inf. Causal is bottom-right aligned.
    """
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, head_dim_v, dtype=torch.float32, device=q.device)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float32, device=q.device)
    for i, scores, v in _batch_scores(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal):
        row_lse = torch.logsumexp(scores, dim=-1)  # (h_q, s_q); -inf for rows without keys
        seen = torch.isfinite(row_lse)
        p = torch.exp(scores - torch.where(seen, row_lse, torch.zeros_like(row_lse)).unsqueeze(-1))
        p = torch.where(seen.unsqueeze(-1), p, torch.zeros_like(p))
        out[i] = torch.einsum("hsl,lhd->shd", p, v)
        lse[i] = torch.where(seen, row_lse, torch.full_like(row_lse, math.inf))
    return out, lse


def fp8_p_error_terms(q, k_cache, block_table, cache_seqlens, head_dim_v, small=2.0 ** -6, softmax_scale=None,
                      causal=False):
    """The two terms of a bound on out's error when P is rounded to e4m3 (tests of the FP8 kernels),
    each (b, s_q, h_q, dv) float32 over the keys a row sees:
    - weighted: sum_j p_j |v_jc| with p the reference's softmax weights (e4m3's relative rounding of
      a normal P_j, 2^-4, times this bounds its part of the error);
    - small: sum_j [e_j < small] |v_jc| / sum_j e_j with e_j = exp(s_j - max_j s_j). A kernel whose P_j
      is relative to a reference max at most the true max has P_j >= e_j and sum_j P_j >= sum_j e_j,
      so its subnormal P_j (below 2^-6: absolute rounding 2^-10) are among these keys, and 2^-10 times
      this bounds their part of the normalized error.
    Rows that see no key give 0. Same masking and paging as mla_decode_reference."""
    b, s_q, h_q, _ = q.shape
    weighted = torch.zeros(b, s_q, h_q, head_dim_v, dtype=torch.float32, device=q.device)
    small_part = torch.zeros_like(weighted)
    for i, scores, v in _batch_scores(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal):
        v_abs = v.abs()
        row_max = scores.amax(-1, keepdim=True)
        seen = torch.isfinite(row_max)
        e = torch.where(seen, torch.exp(scores - torch.where(seen, row_max, torch.zeros_like(row_max))),
                        torch.zeros_like(scores))
        total = e.sum(-1, keepdim=True).clamp(min=1e-30)
        weighted[i] = torch.einsum("hsl,lhd->shd", e / total, v_abs)
        tiny = ((e < small) & (scores > -math.inf)).float()
        small_part[i] = torch.einsum("hsl,lhd->shd", tiny / total, v_abs)
    return weighted, small_part

"""Float32 torch reference of FlashMLA-style paged MLA decode (runs on the inputs' device)."""
import math

import torch


def mla_decode_reference(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=False):
    """q (b, s_q, h_q, d); k_cache (num_blocks, page, h_kv, d); V = k_cache[..., :head_dim_v].

    Only the first ceil(L / page) block_table entries and tokens < L are read, so NaN pages and
    garbage table entries beyond the sequence never matter. Rows that see no key (L == 0, or causal
    with s_q > L) give out = 0 and lse = +inf. Causal is bottom-right aligned.
    """
    b, s_q, h_q, d = q.shape
    _, page, h_kv, d_k = k_cache.shape
    assert d_k == d and h_q % h_kv == 0
    dv = head_dim_v
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    qpk = h_q // h_kv
    lens = [int(x) for x in cache_seqlens.tolist()]
    out = torch.zeros(b, s_q, h_q, dv, dtype=torch.float32, device=q.device)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float32, device=q.device)
    for i in range(b):
        L = lens[i]
        if L <= 0:
            continue
        nblk = (L + page - 1) // page
        blocks = block_table[i, :nblk].long()
        kv = k_cache[blocks].reshape(nblk * page, h_kv, d)[:L].float()  # (L, h_kv, d)
        k = kv.repeat_interleave(qpk, dim=1)  # (L, h_q, d): head h uses kv head h // qpk
        v = k[..., :dv]
        scores = torch.einsum("shd,lhd->hsl", q[i].float(), k) * scale  # (h_q, s_q, L)
        if causal:
            key = torch.arange(L, device=q.device).view(1, L)
            lim = (L - s_q + torch.arange(s_q, device=q.device)).view(s_q, 1)  # query s sees keys <= L - s_q + s
            scores = scores.masked_fill((key > lim).unsqueeze(0), -math.inf)
        row_lse = torch.logsumexp(scores, dim=-1)  # (h_q, s_q); -inf for rows without keys
        seen = torch.isfinite(row_lse)
        p = torch.exp(scores - torch.where(seen, row_lse, torch.zeros_like(row_lse)).unsqueeze(-1))
        p = torch.where(seen.unsqueeze(-1), p, torch.zeros_like(p))
        out[i] = torch.einsum("hsl,lhd->shd", p, v)
        lse[i] = torch.where(seen, row_lse, torch.full_like(row_lse, math.inf))
    return out, lse

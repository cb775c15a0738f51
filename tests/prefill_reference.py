"""Float32 reference of varlen attention (FlashAttention's semantics): bottom-right causal, lse
(h, total_q) natural log, rows that see no key give out 0 and lse +inf."""
import math

import torch


def prefill_reference(q, k, v, cu_q, cu_k, scale, causal, row_chunk=2048):
    """out (total_q, h, dv) float32 and lse (h, total_q) float32, computed sequence by sequence."""
    total_q, h, _ = q.shape
    h_k, dv = k.shape[1], v.shape[2]
    group = h // h_k
    out = torch.zeros(total_q, h, dv, dtype=torch.float32, device=q.device)
    lse = torch.full((h, total_q), math.inf, dtype=torch.float32, device=q.device)
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cu_q) - 1):
        q0, len_q, k0, len_k = cu_q[b], cu_q[b + 1] - cu_q[b], cu_k[b], cu_k[b + 1] - cu_k[b]
        if len_q <= 0 or len_k <= 0:
            continue
        kb = k[k0:k0 + len_k].float().repeat_interleave(group, dim=1)   # (len_k, h, d)
        vb = v[k0:k0 + len_k].float().repeat_interleave(group, dim=1)
        for r0 in range(0, len_q, row_chunk):
            r1 = min(len_q, r0 + row_chunk)
            qb = q[q0 + r0:q0 + r1].float()
            s = torch.einsum("qhd,khd->hqk", qb, kb) * scale
            if causal:
                rows = torch.arange(r0, r1, device=q.device)[:, None]
                keys = torch.arange(len_k, device=q.device)[None, :]
                s = s.masked_fill(keys > len_k - len_q + rows, -math.inf)
            m = s.amax(dim=-1, keepdim=True)
            seen = m > -math.inf
            p = torch.where(seen, torch.exp(s - torch.where(seen, m, 0)), 0)
            l = p.sum(-1, keepdim=True)
            o = torch.einsum("hqk,khd->qhd", p / torch.where(seen, l, 1), vb)
            out[q0 + r0:q0 + r1] = o
            lse[:, q0 + r0:q0 + r1] = torch.where(seen, m + torch.log(l), math.inf).squeeze(-1)
    return out, lse

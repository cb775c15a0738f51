"""Float32 torch reference of merge_attn_states (vLLM's semantics; an lse of +-inf is an empty state)."""
import math

import torch


def merge_reference(prefix, prefix_lse, suffix, suffix_lse):
    """prefix/suffix (T, h, d); lse (h, T). Returns (out float32 (T, h, d), lse float32 (h, T)); two
    empty states give 0 and -inf (vLLM's lse), and an empty state's values never reach the output."""
    p, s = prefix_lse.float().T, suffix_lse.float().T   # (T, h)
    empty_p, empty_s = torch.isinf(p), torch.isinf(s)
    both = empty_p & empty_s
    m = torch.where(empty_p, s, torch.where(empty_s, p, torch.maximum(p, s)))
    m = torch.where(both, torch.zeros_like(m), m)
    wp = torch.where(empty_p, torch.zeros_like(p), torch.exp(p - m))
    ws = torch.where(empty_s, torch.zeros_like(s), torch.exp(s - m))
    total = torch.where(both, torch.ones_like(wp), wp + ws)
    zero = torch.zeros((), device=prefix.device)
    out = (torch.where((wp > 0)[..., None], prefix.float() * (wp / total)[..., None], zero)
           + torch.where((ws > 0)[..., None], suffix.float() * (ws / total)[..., None], zero))
    lse = torch.where(both, torch.full_like(m, -math.inf), m + torch.log(total))
    return out, lse.T

"""Float32 torch references of the V3.2 indexer ops (DeepGEMM's semantics), and the input builders
the GPU tests and the benchmark share."""
from __future__ import annotations

import torch


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3 quantization (DeepGEMM's per_custom_dims_cast_to_fp8 over dim 0): values and
    float32 scales amax / 448."""
    amax = x.abs().float().amax(dim=-1).clamp(min=1e-4)
    scale = amax / 448.0
    return (x.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


def paged_cache(keys: torch.Tensor, page: int, blocks: int, block_ids: torch.Tensor, stride0: int | None = None,
                fill: int = 0x7F) -> torch.Tensor:
    """A uint8 (blocks, page, 1, D + 4) cache view whose block block_ids[i] holds keys[i * page:
    (i + 1) * page] (quantized per key, the last page zero-padded) as page x D e4m3 values then page
    float32 scales. Other blocks, and the bytes past each page when stride0 > page * (D + 4) (a
    slab), hold `fill` (0x7F: NaN in e4m3)."""
    d = keys.shape[1]
    page_bytes = page * (d + 4)
    stride0 = stride0 or page_bytes
    raw = torch.full((blocks, stride0), fill, dtype=torch.uint8, device=keys.device)
    n_pages = -(-keys.shape[0] // page)
    padded = torch.zeros(n_pages * page, d, device=keys.device)
    padded[:keys.shape[0]] = keys.float()
    values, scales = quantize_rows(padded)
    ids = block_ids[:n_pages].to(keys.device).long()
    raw[ids, :page * d] = values.view(torch.uint8).reshape(n_pages, page * d)
    raw[ids, page * d:page_bytes] = scales.reshape(n_pages, page).contiguous().view(torch.uint8)
    return raw.view(-1).as_strided((blocks, page, 1, d + 4), (stride0, d + 4, d + 4, 1))


def unpack_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float32 (blocks, page, D), scales float32 (blocks, page)) of a cache view."""
    blocks, page, _, row = kv_cache.shape
    d = row - 4
    base = kv_cache.as_strided((blocks, page * row), (kv_cache.stride(0), 1))
    values = base[:, :page * d].contiguous().view(torch.float8_e4m3fn).float().view(blocks, page, d)
    scales = base[:, page * d:].contiguous().view(torch.float32)
    return values, scales


def mqa_logits_reference(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                         ks: torch.Tensor, ke: torch.Tensor, rows_per_step: int = 64):
    """(logits, magnitude): logits float32 (m, n), -inf outside [ks, ke); magnitude
    sum_h |w_h| sum_d |q_hd k_d| (the scale of the rounding error an element may carry: the FP8
    tensor cores accumulate the products with ~2^-14 relative precision)."""
    m, n = q.shape[0], k.shape[0]
    kf = k.float() * k_scale[:, None]
    cols = torch.arange(n, device=q.device)
    logits = torch.empty(m, n, device=q.device)
    magnitude = torch.empty(m, n, device=q.device)
    for r0 in range(0, m, rows_per_step):
        qf = q[r0:r0 + rows_per_step].float()
        score = torch.einsum("mhd,nd->mhn", qf, kf).relu()
        w = weights[r0:r0 + rows_per_step, :, None]
        logits[r0:r0 + rows_per_step] = (score * w).sum(1)
        magnitude[r0:r0 + rows_per_step] = (torch.einsum("mhd,nd->mhn", qf.abs(), kf.abs()) * w.abs()).sum(1)
    seen = (cols[None] >= ks[:, None].long()) & (cols[None] < ke[:, None].long())
    return logits.masked_fill(~seen, float("-inf")), magnitude


def paged_logits_reference(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                           context_lens: torch.Tensor, block_table: torch.Tensor, max_context_len: int):
    """(logits, magnitude, limits): float32 (b * next_n, max_context_len), -inf past each row's keys;
    magnitude as mqa_logits_reference's; limits int (b * next_n,) the keys each row sees."""
    b, next_n, h, d = q.shape
    values, scales = unpack_cache(kv_cache)
    page = kv_cache.shape[1]
    rows = b * next_n
    logits = torch.full((rows, max_context_len), float("-inf"), device=q.device)
    magnitude = torch.zeros(rows, max_context_len, device=q.device)
    lens = context_lens.long().cpu()
    limits = torch.empty(rows, dtype=torch.long)
    for bi in range(b):
        for j in range(next_n):
            limits[bi * next_n + j] = lens[bi, j] if lens.dim() == 2 else lens[bi] - next_n + j + 1
        n_keys = int(max(0, int(limits[bi * next_n:(bi + 1) * next_n].max())))
        n_keys = min(n_keys, max_context_len)
        if n_keys == 0:
            continue
        pages = block_table[bi, :-(-n_keys // page)].long()
        keys = (values[pages] * scales[pages][..., None]).reshape(-1, d)[:n_keys]
        score = torch.einsum("jhd,nd->jhn", q[bi].float(), keys).relu()
        w = weights[bi * next_n:(bi + 1) * next_n, :, None]
        out = (score * w).sum(1)
        mag = (torch.einsum("jhd,nd->jhn", q[bi].float().abs(), keys.abs()) * w.abs()).sum(1)
        for j in range(next_n):
            lim = int(min(max(int(limits[bi * next_n + j]), 0), n_keys))
            logits[bi * next_n + j, :lim] = out[j, :lim]
            magnitude[bi * next_n + j, :lim] = mag[j, :lim]
    return logits, magnitude, limits


def _entry_tiles(context_lens: torch.Tensor, tile_keys: int = 64) -> list[int]:
    lens = context_lens.long().cpu()
    keys = (lens.amax(1) if lens.dim() == 2 else lens).clamp(min=0)
    return ((keys + tile_keys - 1) // tile_keys).tolist()


def expected_schedule(context_lens: torch.Tensor, num_ctas: int, tile_keys: int = 64) -> list[tuple[int, int]]:
    """Where each CTA's range of 64-key tiles starts (get_paged_mqa_logits_metadata's contract)."""
    total = sum(_entry_tiles(context_lens, tile_keys))
    q, r = divmod(total, num_ctas)
    return schedule_at(context_lens, [c * q + min(c, r) for c in range(num_ctas + 1)], tile_keys)


def schedule_at(context_lens: torch.Tensor, starts: list[int], tile_keys: int = 64) -> list[tuple[int, int]]:
    """A schedule whose CTA c starts at the starts[c]-th tile of the batch (non-decreasing; a start on
    an entry's end points at the next entry with tiles, the total at {b, 0})."""
    tiles = _entry_tiles(context_lens, tile_keys)
    out = []
    for start in starts:
        first = 0
        for bi, n in enumerate(tiles):
            if start < first + n:
                out.append((bi, start - first))
                break
            first += n
        else:
            out.append((len(tiles), 0))
    return out

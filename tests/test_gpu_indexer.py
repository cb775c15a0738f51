"""The V3.2 indexer ops on a Hopper GPU against the float32 reference (DeepGEMM's semantics), with
the Hopper kernels and the mma.sync ones (forced through MLA_JIT_ARCH): fp8_mqa_logits with ragged
and context-parallel ranges (empty ones included), clean and compressed forms, every head count and
head dim; get_paged_mqa_logits_metadata against its contract (all lengths zero included);
fp8_paged_mqa_logits for every head count, next_n 1-4, pages 32/64/128, both context_lens forms,
slab caches, NaN where nothing may read; CUDA graphs and torch.compile. Outputs are allocated by the
ops: the poisoned ones start as NaN (helpers.call_with_poisoned_outputs), so an element the kernel
should write and does not shows up."""
import pytest
import torch

import mla_jit

from .helpers import call_with_poisoned_outputs
from .indexer_reference import (expected_schedule, mqa_logits_reference, paged_cache, paged_logits_reference,
                                quantize_rows, schedule_at)

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["sm_90a", "sm_80", "sm_89"])
def family(request, monkeypatch):
    """The Hopper kernels, and the mma.sync kernels forced on this GPU through MLA_JIT_ARCH (sm_80:
    e4m3 converted to fp16, 163 KB of shared memory; sm_89: FP8 mma, 99 KB)."""
    if request.param != "sm_90a":
        monkeypatch.setenv("MLA_JIT_ARCH", request.param)
    return request.param

# Element bound |got - ref| <= _REL * magnitude + _ABS, magnitude = sum_h |w_h| sum_d |q_hd k_d|: the
# FP8 wgmma accumulates the products with ~2^-14 relative precision (DeepSeek-V3 report; DeepGEMM's
# kernels accumulate the same way), the rest is float32. And over all valid elements, a relative
# L2 error under 1e-3 (DeepGEMM's own test asks calc_diff < 1e-3, a far looser measure).
_REL, _ABS, _L2 = 2 ** -11, 1e-5, 1e-3


def _check_close(got: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor, where: torch.Tensor) -> None:
    g, r, mag = got[where], ref[where], magnitude[where]
    assert not torch.isnan(g).any(), "NaN in a valid logit"
    err = (g - r).abs()
    bound = _REL * mag + _ABS
    assert (err <= bound).all(), f"max err {err.max().item():.3e}, worst ratio {(err / bound).max().item():.2f}"
    if r.numel():
        rel = (err.norm() / r.norm().clamp(min=1e-30)).item()
        assert rel < _L2, f"relative L2 error {rel:.2e}"


def _ragged_inputs(m, n, h, d, seed, ranges="causal"):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(m, h, d, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    k, k_scale = quantize_rows(torch.randn(n, d, generator=gen, device="cuda") * 3)
    weights = torch.randn(m, h, generator=gen, device="cuda")
    if ranges == "causal":          # one sequence: row i sees keys [0, n - m + i + 1)
        ks = torch.zeros(m, dtype=torch.int32, device="cuda")
        ke = torch.arange(m, dtype=torch.int32, device="cuda") + (n - m + 1)
    elif ranges == "random":        # anything, empty ranges included
        a = torch.randint(0, n + 1, (m,), generator=gen, device="cuda")
        b = torch.randint(0, n + 1, (m,), generator=gen, device="cuda")
        ks, ke = torch.minimum(a, b).int(), torch.maximum(a, b).int()
        ke[::7] = ks[::7]           # empty
    else:                           # context parallel (DeepGEMM's test): two chunks of a rank
        half, cp = m // 2, n // m
        cp_id = cp // 3
        i = torch.arange(half, device="cuda")
        ks = torch.zeros(m, dtype=torch.int32, device="cuda")
        ke = torch.cat([cp_id * half + i, (2 * cp - 1 - cp_id) * half + i]).int()
    return q, k, k_scale, weights, ks.contiguous(), ke.contiguous()


@pytest.mark.parametrize("h", [8, 16, 32, 64])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("ranges", ["causal", "random"])
def test_mqa_logits_clean(h, d, ranges, family):
    q, k, k_scale, w, ks, ke = _ragged_inputs(301, 777, h, d, seed=h + d, ranges=ranges)
    got = call_with_poisoned_outputs(lambda: mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ke))
    ref, mag = mqa_logits_reference(q, k, k_scale, w, ks, ke)
    assert got.shape == (301, 777) and got.stride(0) == (777 + 256 + 255) // 256 * 256
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref)), "-inf outside [ks, ke) exactly"
    _check_close(got, ref, mag, ~torch.isneginf(ref))


@pytest.mark.parametrize("ranges", ["causal", "cp"])
def test_mqa_logits_large_not_cleaned(ranges, family):
    """DeepGEMM's test shapes, scaled: 2048 rows over 8192 keys, H 64, D 128, clean_logits=False."""
    q, k, k_scale, w, ks, ke = _ragged_inputs(2048, 8192, 64, 128, seed=5, ranges=ranges)
    got = mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ke, clean_logits=False)
    ref, mag = mqa_logits_reference(q, k, k_scale, w, ks, ke)
    _check_close(got, ref, mag, ~torch.isneginf(ref))


@pytest.mark.parametrize("rows", [96, 224, 352])
@pytest.mark.parametrize("ranges", ["causal", "random"])
def test_mqa_logits_keys_over_several_units(rows, ranges, family):
    """More keys than a work unit holds: q blocks cut into chunks, the clean pass's columns between
    and after the chunks' tiles. On sm_90a 96 / 224 / 352 rows over 40000 keys get units of 4096 /
    8192 / 16384 keys (logits_chunk_keys); the mma.sync kernels 4096."""
    q, k, k_scale, w, ks, ke = _ragged_inputs(rows, 40000, 64, 128, seed=11, ranges=ranges)
    got = call_with_poisoned_outputs(lambda: mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ke))
    ref, mag = mqa_logits_reference(q, k, k_scale, w, ks, ke)
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref)), "-inf outside [ks, ke) exactly"
    _check_close(got, ref, mag, ~torch.isneginf(ref))


@pytest.mark.parametrize("h", [16, 32, 64])
def test_mqa_logits_wide_dynamic_range(h, family):
    """Heads and weights spread over 2^-12 .. 2^12 with both signs, some keys near zero, a q block of
    weights near 1e-36: the Hopper kernel's q' terms (relu's linear half on the tensor cores, 64
    heads) keep the element bound."""
    q, k, k_scale, w, ks, ke = _ragged_inputs(96, 640, h, 128, seed=h, ranges="random")
    gen = torch.Generator(device="cuda").manual_seed(h + 1)
    head_scale = torch.exp2(torch.randint(-6, 4, (96, h, 1), generator=gen, device="cuda").float())
    q = (q.float() * head_scale).to(torch.float8_e4m3fn)
    w = w * torch.exp2(torch.randint(-12, 13, (96, h), generator=gen, device="cuda").float())
    w[:4] *= 1e-36   # a q' of ~1e-33: its terms' scales would overflow to inf (NaN terms) unguarded
    k_scale = k_scale.clone()
    k_scale[::5] *= 1e-6
    got = mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ke)
    ref, mag = mqa_logits_reference(q, k, k_scale, w, ks, ke)
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref))
    _check_close(got, ref, mag, ~torch.isneginf(ref))


def test_mqa_logits_compressed(family):
    q, k, k_scale, w, ks, ke = _ragged_inputs(200, 1000, 32, 128, seed=3, ranges="random")
    width = int((ke - ks).max())
    got = call_with_poisoned_outputs(lambda: mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ke, clean_logits=False,
                                                                    max_seqlen_k=width))
    ref, mag = mqa_logits_reference(q, k, k_scale, w, ks, ke)
    assert got.shape == (200, width)
    col = torch.arange(width, device="cuda")[None] + ks[:, None].long()
    valid = col < ke[:, None]
    idx = col.clamp(max=999)
    _check_close(got, torch.gather(ref, 1, idx), torch.gather(mag, 1, idx), valid)


def test_mqa_logits_never_reads_unseen_keys(family):
    """Keys no row sees hold NaN (values and scales): every valid logit stays finite, the rest -inf."""
    q, k, k_scale, w, ks, ke = _ragged_inputs(64, 2048, 64, 128, seed=9, ranges="random")
    ks.clamp_(max=1000)
    ke.clamp_(max=1000)
    k = k.clone()
    k_scale = k_scale.clone()
    k.view(torch.uint8)[1500:] = 0x7F   # NaN in e4m3
    k_scale[1500:] = float("nan")
    got = mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ke)
    ref, mag = mqa_logits_reference(q, k[:1000], k_scale[:1000], w, ks, ke)
    assert torch.isneginf(got[:, 1000:]).all()
    assert torch.equal(torch.isneginf(got[:, :1000]), torch.isneginf(ref))
    _check_close(got[:, :1000], ref, mag, ~torch.isneginf(ref))


def test_mqa_logits_edge_sizes(family):
    q, k, k_scale, w, ks, ke = _ragged_inputs(1, 1, 64, 128, seed=1, ranges="causal")
    got = mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ke)
    ref, mag = mqa_logits_reference(q, k, k_scale, w, ks, ke)
    _check_close(got, ref, mag, ~torch.isneginf(ref))
    empty = mla_jit.fp8_mqa_logits(q[:0], (k, k_scale), w[:0], ks[:0], ke[:0])
    assert empty.shape == (0, 1)
    none_seen = mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ks)
    assert torch.isneginf(none_seen).all()


# ---- paged ---------------------------------------------------------------------------------------------


def test_metadata_contract():
    for lens, ctas in (([0, 0, 0], 132), ([5000, 1, 0, 64, 129], 7), ([8192] * 64, 132), ([], 4),
                       ([[10, 200], [0, 0], [65, 64]], 3)):
        context_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        got = mla_jit.get_paged_mqa_logits_metadata(context_lens, 64, ctas)
        assert got.shape == (ctas + 1, 2) and got.dtype == torch.int32
        assert [tuple(r) for r in got.tolist()] == expected_schedule(context_lens, ctas), lens


def _paged_inputs(b, next_n, h, d, page, lens, seed, lens_2d=False, slab=False):
    """Entry i's keys in randomly placed blocks; the table padded with -1, unreferenced blocks and slab
    gaps NaN."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens = torch.tensor(lens, dtype=torch.int32)
    max_len = int(lens.max()) if len(lens) else 0
    pages_per = [-(-int(x) // page) for x in lens]
    max_blocks = max(pages_per + [1]) + 2
    blocks = sum(pages_per) + 5
    perm = torch.randperm(blocks, generator=torch.Generator().manual_seed(seed))
    table = torch.full((b, max_blocks), -1, dtype=torch.int32)
    keys = torch.randn(max(1, sum(pages_per)) * page, d, generator=gen, device="cuda") * 2
    used = 0
    for bi in range(b):
        table[bi, :pages_per[bi]] = perm[used:used + pages_per[bi]].int()
        used += pages_per[bi]
    stride0 = page * (d + 4) + (512 if slab else 0)
    cache = paged_cache(keys, page, blocks, perm[:max(1, used)], stride0)
    q = torch.randn(b, next_n, h, d, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    weights = torch.randn(b * next_n, h, generator=gen, device="cuda")
    if lens_2d:   # row j sees keys < len - next_n + j + 1, given explicitly
        context_lens = (lens[:, None] - next_n + 1 + torch.arange(next_n)[None]).clamp(min=0).int()
    else:
        context_lens = lens
    return q, cache, weights, context_lens.cuda().contiguous(), table.cuda(), max_len


def _run_paged(q, cache, weights, context_lens, table, max_context_len, clean, num_sms=132):
    schedule = mla_jit.get_paged_mqa_logits_metadata(context_lens, cache.shape[1], num_sms)
    return mla_jit.fp8_paged_mqa_logits(q, cache, weights, context_lens, table, schedule, max_context_len,
                                        clean_logits=clean)


def _check_paged(got, q, cache, weights, context_lens, table, max_context_len, clean):
    ref, mag, limits = paged_logits_reference(q, cache, weights, context_lens, table, max_context_len)
    valid = ~torch.isneginf(ref)
    _check_close(got, ref, mag, valid)
    next_n = q.shape[1]
    lens = context_lens.long().cpu()
    keys = (lens.amax(1) if lens.dim() == 2 else lens).clamp(min=0)
    computed = ((keys + 63) // 64 * 64).repeat_interleave(next_n)   # columns of the entry's tiles
    cols = torch.arange(max_context_len)[None]
    must_be_inf = (~valid.cpu()) & (cols < computed[:, None]) if not clean else ~valid.cpu()
    assert torch.isneginf(got.cpu()[must_be_inf]).all(), "-inf where the row does not see the key"


@pytest.mark.parametrize("h", [8, 16, 32, 64])
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_paged_logits_heads_and_next_n(h, next_n, family):
    lens = [1, 63, 64, 65, 300, 0, 2000, 777]
    q, cache, w, cl, table, max_len = _paged_inputs(len(lens), next_n, h, 128, 64, lens, seed=h * 10 + next_n)
    got = call_with_poisoned_outputs(lambda: _run_paged(q, cache, w, cl, table, max_len + 100, clean=True))
    assert got.shape == (len(lens) * next_n, max_len + 100)
    _check_paged(got, q, cache, w, cl, table, max_len + 100, True)


@pytest.mark.parametrize("page", [32, 64, 128])
@pytest.mark.parametrize("lens_2d", [False, True])
@pytest.mark.parametrize("slab", [False, True])
def test_paged_logits_pages_forms_slabs(page, lens_2d, slab, family):
    lens = [5, 129, 4096, 0, 1000, 64]
    q, cache, w, cl, table, max_len = _paged_inputs(len(lens), 2, 64, 128, page, lens, seed=page, lens_2d=lens_2d,
                                                    slab=slab)
    got = _run_paged(q, cache, w, cl, table, max_len, clean=False, num_sms=11)
    _check_paged(got, q, cache, w, cl, table, max_len, False)


def test_paged_logits_wide_dynamic_range(family):
    """As test_mqa_logits_wide_dynamic_range, for the paged kernel at 64 heads and next_n 2 (its q'
    terms on the tensor cores): heads and weights over 2^-12 .. 2^12 with both signs, an entry of
    weights near 1e-36, keys with tiny scales."""
    lens = [700, 64, 1500, 3]
    q, cache, w, cl, table, max_len = _paged_inputs(len(lens), 2, 64, 128, 64, lens, seed=21)
    gen = torch.Generator(device="cuda").manual_seed(22)
    head_scale = torch.exp2(torch.randint(-6, 4, (len(lens), 2, 64, 1), generator=gen, device="cuda").float())
    q = (q.float() * head_scale).to(torch.float8_e4m3fn)
    w = w * torch.exp2(torch.randint(-12, 13, w.shape, generator=gen, device="cuda").float())
    w[2:4] *= 1e-36   # entry 1: a q' of ~1e-33
    pages = cache.view(cache.shape[0], -1)
    scales = pages[:, 64 * 128:].view(torch.float32)   # each page's 64 key scales, after its values
    scales[:, ::5] *= 1e-6
    got = _run_paged(q, cache, w, cl, table, max_len, clean=True)
    _check_paged(got, q, cache, w, cl, table, max_len, True)


@pytest.mark.parametrize("page", [32, 128])
@pytest.mark.parametrize("num_sms", [1, 3])
def test_paged_logits_few_ctas_many_chunks(page, num_sms, family):
    """A CTA over several entries (a zero-length one among them) and several 32-tile chunks of each
    of its load warps' tiles: the block table read a chunk ahead, across entries."""
    lens = [5000, 0, 70, 3000, 1, 2500]
    q, cache, w, cl, table, max_len = _paged_inputs(len(lens), 2, 64, 128, page, lens, seed=31 + page)
    got = _run_paged(q, cache, w, cl, table, max_len + 64, clean=True, num_sms=num_sms)
    _check_paged(got, q, cache, w, cl, table, max_len + 64, True)


@pytest.mark.parametrize("page", [32, 64])
def test_paged_logits_uneven_schedules(page, family):
    """Schedules other than the metadata's even split (any non-decreasing cut of the tiles is valid):
    one CTA owning every tile while the others own none, ranges of random sizes with empty ones among
    them (cut inside entries and on their ends), grids of several sizes one after the other."""
    lens = [3000, 0, 129, 4500, 64, 1, 2200, 700]
    q, cache, w, cl, table, max_len = _paged_inputs(len(lens), 2, 32, 128, page, lens, seed=41 + page)
    total = sum(-(-x // 64) for x in lens)
    gen = torch.Generator().manual_seed(page)
    cuts = {"one owner": lambda r: [0] + [total] * r,
            "last owner": lambda r: [0] * r + [total],
            "random": lambda r: [0] + sorted(torch.randint(0, total + 1, (r - 1,), generator=gen).tolist()) + [total]}
    for ctas in (8, 33, 2, 132):
        for name, starts in cuts.items():
            schedule = torch.tensor(schedule_at(cl, starts(ctas)), dtype=torch.int32, device="cuda")
            got = call_with_poisoned_outputs(lambda: mla_jit.fp8_paged_mqa_logits(q, cache, w, cl, table, schedule,
                                                                                  max_len, clean_logits=True))
            _check_paged(got, q, cache, w, cl, table, max_len, True)


def test_paged_logits_head_dim_64_and_zero_lengths(family):
    q, cache, w, cl, table, max_len = _paged_inputs(4, 1, 32, 64, 64, [100, 0, 5, 64], seed=4)
    got = _run_paged(q, cache, w, cl, table, 256, clean=True)
    _check_paged(got, q, cache, w, cl, table, 256, True)
    zero = torch.zeros_like(cl)
    got = _run_paged(q, cache, w, zero, table, 256, clean=True)   # a warm-up batch: every length 0
    assert torch.isneginf(got).all()


def test_paged_logits_large_batch(family):
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(5000, 12000, (64,), generator=gen).tolist()
    q, cache, w, cl, table, max_len = _paged_inputs(64, 1, 64, 128, 64, lens, seed=0)
    got = _run_paged(q, cache, w, cl, table, max_len, clean=False)
    _check_paged(got, q, cache, w, cl, table, max_len, False)


def test_paged_logits_cuda_graph(family):
    lens = [100, 3000, 64]
    q, cache, w, cl, table, max_len = _paged_inputs(3, 2, 64, 128, 64, lens, seed=7)
    _run_paged(q, cache, w, cl, table, max_len, clean=True)   # warm: kernels loaded
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _run_paged(q, cache, w, cl, table, max_len, clean=True)
    cl.copy_(torch.tensor([50, 2000, 64], dtype=torch.int32))   # the next step's lengths (same pages)
    out.fill_(float("nan"))
    graph.replay()   # the metadata and the logits read the new lengths
    _check_paged(out, q, cache, w, cl, table, max_len, True)


def test_ops_trace_with_torch_compile():
    q, k, k_scale, w, ks, ke = _ragged_inputs(64, 500, 64, 128, seed=2, ranges="causal")
    fn = torch.compile(lambda *a: mla_jit.fp8_mqa_logits(a[0], (a[1], a[2]), *a[3:]), fullgraph=True)
    got = fn(q, k, k_scale, w, ks, ke)
    assert torch.equal(got, mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ke))
    lens = [100, 0, 700]
    pq, cache, pw, cl, table, max_len = _paged_inputs(3, 1, 64, 128, 64, lens, seed=3)

    def step(pq, cache, pw, cl, table):
        schedule = mla_jit.get_paged_mqa_logits_metadata(cl, 64, 132)
        return mla_jit.fp8_paged_mqa_logits(pq, cache, pw, cl, table, schedule, 800, clean_logits=True)

    got = torch.compile(step, fullgraph=True)(pq, cache, pw, cl, table)
    assert torch.equal(got, step(pq, cache, pw, cl, table))


def test_bad_inputs_raise_typed_errors():
    q, k, k_scale, w, ks, ke = _ragged_inputs(8, 64, 64, 128, seed=0, ranges="causal")
    with pytest.raises(mla_jit.InvalidArgumentError, match="q"):
        mla_jit.fp8_mqa_logits(q.float(), (k, k_scale), w, ks, ke)
    with pytest.raises(mla_jit.InvalidArgumentError, match="heads"):
        mla_jit.fp8_mqa_logits(q[:, :48].contiguous(), (k, k_scale), w[:, :48].contiguous(), ks, ke)
    with pytest.raises(mla_jit.InvalidArgumentError, match="kv\\[1\\]"):
        mla_jit.fp8_mqa_logits(q, (k, k_scale[:-1]), w, ks, ke)
    with pytest.raises(mla_jit.InvalidArgumentError, match="cu_seq_len_k_end"):
        mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ke.long())
    with pytest.raises(mla_jit.InvalidArgumentError, match="clean_logits"):
        mla_jit.fp8_mqa_logits(q, (k, k_scale), w, ks, ke, clean_logits=True, max_seqlen_k=10)
    pq, cache, pw, cl, table, max_len = _paged_inputs(2, 1, 64, 128, 64, [10, 20], seed=0)
    schedule = mla_jit.get_paged_mqa_logits_metadata(cl, 64, 8)
    with pytest.raises(mla_jit.InvalidArgumentError, match="kv_cache"):
        mla_jit.fp8_paged_mqa_logits(pq, cache.view(torch.int8), pw, cl, table, schedule, 64)
    with pytest.raises(mla_jit.InvalidArgumentError, match="context_lens"):
        mla_jit.fp8_paged_mqa_logits(pq, cache, pw, cl[:1], table, schedule, 64)
    with pytest.raises(mla_jit.InvalidArgumentError, match="schedule_meta"):
        mla_jit.fp8_paged_mqa_logits(pq, cache, pw, cl, table, schedule[:1], 64)
    with pytest.raises(mla_jit.InvalidArgumentError, match="q"):
        mla_jit.fp8_paged_mqa_logits(pq.expand(2, 5, 64, 128).contiguous(), cache, pw, cl, table, schedule, 64)
    with pytest.raises(mla_jit.InvalidArgumentError, match="block_kv"):
        mla_jit.get_paged_mqa_logits_metadata(cl, 48, 8)

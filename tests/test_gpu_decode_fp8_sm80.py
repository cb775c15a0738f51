"""The FP8 (e4m3) KV cache on the Ampere / Ada family (mma.sync), forced on a Hopper GPU through
MLA_JIT_ARCH: the sm_80 tuning converts e4m3 with bit arithmetic, the sm_89 tuning with the cvt
instruction (fp16 MMAs). Both paths multiply in 16 bits what the cache holds exactly:

- e4m3 q and cache (vLLM's flash_mla_with_kvcache_fp8, SGLang's call): q and K are exact in fp16,
  S = q8 . k8 exact per product and summed in fp32, P rounded to fp16 (2^-11 relative), out bf16.
  So the 16-bit path's bounds apply (test_gpu_decode_fp8_kv.assert_decode_close with bf16 out:
  P_REL 2^-8, 2 bf16 ulps, 1 - cos < 1e-5), far inside the sm_90a FP8 kernel's (P in e4m3).
- bf16 / fp16 q over the e4m3 cache: the 16-bit path as on sm_90a.

Against the float32 reference of the de-quantized inputs (q8 * descale_q, k8 * descale_k)."""
import dataclasses

import pytest
import torch

import mla_jit

from .decode_inputs import DecodeCase, case_seed, make_fp8_inputs
from .decode_reference import mla_decode_reference
from .helpers import call_with_poisoned_outputs
from .test_gpu_decode import _run
from .test_gpu_decode_fp8 import _fp8_v_max, check_graph_replay
from .test_gpu_decode_fp8_kv import _check as check_16bit_q
from .test_gpu_decode_fp8_kv import assert_decode_close

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
TUNINGS = ["sm_80", "sm_89"]


def _check_e4m3(case: DecodeCase, inputs=None):
    """One flash_mla_with_kvcache_fp8 call on the case's seeded e4m3 inputs against the reference."""
    q8, k8, block_table, lens, descale_q, descale_k = inputs or make_fp8_inputs(case, seed=case_seed(case))
    out, lse = _run(case, q8, k8, block_table, lens, descale_q=descale_q, descale_k=descale_k)
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and out.shape == (case.b, case.s_q, case.h_q, case.dv)
    q_deq, k_deq = (x.float() * (1.0 if d is None else d) for x, d in ((q8, descale_q), (k8, descale_k)))
    ref_out, ref_lse = mla_decode_reference(q_deq, k_deq, block_table, lens, case.dv, causal=case.causal)
    assert_decode_close(out, lse, ref_out, ref_lse, _fp8_v_max(k_deq, block_table, lens, case))
    return (q8, k8, block_table, lens, descale_q, descale_k), (out, lse)


def _grid(dtype) -> list[DecodeCase]:
    """Every tile shape of both tunings (rows 1-16: 16 x 16; 17-32: 32 x 16; more: sm_80's 64 x 16 with 8
    warps, sm_89's 32 x 16 with 2 landing slots), s_q 1-16 causal and not, varlen, zero lengths, pages
    16 / 64 / 256, d 576 / 512, 1-3 KV heads, odd head counts, tails of one key past a tile."""
    def case(*args, **kwargs):
        return DecodeCase(*args, **kwargs, dtype=dtype)
    return [case(2, 1, 140, 1, 1, True), case(6, 1, 4096, 16, 1, True), case(64, 1, 20, 64, 1, True),
            case(3, 1, 5000, 128), case(6, 2, 140, 128, 1, True, True), case(6, 4, 1024, 64, 1, True, True),
            case(128, 1, 1024, 16, 1, True, zero_lens=True), case(6, 2, 140, 9, 3, True, True),
            case(6, 1, 140, 128, 1, True, page=16), case(6, 2, 1024, 32, 2, True, True, page=256),
            case(6, 1, 140, 16, 1, True, d=512), case(2, 2, 1024, 128, 1, True, True, d=512),
            case(6, 16, 140, 16, 1, True, True), case(1, 1, 17, 16), case(1, 1, 65, 128)]


@pytest.mark.parametrize("tuning", TUNINGS)
@pytest.mark.parametrize("case", _grid(FP8), ids=str)
def test_e4m3_q_and_cache_match_reference(tuning, case, monkeypatch):
    monkeypatch.setenv("MLA_JIT_ARCH", tuning)
    _check_e4m3(case)


_16BIT = [DecodeCase(6, 1, 4096, 16, 1, True), DecodeCase(6, 2, 140, 128, 1, True, True),
          DecodeCase(6, 2, 1024, 32, 2, True, True, page=16), DecodeCase(128, 1, 700, 64, 1, True, zero_lens=True),
          DecodeCase(6, 2, 1024, 64, 1, True, True, dtype=torch.float16),
          DecodeCase(2, 1, 4096, 128, 1, True, dtype=torch.float16, d=512, page=256), DecodeCase(1, 1, 65, 16)]


@pytest.mark.parametrize("tuning", TUNINGS)
@pytest.mark.parametrize("case", _16BIT, ids=str)
def test_16bit_q_over_e4m3_cache_matches_reference(tuning, case, monkeypatch):
    monkeypatch.setenv("MLA_JIT_ARCH", tuning)
    check_16bit_q(case)


@pytest.mark.parametrize("tuning", [None, *TUNINGS])
@pytest.mark.parametrize("q_dtype", [FP8, torch.bfloat16, torch.float16])
def test_every_e4m3_value_converts_exactly(tuning, q_dtype, monkeypatch):
    """One key per sequence: P = 1 and out = V exactly (descales 1), so each of the 254 finite e4m3
    values (subnormals and both zeros included) must come out as itself in out's dtype. None: the
    sm_90a kernels."""
    if tuning is not None:
        monkeypatch.setenv("MLA_JIT_ARCH", tuning)
    case = DecodeCase(4, 1, 1, 16, 1, True, dtype=q_dtype)
    q8, k8, block_table, lens, _, _ = make_fp8_inputs(dataclasses.replace(case, dtype=FP8), seed=3)
    lens.fill_(1)
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    values = finite.repeat(3)[:case.dv].cuda()   # the bits of all 254, then again from the start
    for i in range(case.b):   # each sequence's only key: V = the values, rotated per sequence
        k8.view(torch.uint8)[block_table[i, 0], 0, 0, :case.dv] = values.roll(37 * i)
    q = q8 if q_dtype == FP8 else (q8.float() * 0.01).to(q_dtype)
    ones = torch.ones(1, device="cuda")
    descales = {"descale_q": ones, "descale_k": ones.clone()} if q_dtype == FP8 else {"descale_k": ones}
    if q_dtype == FP8:   # through flash_mla_with_kvcache_fp8
        out, _ = _run(case, q, k8, block_table, lens, **descales)
    else:
        metadata, num_splits = mla_jit.get_mla_metadata(lens, case.h_q, 1)
        out, _ = call_with_poisoned_outputs(lambda: mla_jit.flash_mla_with_kvcache(
            q, k8, block_table, lens, case.dv, metadata, num_splits, **descales))
    torch.cuda.synchronize()
    for i in range(case.b):
        want = values.roll(37 * i).view(FP8).float().to(out.dtype).expand(case.h_q, -1)
        assert torch.equal(out[i, 0], want), (out[i, 0] != want).nonzero()[:8]


@pytest.mark.parametrize("tuning", TUNINGS)
def test_cuda_graph_replays_with_new_lengths_and_descales(tuning, monkeypatch):
    monkeypatch.setenv("MLA_JIT_ARCH", tuning)
    case = DecodeCase(16, 2, 1024, 64, 1, True, True, dtype=FP8)
    check_graph_replay(case, *_check_e4m3(case), assert_decode_close)


def test_sglang_unit_descales_match_none(monkeypatch):
    """flash_mla_with_kvcache with e4m3 tensors and descales of ones (SGLang) = None (1.0)."""
    monkeypatch.setenv("MLA_JIT_ARCH", "sm_80")
    case = DecodeCase(6, 2, 700, 64, 1, True, True, dtype=FP8)
    q8, k8, block_table, lens, descale_q, descale_k = make_fp8_inputs(case, seed=case_seed(case))
    q_raw, k_raw = ((x.float() * d).to(FP8) for x, d in ((q8, descale_q), (k8, descale_k)))
    _, (out, lse) = _check_e4m3(case, (q_raw, k_raw, block_table, lens, None, None))
    metadata, num_splits = mla_jit.get_mla_metadata(lens, case.s_q * case.h_q, 1)
    ones = torch.ones(1, device="cuda")
    sglang = mla_jit.flash_mla_with_kvcache(q_raw, k_raw, block_table, lens, case.dv, metadata, num_splits,
                                            causal=True, descale_q=ones, descale_k=ones)
    torch.cuda.synchronize()
    assert torch.equal(sglang[0], out) and torch.equal(sglang[1], lse)

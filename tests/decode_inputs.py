"""Inputs for decode tests and benchmarks, following FlashMLA's own test recipe."""
from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeCase:
    b: int
    s_q: int
    s_k: int
    h_q: int
    h_kv: int = 1
    varlen: bool = False
    causal: bool = False
    page: int = 64
    dtype: torch.dtype = torch.bfloat16
    d: int = 576
    dv: int = 512
    zero_lens: bool = False  # make some sequences empty
    short_lens: bool = False  # make some sequences shorter than s_q (causal: their first rows see no key)

    def __str__(self) -> str:
        return (f"b{self.b}-sq{self.s_q}-sk{self.s_k}-hq{self.h_q}-hkv{self.h_kv}-{'var' if self.varlen else 'fix'}"
                f"-c{int(self.causal)}-p{self.page}-{str(self.dtype)[6:]}-d{self.d}{'-zeros' if self.zero_lens else ''}"
                f"{'-short' if self.short_lens else ''}")


def case_seed(case) -> int:
    """A seed fixed by a case's name (str hashes change from one process to the next)."""
    return zlib.crc32(str(case).encode()) % 1000


# q's gain over k: with k ~ N(0, 0.1^2) (clamped to [-1, 1]) and q ~ Q_GAIN * N(0, 0.1^2), the logits
# q . k / sqrt(576) have a standard deviation of ~1, as in FlashMLA's tests (q and k ~ N(0, 1)). At gain 1
# they had ~0.01: attention nearly uniform, which hides a wrong S (a dropped rope part, a wrong key).
Q_GAIN = 100.0


def make_inputs(case: DecodeCase, seed: int = 0, poison: bool = True, q_gain: float = Q_GAIN):
    """q, k_cache, block_table, cache_seqlens. With poison: NaN in every cache slot past each
    sequence's end (and in unused pages), garbage in the block table past each sequence. With
    case.short_lens, every third sequence (from the second) has 1 .. s_q - 1 tokens."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dev = "cuda"
    if case.varlen:
        lens = torch.normal(float(case.s_k), case.s_k / 2, (case.b,), generator=gen)
        lens = lens.clamp(min=case.s_q).round().to(torch.int32)
    else:
        lens = torch.full((case.b,), case.s_k, dtype=torch.int32)
    if case.zero_lens:
        lens[::3] = 0
    if case.short_lens and case.s_q > 1:
        short = lens[1::3]
        lens[1::3] = torch.randint(1, case.s_q, short.shape, generator=gen, dtype=torch.int32)
    max_len = max(int(lens.max()), 1)
    max_blocks = math.ceil(max_len / 256) * 256 // case.page
    num_blocks = case.b * max_blocks
    block_table = torch.randperm(num_blocks, generator=gen).view(case.b, max_blocks).to(torch.int32)
    q = (torch.randn(case.b, case.s_q, case.h_q, case.d, generator=gen) * 0.1).clamp(-1, 1) * q_gain
    k_cache = (torch.randn(num_blocks, case.page, case.h_kv, case.d, generator=gen) * 0.1).clamp(-1, 1)
    if poison:
        flat = k_cache.view(num_blocks * case.page, case.h_kv, case.d)
        positions = torch.arange(max_blocks * case.page)
        for i in range(case.b):
            unused = positions[positions >= int(lens[i])]
            phys = block_table[i, unused // case.page].long() * case.page + unused % case.page
            flat[phys] = float("nan")
            used_blocks = math.ceil(int(lens[i]) / case.page)
            tail = block_table[i, used_blocks:]
            block_table[i, used_blocks:] = torch.where(torch.arange(tail.numel()) % 2 == 0,
                                                       torch.full_like(tail, 2 ** 30), torch.full_like(tail, -7))
    return (q.to(case.dtype).to(dev), k_cache.to(case.dtype).to(dev), block_table.to(dev), lens.to(dev))


E4M3_MAX = 448.0   # the largest finite float8_e4m3fn
E4M3_NAN = 0x7F    # an e4m3 NaN's bits (torch.float8_e4m3fn has no infinities)


def make_fp8_inputs(case: DecodeCase, seed: int = 0, q_gain: float = Q_GAIN):
    """q8, k8, block_table, cache_seqlens, descale_q, descale_k: make_inputs' data (NaN slots and
    garbage table entries included) quantized to e4m3 as an engine does, with per-tensor scales
    amax / 448 (the whole e4m3 range in use; descales far from 1, so a descale left out fails).
    q_gain: make_inputs' (logits of std ~1)."""
    q, k_cache, block_table, lens = make_inputs(dataclasses.replace(case, dtype=torch.float32), seed, q_gain=q_gain)
    nan = torch.isnan(k_cache)
    k_cache = k_cache.nan_to_num(0.0)
    descale_q, descale_k = (x.abs().amax().reshape(1) / E4M3_MAX for x in (q, k_cache))
    q8 = (q / descale_q).to(torch.float8_e4m3fn)
    k8 = (k_cache / descale_k).to(torch.float8_e4m3fn)
    k8.view(torch.uint8)[nan] = E4M3_NAN
    return q8, k8, block_table, lens, descale_q, descale_k


def env_grid_ids(grid) -> list[str]:
    """Test ids of a (case, api, env) grid: the case, the schedule API and the env values ("auto": none)."""
    return [f"{case}-{api}-{'-'.join(env.values()) or 'auto'}" for case, api, env in grid]


def set_env(monkeypatch, env: dict) -> None:
    """A grid row's env vars, for the test's duration."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)


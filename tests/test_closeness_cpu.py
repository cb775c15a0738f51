"""The GPU tests' cosine check (tests/closeness.py) on the CPU: it must fail on one wrong row that
the whole-tensor cosine dilutes, and pass on rounding-sized errors and rows without keys."""
import pytest
import torch

from .closeness import assert_cosine_close


def _rows(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(4, 2, 64, 512, generator=gen)
    ref[1, 0, 5] = 0.0   # a row without keys: out exactly 0 there, skipped by the per-row check
    return ref, gen


def test_rounding_sized_errors_pass():
    ref, gen = _rows()
    out = ref * (1 + 2.0 ** -9 * torch.randn(ref.shape, generator=gen))
    assert_cosine_close(out, ref, 5e-6, 1e-4)


def test_one_wrong_row_fails_the_row_bound_only():
    ref, _ = _rows()
    out = ref.clone()
    out[2, 1, 7] = ref[2, 1, 8]   # another head's output in one row of 512
    assert_cosine_close(out, ref, 5e-3, 2.0)   # the whole tensor barely moves (1 - cos is at most 2)
    with pytest.raises(AssertionError, match="a row's cosine difference"):
        assert_cosine_close(out, ref, 5e-3, 1e-4)


def test_whole_tensor_bound_fails():
    ref, gen = _rows()
    out = ref + 0.1 * torch.randn(ref.shape, generator=gen)
    with pytest.raises(AssertionError, match="^cosine difference"):
        assert_cosine_close(out, ref, 1e-4, 2.0)

"""The sm_90a warp-specialized decode kernels' variants on a Hopper GPU against the float32 reference:
the split merge in the kernel or in the combine kernel, compact rows, tile edges and clusters of
row tiles (the shared grid and helpers are test_gpu_decode.py's)."""
import pytest
import torch

import mla_jit

from .decode_inputs import DecodeCase, case_seed, make_inputs
from .decode_reference import mla_decode_reference
from .helpers import call_with_poisoned_outputs
from .test_gpu_decode import _check_case, assert_decode_close

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("schedule", ["ws", "ws_unfused"])
@pytest.mark.parametrize("case", [DecodeCase(6, 2, 4096, 64, 1, True, True), DecodeCase(64, 1, 140, 128, 1, True, False),
                                  DecodeCase(128, 1, 4096, 16, 1, True, False, zero_lens=True),
                                  DecodeCase(2, 4, 16384, 128, 1, True, True, page=16),
                                  DecodeCase(4, 1, 8192, 63, 1, True, False, zero_lens=True)], ids=str)
def test_ws_schedule_with_and_without_fused_combine(schedule, case, monkeypatch):
    """The ws kernel forced to merge the splits itself (ws) or to leave them to the combine kernel
    (ws_unfused), whatever the "auto" choice for the shape would be."""
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", schedule)
    _check_case(case)


@pytest.mark.parametrize("schedule", ["ws", "ws_unfused"])
@pytest.mark.parametrize("case", [DecodeCase(2, 1, 9000, 32, 1, True), DecodeCase(2, 2, 9000, 16, 1, True, True),
                                  DecodeCase(6, 2, 140, 32, 2, True, True, dtype=torch.float16),
                                  DecodeCase(5, 3, 4096, 9, 1, True, True, d=512),
                                  DecodeCase(3, 1, 300, 12, 1, True, False, page=16)], ids=str)
def test_compact_rows_match_reference(schedule, case, monkeypatch):
    """At most 32 query rows a KV head: the compact-rows kernels (query row r in tile row
    16 (r / 8) + r % 8), with 9 .. 32 rows so that rows leave the first warp; causal and not, bf16
    and fp16, d 576 and 512, splits merged by the kernel (ws) or by the combine kernel."""
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", schedule)
    _check_case(case)


# Sequence ends at every offset around the half- and whole-tile marks, and the loop's piece changes.
_TILE_EDGE_CASES = ([DecodeCase(1, 1, s_k, 16) for s_k in (1, 31, 32, 33, 63, 64, 65, 129)]
                  + [DecodeCase(6, 2, 4096, 64, 1, True, True), DecodeCase(2, 4, 16384, 128, 1, True, True, page=16),
                     DecodeCase(4, 1, 8192, 63, 1, True, False, zero_lens=True),
                     DecodeCase(6, 4, 140, 9, 1, True, True, page=256),
                     DecodeCase(6, 2, 140, 64, 1, True, True, dtype=torch.float16),
                     DecodeCase(2, 2, 4096, 128, 2, True, True, d=512),
                     DecodeCase(1024, 4, 64, 128, 1, True, True)])


@pytest.mark.parametrize("schedule", ["ws", "ws_unfused"])
@pytest.mark.parametrize("case", _TILE_EDGE_CASES, ids=str)
def test_ws_tile_edges_match_reference(schedule, case, monkeypatch):
    """The ws kernels at tails that end anywhere in a tile, masks, causal, page sizes, fp16,
    d = 512 and the largest batch (the tail zeroing and piece changes sit on S's issue path)."""
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", schedule)
    _check_case(case)


# Row tiles 2, 4 and 8 (grid z), two KV heads, zero lengths, page 16 / 256, d = 512.
_CLUSTER_CASES = [DecodeCase(6, 2, 4096, 64, 1, True, True), DecodeCase(2, 4, 16384, 128, 1, True, True, page=16),
                  DecodeCase(2, 2, 4096, 128, 2, True, True, d=512), DecodeCase(1024, 4, 64, 128, 1, True, True),
                  DecodeCase(128, 2, 140, 128, 1, True, True, zero_lens=True),
                  DecodeCase(6, 1, 140, 128, 1, True, False, page=256), DecodeCase(3, 1, 5000, 128, 1, False, False)]


@pytest.mark.parametrize("cluster", ["1", "2"])
@pytest.mark.parametrize("schedule", ["ws", "ws_unfused"])
@pytest.mark.parametrize("case", _CLUSTER_CASES, ids=str)
def test_ws_clusters_match_reference(cluster, schedule, case, monkeypatch):
    """The ws kernels with the row tiles of a KV head alone or in clusters of 2 (each KV tile
    multicast to the pair; a stage refilled once both CTAs are done with it)."""
    monkeypatch.setenv("MLA_JIT_SM90_DECODE_SCHEDULE", schedule)
    monkeypatch.setenv("MLA_JIT_SM90_CLUSTER", cluster)
    _check_case(case)


@pytest.mark.parametrize("cluster,want", [("2", (1, 1, 2)), ("1", None)])
def test_clustered_launch_is_used_where_asked(cluster, want, monkeypatch):
    """The plan of this very call launches clusters of 2 when asked: every cluster of the one-wave
    grid is resident on an H100 / H200 (66 clusters of 2 on 132 SMs), so there is no fallback."""
    from mla_jit.ops import decode as op
    from mla_jit.runtimes import decode_plan
    monkeypatch.setenv("MLA_JIT_SM90_CLUSTER", cluster)
    case = DecodeCase(5, 1, 3000, 128, 1, True, False)  # 2 row tiles
    q, k_cache, block_table, lens = make_inputs(case, seed=case_seed(case))
    metadata, num_splits = mla_jit.get_mla_metadata(lens, case.s_q * case.h_q // case.h_kv, case.h_kv)
    out, lse = call_with_poisoned_outputs(lambda: mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens,
                                                                                 case.dv, metadata, num_splits))
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, lens, case.dv)
    assert_decode_close(out, lse, ref_out, ref_lse)
    signature = op._signature(q, k_cache, block_table, lens, case.dv, metadata, num_splits)
    assert decode_plan.decode_plans[signature].splitkv.cluster == want



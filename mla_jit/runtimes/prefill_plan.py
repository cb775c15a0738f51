"""Launch plans of the varlen attention prefill (flash_attn_varlen_func): the kernel for a layout
(head dims, heads, dtype, causal, device), its shared memory and launch, and the TMA descriptors of
q, k and v (memoized by pointer and layout: engines reuse their buffers call after call).

The op layer (ops/prefill.py) validates arguments and asks for a plan; the plan enqueues calls.
"""
from __future__ import annotations


import torch

from ..configs.prefill import SM90_TUNINGS, prefill_config, sm80_prefill_config
from ..dtypes import name_of
from ..jit import env, tma
from ..jit.arch import resolve_for_device
from ..jit.launch import TMA_DESC, Blob
from ..jit.loader import read_global_int32
from ..jit.stream import current_stream
from .device import l2_bytes as _l2_bytes, num_sms as _num_sms
from . import registry
from .prefill import PREFILL_PARAMS

_LOG2E = 1.4426950408889634
MAX_PLANS = 1024
MAX_DESCRIPTORS = 4096
plans: dict[tuple, "PrefillPlan"] = {}       # layout signature (no token counts) -> plan
_descriptors: dict[tuple, tma.TmaDescriptor] = {}
# The variable that picks a kernel: part of the plan key (read raw on the warm path).
plan_env = env.raw_reader("MLA_JIT_ARCH")


def reset() -> None:
    """Forget every plan and descriptor (tests use this, with registry.reset_all, to act as a new process)."""
    plans.clear()
    _descriptors.clear()


def descriptor(t: torch.Tensor, box_rows: int) -> tma.TmaDescriptor:
    """TMA descriptor of a (tokens, heads, d) tensor with boxes of {64 columns, 1 head, box_rows tokens}
    and the 128B swizzle; memoized by pointer, shape and strides."""
    key = (t.data_ptr(), t.shape, t.stride(), t.dtype, box_rows)
    desc = _descriptors.get(key)
    if desc is None:
        if len(_descriptors) >= MAX_DESCRIPTORS:   # callers with ever-new buffers: keep the memo bounded
            _descriptors.clear()
        desc = _descriptors[key] = tma.tiled(t, (box_rows, 1, 64), swizzle=128, l2_promotion=128)
    return desc


class PrefillPlan:
    """What a layout needs beyond its lengths and pointers: the kernel, its launch and the sizes."""

    __slots__ = ("cfg", "launch", "device_index", "num_heads", "q_per_kv", "head_dim_v", "block_m", "block_n",
                 "kv_row_bytes", "l2_budget", "tma")

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool):
        self.device_index = q.get_device()
        arch = resolve_for_device(self.device_index)
        self.num_heads = q.shape[1]
        self.q_per_kv = q.shape[1] // k.shape[1]
        self.head_dim_v = v.shape[2]
        shape = (name_of(q.dtype), q.shape[2], v.shape[2], bool(causal))
        # Hopper: the TMA + wgmma kernel (q, k, v through descriptors); Ampere/Ada: mma.sync.
        self.tma = arch.tuning.name in SM90_TUNINGS
        if self.tma:
            self.cfg = prefill_config(*shape, arch.tuning)
            family = registry.get("prefill_sm90")
            params = (Blob(PREFILL_PARAMS.size), TMA_DESC, TMA_DESC, TMA_DESC)
            threads = 128 * (1 + self.cfg.block_m // 64)
        else:
            self.cfg = sm80_prefill_config(*shape, arch.tuning)
            family = registry.get("prefill_sm80")
            params = (Blob(PREFILL_PARAMS.size),)
            threads = 32 * self.cfg.block_m // 16
        self.block_m, self.block_n = self.cfg.block_m, self.cfg.block_n
        self.kv_row_bytes = (k.shape[2] + v.shape[2]) * k.element_size()   # one token of one KV head
        self.l2_budget = _l2_bytes(self.device_index) // 2
        smem = read_global_int32(family.binary(self.cfg, arch), f"{family.ENTRY}_smem_bytes", self.device_index)
        self.launch = family.launcher(self.cfg, arch, family.ENTRY, self.device_index, params, (1, 1, 1),
                                      (threads, 1, 1), dynamic_smem=smem)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
            cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, out: torch.Tensor,
            lse: torch.Tensor | None, scale: float) -> None:
        """Enqueue the call on the current stream (arguments validated by the op)."""
        b = cu_seqlens_q.shape[0] - 1
        total_q = q.shape[0]
        # Row tiles of the longest sequence (FlashAttention's contract: max_seqlen_q bounds every
        # sequence); never more than the tokens there are.
        m_blocks = -(-min(max_seqlen_q, total_q) // self.block_m)
        if b == 0 or m_blocks == 0 or self.num_heads == 0:
            return
        # Heads whose K / V (of the longest sequence) share half the L2: the tile order's sections.
        kv_head_bytes = max(1, min(max_seqlen_k, k.shape[0]) * self.kv_row_bytes)
        section = min(self.num_heads, max(1, self.l2_budget // kv_head_bytes) * self.q_per_kv)
        # sm_90a's dynamic tile scheduler: {next tile, CTAs done}, zero at launch (the kernel zeroes it
        # again at its end, but a counter per call keeps concurrent calls on other streams apart).
        counter = torch.zeros(2, dtype=torch.int32, device=q.device) if self.tma else None
        params = PREFILL_PARAMS.pack(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), *q.stride()[:2], *k.stride()[:2], *v.stride()[:2],
            out.data_ptr(), 0 if lse is None else lse.data_ptr(), cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(),
            out.stride(0), out.stride(1), b, self.num_heads, self.q_per_kv, total_q, m_blocks,
            scale * _LOG2E, scale, section, 0 if counter is None else counter.data_ptr())
        stream = current_stream(self.device_index)
        if not self.tma:
            self.launch(stream, params, grid=(m_blocks * self.num_heads, b, 1))
            return
        # Persistent: one CTA an SM (fewer when there are fewer tiles), each striding over the tiles.
        grid = (min(b * m_blocks * self.num_heads, _num_sms(self.device_index)), 1, 1)
        q_desc = descriptor(q, 64)
        if k.shape[0] == 0:   # no keys at all: no tile is loaded, but a descriptor needs a non-empty tensor
            k_desc = v_desc = q_desc
        else:
            k_desc, v_desc = descriptor(k, self.block_n), descriptor(v, self.block_n)
        self.launch(stream, params, q_desc, k_desc, v_desc, grid=grid)
        del counter   # (graph capture) freed only now: later captured work may reuse the block

"""mla_jit: JIT-compiled DeepSeek-style MLA kernels.

Importing the package has no side effects and does not import torch: no directory is created and
no GPU is touched until an op is used. The ops (and their torch.library registrations in the
`mla_jit` namespace) load on first access, so the `mla-jit` CLI starts fast.
"""
from __future__ import annotations

import importlib

from .errors import (CacheError, CompileError, ConfigError, ConfigSpecError, FeatureNotAvailableError,
                     InvalidArgumentError, KernelNotWarmError, LaunchError, MlaJitError, OfflineCacheMissError,
                     UnsupportedArchError)

__version__ = "0.1.0"

# Public op -> the module defining it (each op module registers its torch.library ops on import).
_OPS = {
    "get_mla_metadata": ".ops.decode",
    "flash_mla_with_kvcache": ".ops.decode",
    "flash_mla_with_kvcache_fp8": ".ops.decode",
    "FlashMLASchedMeta": ".ops.decode",
    "flash_mla_sparse_fwd": ".ops.sparse_prefill",
    "merge_attn_states": ".ops.merge",
    "flash_attn_varlen_func": ".ops.prefill",
    "fp8_mqa_logits": ".ops.indexer",
    "get_paged_mqa_logits_metadata": ".ops.indexer",
    "fp8_paged_mqa_logits": ".ops.indexer",
    "release_workspaces": ".runtimes.workspace",
}
# The public ops that are torch custom ops (torch.ops.mla_jit.<name>), each with a fake implementation.
TORCH_OPS = ("get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd", "merge_attn_states",
             "flash_attn_varlen_func", "fp8_mqa_logits", "get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits")
# Public ops that are another public op under a peer's name and signature: they call its torch op.
TORCH_OP_ALIASES = {"flash_mla_with_kvcache_fp8": "flash_mla_with_kvcache"}

__all__ = [
    *_OPS,
    "MlaJitError", "InvalidArgumentError", "UnsupportedArchError", "CompileError", "CacheError",
    "OfflineCacheMissError", "KernelNotWarmError", "LaunchError", "ConfigError", "ConfigSpecError",
    "FeatureNotAvailableError",
]


def __getattr__(name: str):
    module = _OPS.get(name)
    if module is None:
        raise AttributeError(f"module 'mla_jit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_OPS))

"""mla_jit: JIT-compiled DeepSeek-style MLA kernels.

Importing the package has no side effects: no directory is created and no GPU is touched
until an op is called.
"""
from .errors import (CacheError, CompileError, InvalidArgumentError, KernelNotWarmError, LaunchError,
                     MlaJitError, OfflineCacheMissError, UnsupportedArchError)
from .ops.decode import flash_mla_with_kvcache, get_mla_metadata
from .ops.workspace import release_workspaces

__version__ = "0.1.0"

__all__ = [
    "get_mla_metadata", "flash_mla_with_kvcache", "release_workspaces",
    "MlaJitError", "InvalidArgumentError", "UnsupportedArchError", "CompileError", "CacheError",
    "OfflineCacheMissError", "KernelNotWarmError", "LaunchError",
]

"""mla_jit: JIT-compiled DeepSeek-style MLA kernels.

Importing the package has no side effects: no directory is created and no GPU is touched
until an op is called.
"""
from .errors import (CacheError, CompileError, InvalidArgumentError, KernelNotWarmError, LaunchError,
                     MlaJitError, OfflineCacheMissError, UnsupportedArchError)

__version__ = "0.1.0"

__all__ = [
    "MlaJitError", "InvalidArgumentError", "UnsupportedArchError", "CompileError", "CacheError",
    "OfflineCacheMissError", "KernelNotWarmError", "LaunchError",
]

"""Typed exceptions. Every user-facing failure of mla_jit raises one of these."""
from __future__ import annotations

from pathlib import Path


class MlaJitError(RuntimeError):
    """Base class of every mla_jit error."""


class InvalidArgumentError(MlaJitError, ValueError):
    """An op argument has the wrong dtype, shape, device or layout.

    Raised before any kernel runs; the message names the argument and what was expected.
    """

    def __init__(self, argument: str, expected: str, got: str):
        self.argument = argument
        self.expected = expected
        self.got = got
        super().__init__(f"{argument}: expected {expected}, got {got}")


class ConfigError(MlaJitError):
    """An MLA_JIT_* environment variable has a value mla_jit does not accept (the message names it)."""


class FeatureNotAvailableError(MlaJitError, NotImplementedError):
    """An argument asks for a feature of the peer's API that mla_jit does not serve yet."""

    def __init__(self, argument: str, feature: str):
        self.argument = argument
        self.feature = feature
        super().__init__(f"{argument}: {feature} is not available in mla_jit yet")


class ConfigSpecError(MlaJitError, ValueError):
    """A `FAMILY:field=value,...` kernel spec (`mla-jit prewarm --config`) is malformed or describes a
    config its family rejects; the message names the field and the values it accepts."""


class UnsupportedArchError(MlaJitError):
    """No kernel family serves the requested GPU architecture."""


class CompileError(MlaJitError):
    """The CUDA compiler rejected a generated source. Carries the full log and the source path."""

    def __init__(self, kernel: str, compiler: str, log: str, source_path: Path | None,
                 command: str | None = None):
        self.kernel = kernel
        self.compiler = compiler
        self.log = log
        self.source_path = source_path
        self.command = command
        where = f"\ngenerated source: {source_path}" if source_path else ""
        cmd = f"\ncommand: {command}" if command else ""
        super().__init__(f"{compiler} failed to compile {kernel}{where}{cmd}\n{log}")


class CacheError(MlaJitError):
    """The kernel cache could not be read or written (lock timeout, I/O failure)."""


class OfflineCacheMissError(CacheError):
    """Offline mode is on and the requested kernel is not in any cache root."""

    def __init__(self, kernel: str, key: str, arch: str, prewarm_command: str, roots: tuple[str, ...] = ()):
        self.kernel = kernel
        self.key = key
        self.arch = arch
        self.prewarm_command = prewarm_command
        self.roots = tuple(str(r) for r in roots)   # the cache roots searched, in order
        searched = (f"searched {', '.join(self.roots)}" if self.roots
                    else "no cache root searched: MLA_JIT_DISABLE_CACHE=1")
        super().__init__(
            f"MLA_JIT_OFFLINE=1 and kernel {kernel} (key {key}, arch {arch}) is not in the cache ({searched}); "
            f"build it on a machine that may compile with:\n    {prewarm_command}")


class KernelNotWarmError(MlaJitError):
    """A kernel would have to be compiled or loaded while a CUDA graph is being captured."""


class LaunchError(MlaJitError):
    """A CUDA driver call failed while loading or launching a kernel."""

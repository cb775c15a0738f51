"""CUDA compilers: NVRTC (default, in-process) and nvcc (subprocess). Same flag semantics.

A compiler turns one rendered translation unit into a cubin for one target arch. Kernel entry
points are `extern "C"` (see templates/), so both compilers give the same symbol names.
`key_flags()` lists what changes the binary and holds no filesystem path, so the cache key
survives a relocated install.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from ..errors import CompileError, ConfigError, MlaJitError
from ..log import logger
from . import env
from .arch import Arch
from .paths import include_dirs

# Flags shared by both compilers (language level and semantics; no paths).
_COMMON_FLAGS = ("-std=c++17", "-DNDEBUG")


@dataclass(frozen=True)
class CompileResult:
    cubin: bytes
    log: str
    command: str
    seconds: float


class Compiler(ABC):
    name: str

    @abstractmethod
    def identity(self) -> str:
        """Compiler name and exact version: part of every cache key."""

    @abstractmethod
    def _arch_flags(self, arch: Arch) -> list[str]: ...

    def key_flags(self, arch: Arch) -> tuple[str, ...]:
        flags = [*_COMMON_FLAGS, *self._arch_flags(arch)]
        if env.lineinfo():
            flags.append("-lineinfo")
        if env.trace():
            flags.append("-DMLA_JIT_TRACE=1")
        return tuple(flags)

    def _verbose_flags(self) -> list[str]:
        return ["-Xptxas=-v"] if env.ptxas_verbose() else []

    @abstractmethod
    def compile(self, source: str, name: str, arch: Arch, source_path: Path | None) -> CompileResult:
        """Compile `source`; raise CompileError with the full log on failure."""


class NvrtcCompiler(Compiler):
    name = "nvrtc"

    @staticmethod
    def _check(result, what: str):
        from cuda.bindings import nvrtc
        err = result[0]
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise MlaJitError(f"{what} failed: {nvrtc.nvrtcGetErrorString(err)[1].decode()}")
        return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)

    @functools.lru_cache(maxsize=1)
    def identity(self) -> str:
        from cuda.bindings import nvrtc
        major, minor = self._check(nvrtc.nvrtcVersion(), "nvrtcVersion")
        return f"nvrtc-{major}.{minor}"

    def _arch_flags(self, arch: Arch) -> list[str]:
        # -default-device: CUTLASS helpers lack __device__ annotations under NVRTC.
        return [f"--gpu-architecture={arch.name}", "-default-device"]

    def compile(self, source: str, name: str, arch: Arch, source_path: Path | None) -> CompileResult:
        from cuda.bindings import nvrtc
        options = [*self.key_flags(arch), *self._verbose_flags(), *(f"-I{d}" for d in include_dirs(True))]
        command = f"nvrtc {' '.join(shlex.quote(o) for o in options)} {name}.cu"
        logger.debug("compiling %s: %s", name, command)
        start = time.perf_counter()
        prog = self._check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []),
                           "nvrtcCreateProgram")
        try:
            opts = [o.encode() for o in options]
            (status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
            log_size = self._check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            # Output buffers are bytearrays: NVRTC writes into them, and `b" " * 1` would be CPython's
            # shared one-byte object (an empty log has size 1), which every later b" " would then see
            # as b"\x00" (print's separators turned into NULs).
            log_buf = bytearray(log_size)
            self._check((nvrtc.nvrtcGetProgramLog(prog, log_buf)[0], None), "nvrtcGetProgramLog")
            log = bytes(log_buf).rstrip(b"\x00 ").decode(errors="replace")
            if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                raise CompileError(name, "nvrtc", log, source_path, command)
            size = self._check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            cubin_buf = bytearray(size)
            self._check((nvrtc.nvrtcGetCUBIN(prog, cubin_buf)[0], None), "nvrtcGetCUBIN")
            cubin = bytes(cubin_buf)
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
        return CompileResult(cubin, log, command, time.perf_counter() - start)


class NvccCompiler(Compiler):
    name = "nvcc"

    # Looked at last, after MLA_JIT_NVCC, $CUDA_HOME / $CUDA_PATH and PATH.
    SYSTEM_CUDA_HOMES: tuple[str, ...] = ("/usr/local/cuda",)

    def candidates(self) -> list[str]:
        """Where nvcc is looked for, in order (MLA_JIT_NVCC alone when it is set)."""
        explicit = env.nvcc_path()
        if explicit:
            return [explicit]
        out = []
        for var in ("CUDA_HOME", "CUDA_PATH"):
            if os.environ.get(var):
                out.append(str(Path(os.environ[var]) / "bin" / "nvcc"))
        if (on_path := shutil.which("nvcc")):
            out.append(on_path)
        out += [str(Path(home) / "bin" / "nvcc") for home in self.SYSTEM_CUDA_HOMES]
        return out

    def executable(self) -> str:
        """Path of nvcc (looked up on each call: the environment may change)."""
        candidates = self.candidates()
        for candidate in candidates:
            if Path(candidate).is_file() and os.access(candidate, os.X_OK):
                return candidate
        if env.nvcc_path():
            raise ConfigError(f"MLA_JIT_NVCC={env.nvcc_path()!r} is not an executable file")
        raise MlaJitError(f"nvcc not found (looked for {', '.join(candidates)}): set MLA_JIT_NVCC or CUDA_HOME, "
                          "or use MLA_JIT_COMPILER=nvrtc")

    def identity(self) -> str:
        return _nvcc_identity(self.executable())

    def _arch_flags(self, arch: Arch) -> list[str]:
        code = arch.name
        return [f"-gencode=arch={code.replace('sm_', 'compute_')},code={code}", "-O3", "--expt-relaxed-constexpr"]

    def compile(self, source: str, name: str, arch: Arch, source_path: Path | None) -> CompileResult:
        keep = env.debug()
        workdir = Path(tempfile.mkdtemp(prefix=f"mla_jit-nvcc-{name[:40]}-"))
        try:
            src = workdir / f"{name}.cu"
            src.write_text(source)
            out = workdir / f"{name}.cubin"
            args = [self.executable(), "-cubin", *self.key_flags(arch), *self._verbose_flags(),
                    *(f"-I{d}" for d in include_dirs(False)), "-o", str(out), str(src)]
            command = " ".join(shlex.quote(a) for a in args)
            logger.debug("compiling %s: %s", name, command)
            start = time.perf_counter()
            proc = subprocess.run(args, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            log = (proc.stdout + proc.stderr).strip()
            if proc.returncode != 0 or not out.is_file():
                raise CompileError(name, "nvcc", log, source_path or src, command)
            return CompileResult(out.read_bytes(), log, command, seconds)
        finally:
            if keep:
                logger.debug("kept nvcc scratch dir %s", workdir)
            else:
                shutil.rmtree(workdir, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def _nvcc_identity(executable: str) -> str:
    try:
        out = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise MlaJitError(f"{executable} --version failed: {exc}") from None
    release = next((ln.strip() for ln in out.splitlines() if ln.startswith("Build ")), out.strip()[-60:])
    return f"nvcc-{release}-{hashlib.sha256(out.encode()).hexdigest()[:12]}"


_COMPILERS = {"nvrtc": NvrtcCompiler(), "nvcc": NvccCompiler()}


def get_compiler(name: str | None = None) -> Compiler:
    return _COMPILERS[name or env.compiler_name()]

"""Small helpers shared by the CPU tests."""
import pytest

from mla_jit.errors import MlaJitError
from mla_jit.jit.arch import resolve_for_build
from mla_jit.runtimes import registry

SM90 = resolve_for_build("sm_90a")


def toy_source(dtype: str = "fp32"):
    """The rendered source of a small, fast-compiling toy kernel."""
    family = registry.get("tile_copy")
    from mla_jit.configs.toy import tile_copy_config
    return family.source(tile_copy_config(dtype, SM90.tuning), SM90)


def require_nvcc() -> str:
    """nvcc's path, or skip the calling test (with the reason) on a machine without nvcc."""
    from mla_jit.jit.compiler import get_compiler
    try:
        return get_compiler("nvcc").executable()
    except MlaJitError as exc:
        pytest.skip(f"needs nvcc: {exc}")


def sass_of(cubin: bytes, tmp_path) -> str:
    """cuobjdump --dump-sass of a cubin (the test is skipped without cuobjdump and nvdisasm)."""
    import os
    import subprocess

    import pytest
    try:
        from cuda import pathfinder
        tool = pathfinder.find_nvidia_binary_utility("cuobjdump")
        disasm = pathfinder.find_nvidia_binary_utility("nvdisasm")
    except Exception:
        tool = disasm = None
    if not tool or not disasm:
        pytest.skip("cuobjdump/nvdisasm not installed (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    env = {**os.environ, "PATH": f"{os.path.dirname(disasm)}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([tool, "--dump-sass", str(path)], capture_output=True, text=True, check=True, env=env).stdout

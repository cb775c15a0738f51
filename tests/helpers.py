"""Small helpers shared by the tests."""
import os
import pytest
import torch

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


def _output_tensors(result) -> list:
    return [t for t in (result if isinstance(result, (tuple, list)) else (result,)) if hasattr(t, "data_ptr")]


def _fill_nan_bytes(result) -> list[int]:
    """Every byte of result's tensors' storage set to 0xFF; their pointers."""
    ptrs = []
    for t in _output_tensors(result):
        torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).fill_(0xFF)
        ptrs.append(t.data_ptr())
    return ptrs


def call_with_poisoned_outputs(call, attempts: int = 3):
    """call() whose returned tensors (one or a tuple) start as NaN bytes (0xFF: NaN in every float
    format the ops return, -1 in integers), so an element the op should write and does not fails the
    checks. PyTorch's caching allocator hands a freed block to the next request of its size (small
    outputs come from a separate pool, so freeing some other NaN tensor does not reach them): a first
    call's outputs are filled and freed, and a second call, making the same allocations in the same
    order, takes those blocks back, which the pointers confirm. Inside a CUDA-graph capture, or under
    compute-sanitizer (MLA_JIT_TESTS_UNDER_MEMCHECK, set by scripts/gpu_run.sh): one call, unpoisoned."""
    if torch.cuda.is_current_stream_capturing():
        return call()
    if os.environ.get("MLA_JIT_TESTS_UNDER_MEMCHECK"):
        # compute-sanitizer's allocations do not come back at the same addresses: one call, unpoisoned
        # (memcheck itself reports an unwritten read; the unpoisoned runs check unwritten outputs).
        return call()
    for _ in range(attempts):
        first = call()
        ptrs = _fill_nan_bytes(first)
        del first
        again = call()
        if [t.data_ptr() for t in _output_tensors(again)] == ptrs:
            return again
    raise AssertionError("the op's outputs did not reuse the poisoned blocks: nothing shows unwritten elements")


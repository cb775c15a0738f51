"""Toy families end to end on a Hopper GPU, through both compilers."""
import pytest
import torch

import mla_jit
from mla_jit.ops import toy
from mla_jit.runtimes import registry

pytestmark = pytest.mark.gpu


def _fresh_families():
    """Drop the families' loaded kernels and the toy ops' plans, so the next call goes through
    build/load again (with the compiler this test asks for)."""
    registry.reset_all()
    toy._plans.clear()
    toy.descriptors.clear()


@pytest.fixture(autouse=True)
def _isolated(cache_root, compiler_env):
    _fresh_families()
    yield
    _fresh_families()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(64, 64), (200, 136), (1, 8), (1000, 520)])
def test_tile_copy(dtype, shape):
    torch.manual_seed(0)
    src = torch.randn(shape, device="cuda").to(dtype)
    out = torch.full_like(src, float("nan"))  # poison: every element must be written
    toy.tile_copy(src, 0.5, out=out)
    torch.cuda.synchronize()
    expected = (src.float() + 0.5).to(dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_pdl_chain_reads_first_kernels_output():
    torch.manual_seed(1)
    for rows in (4096, 130, 8192):
        src = torch.randn(rows, 256, device="cuda", dtype=torch.float32)
        mid, out = toy.tile_copy_chain(src, 1.0)
        torch.cuda.synchronize()
        torch.testing.assert_close(mid, src + 1.0, rtol=0, atol=0)
        torch.testing.assert_close(out, (src + 1.0) + 1.0, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mnk", [(64, 128, 64), (128, 256, 576), (192, 512, 512)])
def test_wgmma_gemm(dtype, mnk):
    m, n, k = mnk
    torch.manual_seed(2)
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = torch.randn(n, k, device="cuda").to(dtype)
    c = toy.wgmma_gemm(a, b)
    torch.cuda.synchronize()
    ref = a.float() @ b.float().T
    torch.testing.assert_close(c, ref, rtol=1e-4, atol=1e-3)


def test_second_process_view_loads_from_disk(cache_root):
    from mla_jit.jit import build
    src = torch.randn(64, 64, device="cuda")
    toy.tile_copy(src, 1.0)
    assert any(cache_root.rglob("kernel.cubin"))
    build.clear_memo()
    _fresh_families()
    cfg_binaries = registry.get("tile_copy")._binaries
    out = toy.tile_copy(src, 1.0)
    torch.cuda.synchronize()
    assert [b.origin for b in cfg_binaries.values()] == ["disk"]
    torch.testing.assert_close(out, src + 1.0, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the cold capture aborts on purpose
def test_graph_capture_warm_and_cold():
    src = torch.randn(256, 256, device="cuda")
    out = torch.empty_like(src)
    toy.tile_copy(src, 3.0, out=out)  # warm
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        toy.tile_copy(src, 3.0, out=out)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, src + 3.0, rtol=0, atol=0)

    cold = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    with pytest.raises(mla_jit.KernelNotWarmError, match="prewarm|outside capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            toy.tile_copy(cold, 1.0)


def test_bad_arguments_raise_before_launch():
    with pytest.raises(mla_jit.InvalidArgumentError, match="src"):
        toy.tile_copy(torch.randn(4, 4, 4, device="cuda"))
    with pytest.raises(mla_jit.InvalidArgumentError, match="src"):
        toy.tile_copy(torch.randn(8, 8))  # CPU tensor
    with pytest.raises(mla_jit.InvalidArgumentError, match="b.shape"):
        toy.wgmma_gemm(torch.randn(64, 64, device="cuda", dtype=torch.bfloat16),
                       torch.randn(100, 64, device="cuda", dtype=torch.bfloat16))


@pytest.mark.parametrize("cluster", [None, (2, 1, 1)])
def test_prepared_launch_cluster_attribute(cluster):
    from mla_jit.configs.toy import tile_copy_config
    from mla_jit.jit import launch as launch_mod
    from mla_jit.jit import tma
    from mla_jit.jit.arch import resolve_for_device
    src = torch.randn(256, 256, device="cuda")
    out = torch.full_like(src, float("nan"))
    arch = resolve_for_device(0)
    cfg = tile_copy_config("fp32", arch.tuning)
    family = registry.get("tile_copy")
    kernel = family.kernel(cfg, arch, "mla_jit_tile_copy", 0)
    prepared = launch_mod.PreparedLaunch(kernel, toy._COPY_PARAMS, (4, 4, 1), (cfg.num_threads, 1, 1),
                                         cluster=cluster, pdl=True)
    desc = tma.tiled(src, (cfg.block_rows, cfg.block_cols))
    prepared(torch.cuda.current_stream().cuda_stream, desc, out.data_ptr(), 256, 256, 2.0)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, src + 2.0, rtol=0, atol=0)


def test_launch_failure_raises_launch_error():
    from mla_jit.configs.toy import tile_copy_config
    from mla_jit.jit import launch as launch_mod
    from mla_jit.jit.arch import resolve_for_device
    arch = resolve_for_device(0)
    cfg = tile_copy_config("fp32", arch.tuning)
    kernel = registry.get("tile_copy").kernel(cfg, arch, "mla_jit_tile_copy", 0)
    too_many_threads = launch_mod.PreparedLaunch(kernel, toy._COPY_PARAMS, (1, 1, 1), (2048, 1, 1))
    from mla_jit.jit import tma
    src = torch.randn(64, 64, device="cuda")
    with pytest.raises(mla_jit.LaunchError, match="mla_jit_tile_copy"):
        too_many_threads(torch.cuda.current_stream().cuda_stream, tma.tiled(src, (64, 64)), src.data_ptr(),
                         64, 64, 0.0)


def test_out_argument_op_under_torch_compile_and_opcheck():
    """The worked example of an op with `out=` (the torch op mutates `out`, declared in its schema):
    torch.compile(fullgraph=True) gives the eager result, and opcheck passes."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    src = torch.randn(200, 136, device="cuda")

    def step(x, buf):
        toy.tile_copy(x * 2, 0.25, out=buf)
        return buf + 1

    eager = step(src, torch.empty_like(src))
    buf = torch.full_like(src, float("nan"))
    compiled = torch.compile(step, fullgraph=True)(src, buf)
    torch.cuda.synchronize()
    assert dict(counters["graph_break"]) == {}
    assert torch.equal(compiled, eager) and torch.equal(buf, src * 2 + 0.25)
    torch.library.opcheck(torch.ops.mla_jit.tile_copy_out.default, (src, 0.5, torch.empty_like(src)))

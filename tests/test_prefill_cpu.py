"""GPU-free checks of flash_attn_varlen_func: config, params layout, the reference, compile-only SASS
of every supported (head dims, dtype) on sm_90a, the op's typed errors and packed launch parameters
with the GPU stubbed, and tracing with torch.compile."""
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mla_jit
from mla_jit.configs.prefill import (SM80_SMEM_LIMITS, SUPPORTED_HEAD_DIMS, PrefillConfig, Sm80PrefillConfig,
                                     prefill_config, sm80_prefill_config)
from mla_jit.jit.arch import resolve_for_build
from mla_jit.jit.build import build
from mla_jit.ops import validate
from mla_jit.runtimes import registry
from mla_jit.runtimes.prefill import PREFILL_PARAMS

from .helpers import sass_of
from .prefill_reference import prefill_reference

REPO = Path(__file__).resolve().parent.parent
SM90 = resolve_for_build("sm_90a")


def test_configs_fit_shared_memory():
    for d, dv in SUPPORTED_HEAD_DIMS:
        cfg = prefill_config("bf16", d, dv, True, SM90.tuning)
        assert cfg.smem_bytes <= 227 * 1024
    assert prefill_config("bf16", 192, 128, True, SM90.tuning).num_stages == 2   # 3 would not fit
    with pytest.raises(mla_jit.InvalidArgumentError, match="head_dim"):
        PrefillConfig("bf16", 192, 192, True)
    with pytest.raises(mla_jit.InvalidArgumentError, match="dtype"):
        PrefillConfig("fp32", 192, 128, True)


def test_params_struct_matches_header():
    header = (REPO / "mla_jit/include/mla_jit/prefill/common.cuh").read_text()
    assert f"static_assert(sizeof(PrefillParams) == {PREFILL_PARAMS.size}," in header


def test_reference_against_naive_attention():
    """The reference's bottom-right causal rows and empty rows, against a per-row loop."""
    torch.manual_seed(0)
    lens_q, lens_k = [3, 0, 4], [5, 2, 2]
    q, k, v = torch.randn(7, 2, 8), torch.randn(9, 1, 8), torch.randn(9, 1, 4)
    cu_q, cu_k = torch.tensor([0, 3, 3, 7]), torch.tensor([0, 5, 7, 9])
    out, lse = prefill_reference(q, k, v, cu_q, cu_k, 0.3, True)
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        for i in range(nq):
            row = int(cu_q[b]) + i
            visible = nk - nq + i + 1
            for h in range(2):
                if visible <= 0:
                    assert lse[h, row] == math.inf and torch.equal(out[row, h], torch.zeros(4))
                    continue
                keys = k[int(cu_k[b]):int(cu_k[b]) + visible, 0]
                s = keys @ q[row, h] * 0.3
                assert torch.allclose(lse[h, row], torch.logsumexp(s, 0), atol=1e-5)
                assert torch.allclose(out[row, h], torch.softmax(s, 0) @ v[int(cu_k[b]):int(cu_k[b]) + visible, 0],
                                      atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dims", SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_sm90_kernel_compiles_without_local_memory(dims, dtype, cache_root, monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    family = registry.get("prefill_sm90")
    binary = build(family.source(prefill_config(dtype, *dims, True, SM90.tuning), SM90))
    report = binary.log.split(f"Function properties for {family.ENTRY}")[1].splitlines()[1]
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    if dims == (192, 128) and dtype == "bf16":
        sass = sass_of(binary.cubin, tmp_path)
        assert "LDL" not in sass and "STL" not in sass and "CALL" not in sass
        assert "HGMMA.64x128x16.F32.BF16" in sass     # S (N = 128 keys) and P V (N = 128 columns)
        assert "UTMALDG.3D" in sass                   # q, k, v through TMA
        assert "STG.E " in sass and "STSM" not in sass   # O from registers to out, not staged by stmatrix


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89"])
def test_sm80_configs_fit_their_arch(arch):
    tuning = resolve_for_build(arch).tuning
    for d, dv in SUPPORTED_HEAD_DIMS:
        cfg = sm80_prefill_config("bf16", d, dv, True, tuning)
        assert cfg.smem_bytes <= SM80_SMEM_LIMITS[arch]
    big = sm80_prefill_config("bf16", 192, 128, True, tuning)
    # One K and one V buffer of 128 keys: 163 KB holds Q beside them, 99 KB loads Q through them.
    assert (big.block_n, big.num_stages, big.q_aliases_kv) == (128, 1, arch != "sm_80")
    if arch == "sm_80":   # 128/128: two stages fit beside Q
        assert sm80_prefill_config("bf16", 128, 128, True, tuning).num_stages == 2
    assert sm80_prefill_config("bf16", 64, 64, True, tuning).block_n == 128   # 128-key stages fit everywhere
    with pytest.raises(mla_jit.InvalidArgumentError, match="q_aliases_kv"):
        Sm80PrefillConfig("bf16", 192, 128, True, 2, "yes")


@pytest.mark.slow
@pytest.mark.parametrize("dims", SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89"])
def test_sm80_kernel_compiles_without_local_memory(arch, dims, dtype, cache_root, monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    pair = resolve_for_build(arch)
    family = registry.get("prefill_sm80")
    binary = build(family.source(sm80_prefill_config(dtype, *dims, True, pair.tuning), pair))
    report = binary.log.split(f"Function properties for {family.ENTRY}")[1].splitlines()[1]
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    if dims == (192, 128) and dtype == "bf16":
        sass = sass_of(binary.cubin, tmp_path)
        assert "LDL" not in sass and "STL" not in sass
        assert "HMMA.16816.F32.BF16" in sass and "LDGSTS" in sass and "LDSM.16.MT88.4" in sass


# ---- the op with the GPU stubbed -----------------------------------------------------------------

@pytest.fixture
def stub_launch(monkeypatch):
    """CPU tensors pass the CUDA checks; the plan's launch records the packed params and grid."""
    from mla_jit.jit.arch import ArchPair, parse_arch
    from mla_jit.runtimes import prefill_plan
    monkeypatch.setattr(validate, "on_gpu", lambda tensor: True)
    monkeypatch.setattr(prefill_plan, "plans", {})
    monkeypatch.setattr(prefill_plan, "resolve_for_device",
                        lambda device: ArchPair(parse_arch("sm_90a"), parse_arch("sm_90a")))
    monkeypatch.setattr(prefill_plan, "current_stream", lambda device: 7)
    monkeypatch.setattr(prefill_plan, "read_global_int32", lambda *a: 200 * 1024)
    monkeypatch.setattr(prefill_plan, "_l2_bytes", lambda device: 50 << 20)
    monkeypatch.setattr(prefill_plan, "_num_sms", lambda device: 132)
    monkeypatch.setattr(prefill_plan, "descriptor", lambda t, rows: ("desc", t.data_ptr(), tuple(t.shape), rows))
    family = registry.get("prefill_sm90")
    monkeypatch.setattr(family, "binary", lambda cfg, arch: None)
    launched, built = [], []

    def launcher(cfg, arch, entry, device, params, grid, block, **kwargs):
        built.append((cfg, block, kwargs))
        return lambda stream, packed, qd, kd, vd, grid: launched.append(
            (PREFILL_PARAMS.unpack(packed), (qd, kd, vd), grid))
    monkeypatch.setattr(family, "launcher", launcher)
    return launched, built


def _cpu_inputs(lens_q=(100, 300), lens_k=None, h=16, h_k=None, d=192, dv=128, dtype=torch.bfloat16):
    lens_k = lens_k or lens_q
    h_k = h_k or h
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)  # noqa: E731
    q = torch.randn(sum(lens_q), h, d).to(dtype)
    k = torch.randn(sum(lens_k), h_k, d).to(dtype)
    v = torch.randn(sum(lens_k), h_k, 2 * dv).to(dtype)[..., dv:]   # a split view, as engines pass it
    return q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k)


def test_packed_params_grid_and_plan_reuse(stub_launch):
    launched, built = stub_launch
    q, k, v, cu_q, cu_k, mq, mk = _cpu_inputs()
    out, lse = mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, return_softmax_lse=True)
    assert out.shape == (400, 16, 128) and lse.shape == (16, 400) and lse.dtype == torch.float32
    q2, k2, v2, cu_q2, cu_k2, _, _ = _cpu_inputs(lens_q=(5, 7, 1000))
    mla_jit.flash_attn_varlen_func(q2, k2, v2, cu_q2, cu_k2, 1000, 1000, causal=True)   # same layout, new lengths
    assert len(built) == 1 and built[0][1] == (384, 1, 1) and built[0][2]["dynamic_smem"] == 200 * 1024
    (params, descs, grid), (params2, _, grid2) = launched
    # Persistent: a CTA an SM, fewer when there are fewer tiles (row tiles x heads x batch).
    assert grid == (3 * 16 * 2, 1, 1) and grid2 == (132, 1, 1)
    assert params[:9] == (q.data_ptr(), k.data_ptr(), v.data_ptr(), *q.stride()[:2], *k.stride()[:2],
                          *v.stride()[:2])
    assert v.stride()[:2] == (16 * 256, 256)   # the split view's strides reach the kernel
    params = params[9:]
    assert params[:4] == (out.data_ptr(), lse.data_ptr(), cu_q.data_ptr(), cu_k.data_ptr())
    assert params[4:6] == out.stride()[:2]
    assert params[6:11] == (2, 16, 1, 400, 3)   # b, h, q_per_kv, total_q, row tiles
    assert params[11] == pytest.approx(192 ** -0.5 / math.log(2)) and params[12] == pytest.approx(192 ** -0.5)
    # K and V of 300 tokens (640 B a token a head) in half the L2: every head in one section.
    assert params[13] == 16
    assert params2[10] == 0   # no lse asked for: a null pointer
    assert descs == (("desc", q.data_ptr(), tuple(q.shape), 64), ("desc", k.data_ptr(), tuple(k.shape), 128),
                     ("desc", v.data_ptr(), tuple(v.shape), 128))


def test_head_sections_follow_the_key_length(stub_launch):
    """Heads per tile-order section: as many KV heads as fit half the L2 (25 MB here), times the
    query heads that share one; max_seqlen_k is capped by the keys there are."""
    launched, _ = stub_launch
    q, k, v, cu_q, cu_k, _, _ = _cpu_inputs(lens_q=(64,), lens_k=(40_000,), h=8, h_k=2)
    mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 40_000)   # 25.6 MB a KV head: one a section
    mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 10_000)   # 6.4 MB: all of them
    mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 10 ** 9)  # capped at total_k
    assert [launch[0][22] for launch in launched] == [4, 8, 4]


def test_empty_batches_launch_nothing(stub_launch):
    launched, _ = stub_launch
    q, k, v, cu_q, cu_k, _, _ = _cpu_inputs(lens_q=(0, 0))
    out = mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 0, 0)
    assert out.shape == (0, 16, 128) and launched == []


def test_gqa_and_out(stub_launch):
    launched, _ = stub_launch
    q, k, v, cu_q, cu_k, mq, mk = _cpu_inputs(h=16, h_k=4)
    out = torch.empty(400, 16, 128, dtype=torch.bfloat16)
    res = mla_jit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, out=out)
    assert res is out and launched[0][0][9] == out.data_ptr() and launched[0][0][17] == 4


def test_bad_arguments_raise_typed_errors(stub_launch):
    q, k, v, cu_q, cu_k, mq, mk = _cpu_inputs()
    good = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk)
    odd = torch.randn(400, 16, 196).to(torch.bfloat16)[..., :192]   # head stride 196: rows not 16-byte aligned
    bad = [("q", q.float(), "q"), ("q", q[..., :64], "head dims"), ("q", "nope", "q"),
           ("k", k.half(), "k"), ("k", k[:, :3], "k"), ("k", odd, "16 bytes"), ("v", v[:10], "v"),
           ("v", v[:, :8], "v"), ("q", q.transpose(1, 2).contiguous().transpose(1, 2), "q"),
           ("cu_seqlens_q", cu_q.long(), "cu_seqlens_q"), ("cu_seqlens_k", cu_k[:2], "cu_seqlens_k"),
           ("max_seqlen_q", -1, "max_seqlen_q"), ("max_seqlen_k", 2.5, "max_seqlen_k"),
           ("softmax_scale", float("nan"), "softmax_scale"), ("softmax_scale", -1.0, "softmax_scale"),
           ("out", torch.empty(400, 16, 192, dtype=torch.bfloat16), "out"),
           ("out", torch.empty(400, 16, 128, dtype=torch.float16), "out"),
           ("out", q[..., :128], "out"),
           ("out", torch.empty(1, 16, 128, dtype=torch.bfloat16).expand(400, 16, 128), "internal overlap")]
    for name, value, match in bad:
        with pytest.raises(mla_jit.InvalidArgumentError, match=match):
            mla_jit.flash_attn_varlen_func(**{**good, name: value})
    unserved = [("dropout_p", 0.1), ("window_size", (64, 0)), ("softcap", 30.0), ("alibi_slopes", torch.ones(16)),
                ("block_table", torch.zeros(2, 4, dtype=torch.int32)), ("seqused_k", cu_k[1:]),
                ("q_descale", torch.ones(1)), ("s_aux", torch.ones(16)), ("cp_world_size", 2)]
    for name, value in unserved:
        with pytest.raises(mla_jit.FeatureNotAvailableError, match=name):
            mla_jit.flash_attn_varlen_func(**good, **{name: value})
    assert stub_launch[0] == []
    # Keywords without an effect here are accepted.
    mla_jit.flash_attn_varlen_func(**good, window_size=(-1, -1), softcap=0.0, deterministic=True, num_splits=1,
                                   fa_version=3, scheduler_metadata=None, return_attn_probs=False)
    out, lse = mla_jit.flash_attn_varlen_func(**good, return_attn_probs=True)
    assert lse.shape == (16, 400)


TRACE_PREFILL = textwrap.dedent("""
    import torch, mla_jit
    from mla_jit.jit import build
    def no_build(*a, **k):
        raise AssertionError("tracing must not compile")
    build.build = no_build
    def step(q, k, v, cu, out):
        o, lse = mla_jit.flash_attn_varlen_func(q * 2, k, v, cu, cu, 64, 64, causal=True, return_softmax_lse=True)
        o2 = mla_jit.flash_attn_varlen_func(q, k, v, cu, cu, 64, 64, out=out)
        return o.float().sum(-1) + o2.float().sum(-1), lse
    m = lambda *s, dtype=torch.bfloat16: torch.empty(*s, device="meta", dtype=dtype)
    t = torch.compile(step, fullgraph=True, backend="aot_eager")(
        m(100, 4, 192), m(100, 4, 192), m(100, 4, 128), m(3, dtype=torch.int32), m(100, 4, 128))
    assert t[0].shape == (100, 4) and t[1].shape == (4, 100)
    print("OK")
""")


def test_torch_compile_traces_prefill_without_graph_breaks(tmp_path):
    env = {**os.environ, "MLA_JIT_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", TRACE_PREFILL], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr

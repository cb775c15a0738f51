"""GPU-free checks of merge_attn_states: config, params layout, compile-only SASS of representative
kernels, the op's typed errors and packed launch parameters with the GPU stubbed, and tracing."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mla_jit
from mla_jit.configs.merge import MERGE_MAX_CTAS, MergeConfig, merge_config, merge_grid
from mla_jit.jit.arch import resolve_for_build
from mla_jit.jit.build import build
from mla_jit.ops import validate
from mla_jit.runtimes import registry
from mla_jit.runtimes.merge import MERGE_PARAMS

from .helpers import sass_of
from .merge_reference import merge_reference

REPO = Path(__file__).resolve().parent.parent


def test_config_and_grid():
    assert merge_config("bf16", 128, resolve_for_build("sm_90a").tuning).rows_per_cta == 16   # 16 threads a row
    assert MergeConfig("fp32", 512).rows_per_cta == 2
    assert [merge_grid(r, 16) for r in (1, 16, 17, 33, 10 ** 9)] == [1, 1, 2, 4, MERGE_MAX_CTAS]
    with pytest.raises(mla_jit.InvalidArgumentError, match="head_dim"):
        MergeConfig("bf16", 96)
    with pytest.raises(mla_jit.InvalidArgumentError, match="dtype"):
        MergeConfig("fp8", 128)


def test_params_struct_matches_header():
    header = (REPO / "mla_jit/include/mla_jit/prefill/merge_states.cuh").read_text()
    assert f"static_assert(sizeof(MergeParams) == {MERGE_PARAMS.size}," in header


def test_reference_treats_infinite_lse_as_empty():
    inf = float("inf")
    prefix = torch.tensor([[[1.0, 2.0]], [[float("nan"), 0.0]], [[5.0, 5.0]], [[float("nan")] * 2]])
    suffix = torch.tensor([[[3.0, 4.0]], [[7.0, 8.0]], [[float("nan"), 1.0]], [[float("nan")] * 2]])
    plse = torch.tensor([[0.0, inf, 2.0, -inf]])
    slse = torch.tensor([[0.0, 1.5, -inf, inf]])
    out, lse = merge_reference(prefix, plse, suffix, slse)
    assert torch.allclose(out[0], torch.tensor([[2.0, 3.0]])) and abs(lse[0, 0] - torch.log(torch.tensor(2.0))) < 1e-6
    assert torch.equal(out[1], suffix[1]) and lse[0, 1] == 1.5
    assert torch.equal(out[2], prefix[2]) and lse[0, 2] == 2.0
    assert torch.equal(out[3], torch.zeros(1, 2)) and lse[0, 3] == -inf


@pytest.mark.parametrize("arch,dtype,head_dim", [("sm_90a", "bf16", 128), ("sm_80", "fp16", 512),
                                                 ("sm_89", "fp32", 64)])
def test_kernel_compiles_to_16_byte_accesses_without_spills(arch, dtype, head_dim, cache_root, monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    pair = resolve_for_build(arch)
    family = registry.get("merge_states")
    binary = build(family.source(merge_config(dtype, head_dim, pair.tuning), pair))
    report = binary.log.split(f"Function properties for {family.ENTRY}")[1].splitlines()[1]
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    sass = sass_of(binary.cubin, tmp_path)
    # Memory-bound: both inputs read and the output written 16 bytes a thread.
    assert sass.count("LDG.E.128") == 2 and sass.count("STG.E.128") == 1, sass
    assert "LDL" not in sass and "STL" not in sass and "CALL" not in sass


# ---- the op with the GPU stubbed -----------------------------------------------------------------

@pytest.fixture
def stub_launch(monkeypatch):
    """CPU tensors pass the CUDA checks; the family's launcher returns a recorder of the packed params."""
    from mla_jit.jit.arch import ArchPair, parse_arch
    from mla_jit.ops import merge as op
    from mla_jit.runtimes import merge_plan
    monkeypatch.setattr(validate, "on_gpu", lambda tensor: True)
    monkeypatch.setattr(merge_plan, "plans", {})
    monkeypatch.setattr(merge_plan, "resolve_for_device",
                        lambda device: ArchPair(parse_arch("sm_90a"), parse_arch("sm_90a")))
    monkeypatch.setattr(op, "current_stream", lambda device: 7)
    launched, built = [], []

    def launcher(cfg, arch, entry, device, params, grid, block, **kwargs):
        built.append((cfg, grid, block))
        return lambda stream, packed: launched.append(MERGE_PARAMS.unpack(packed))
    monkeypatch.setattr(registry.get("merge_states"), "launcher", launcher)
    return launched, built


def _cpu_states(num_tokens=5, num_heads=4, head_dim=128, dtype=torch.bfloat16):
    make = lambda: torch.randn(num_tokens, num_heads, head_dim).to(dtype)  # noqa: E731
    return make(), torch.randn(num_heads, num_tokens), make(), torch.randn(num_heads, num_tokens)


def test_packed_params_and_plan_reuse(stub_launch):
    launched, built = stub_launch
    prefix, plse, suffix, slse = _cpu_states()
    out, out_lse = torch.empty_like(prefix), torch.empty_like(plse)
    mla_jit.merge_attn_states(out, prefix, plse, suffix, slse, out_lse)
    mla_jit.merge_attn_states(out, prefix, plse, suffix, slse)   # no output_lse: another signature
    mla_jit.merge_attn_states(out, prefix, plse, suffix, slse, out_lse)
    assert [b[1:] for b in built] == [((2, 1, 1), (256, 1, 1))] * 2   # 20 rows, 16 a CTA: 2 CTAs
    first, second, third = launched
    assert first == third
    assert first[:6] == (out.data_ptr(), prefix.data_ptr(), suffix.data_ptr(), out_lse.data_ptr(), plse.data_ptr(),
                         slse.data_ptr())
    assert first[6:18] == (*out.stride()[:2], *prefix.stride()[:2], *suffix.stride()[:2], *plse.stride(),
                           *slse.stride(), *out_lse.stride())
    assert first[18:] == (5, 4) and second[3] == 0   # a null output_lse


def test_bad_arguments_raise_typed_errors(stub_launch):
    prefix, plse, suffix, slse = _cpu_states()
    out = torch.empty_like(prefix)
    good = dict(output=out, prefix_output=prefix, prefix_lse=plse, suffix_output=suffix, suffix_lse=slse)
    wide = torch.randn(5, 4, 136).to(torch.bfloat16)[..., :128]   # token stride 544: rows stay 16-byte aligned
    odd = torch.randn(5, 4, 132).to(torch.bfloat16)[..., :128]    # head stride 132: rows misaligned
    bad = [("output", out.half(), "output"), ("output", out[..., :96].contiguous(), "head dim"),
           ("output", "nope", "output"), ("prefix_output", prefix.float(), "prefix_output"),
           ("suffix_output", suffix[:4], "suffix_output"), ("suffix_output", odd, "16-byte"),
           ("prefix_lse", plse.T.contiguous(), "prefix_lse"), ("suffix_lse", slse.double(), "suffix_lse"),
           ("output_lse", torch.empty(4, 6), "output_lse"), ("prefix_output", out, "prefix_output")]
    for name, value, match in bad:
        with pytest.raises(mla_jit.InvalidArgumentError, match=match):
            mla_jit.merge_attn_states(**{**good, name: value})
    mla_jit.merge_attn_states(**{**good, "prefix_output": wide})   # a strided view is fine
    empty = _cpu_states(num_tokens=0)
    mla_jit.merge_attn_states(torch.empty_like(empty[0]), *empty)   # nothing to launch
    assert len(stub_launch[0]) == 1


TRACE_MERGE = textwrap.dedent("""
    import torch, mla_jit
    from mla_jit.jit import build
    def no_build(*a, **k):
        raise AssertionError("tracing must not compile")
    build.build = no_build
    def step(out, a, la, b, lb, olse):
        mla_jit.merge_attn_states(out, a, la, b, lb, olse)
        out2 = torch.empty_like(out)
        mla_jit.merge_attn_states(out2, out, olse, b, lb)   # a chained merge, without output_lse
        return out2.float().sum(-1), olse
    m = lambda *s: torch.empty(*s, device="meta")
    t = torch.compile(step, fullgraph=True, backend="aot_eager")(
        m(6, 4, 128).bfloat16(), m(6, 4, 128).bfloat16(), m(4, 6), m(6, 4, 128).bfloat16(), m(4, 6), m(4, 6))
    assert t[0].shape == (6, 4) and t[1].shape == (4, 6)
    print("OK")
""")


def test_torch_compile_traces_merges_without_graph_breaks(tmp_path):
    env = {**os.environ, "MLA_JIT_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", TRACE_MERGE], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr


def test_token_count_changes_reuse_the_layouts_plan(stub_launch):
    """Chunked prefill: a new token count every step, one layout; the plan (and its checks) is
    per layout, a launch per power-of-two grid."""
    from mla_jit.runtimes import merge_plan
    launched, built = stub_launch
    for num_tokens in (5, 9, 5, 700, 9):
        prefix, plse, suffix, slse = _cpu_states(num_tokens=num_tokens)
        mla_jit.merge_attn_states(torch.empty_like(prefix), prefix, plse, suffix, slse, torch.empty_like(plse))
    assert len(merge_plan.plans) == 1 and [b[1][0] for b in built] == [2, 4, 256]   # 20, 36 and 2800 rows, 16 a CTA
    assert [p[18] for p in launched] == [5, 9, 5, 700, 9]
    assert launched[3][12:14] == (700, 1)   # prefix_lse (h, T) strides follow the token count


def test_aliasing_is_rejected_on_warm_calls_too(stub_launch):
    prefix, plse, suffix, slse = _cpu_states()
    out, out_lse = torch.empty_like(prefix), torch.empty_like(plse)
    mla_jit.merge_attn_states(out, prefix, plse, suffix, slse, out_lse)   # warm this layout
    olse_in_out = out.view(torch.float32).view(-1)[:20].view(4, 5)   # output_lse inside output's bytes
    for args, match in (((prefix, prefix, plse, suffix, slse, out_lse), "prefix_output"),
                        ((out, prefix, plse, suffix, slse, plse), "prefix_lse"),
                        ((out, prefix, plse, suffix, slse, olse_in_out), "output")):
        with pytest.raises(mla_jit.InvalidArgumentError, match=match):
            mla_jit.merge_attn_states(*args)
    # An output whose rows share memory (a stride-0 view) is refused before any launch.
    shared = torch.empty(1, 4, 128).to(torch.bfloat16).expand(5, 4, 128)
    with pytest.raises(mla_jit.InvalidArgumentError, match="internal overlap"):
        mla_jit.merge_attn_states(shared, prefix, plse, suffix, slse)
    assert len(stub_launch[0]) == 1


def test_newer_vllm_keywords_say_not_available(stub_launch):
    prefix, plse, suffix, slse = _cpu_states()
    for kwargs in ({"prefill_tokens_with_context": 3}, {"output_scale": torch.ones(1)}):
        with pytest.raises(mla_jit.FeatureNotAvailableError, match=next(iter(kwargs))):
            mla_jit.merge_attn_states(torch.empty_like(prefix), prefix, plse, suffix, slse, **kwargs)

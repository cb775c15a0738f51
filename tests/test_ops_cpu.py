"""GPU-free checks of the op layer: torch.library registration, tracing under torch.compile (on meta
tensors), the typed errors of validation, the plan fast path and FlashMLA's lazy schedule API. The
CUDA checks and the runtime's plans are stubbed, so nothing here needs a GPU or compiles a kernel."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mla_jit
from mla_jit.ops import library, validate
from mla_jit.runtimes import decode_plan as runtime

REPO = Path(__file__).resolve().parent.parent


WRITTEN_ARGUMENTS = {"merge_attn_states": {"output", "output_lse"}}


def test_every_public_op_is_a_torch_op_with_a_fake_implementation():
    from torch._library.simple_registry import singleton
    errors = {name for name in mla_jit.__all__ if name.endswith("Error")}
    utilities = {"release_workspaces", "FlashMLASchedMeta"}
    # Every public name is an error, a utility or a torch op (itself, or another op's under a peer's
    # name): a new public op must be registered.
    aliases = mla_jit.TORCH_OP_ALIASES
    assert set(mla_jit.__all__) == errors | utilities | set(mla_jit.TORCH_OPS) | set(aliases)
    assert set(aliases.values()) <= set(mla_jit.TORCH_OPS) and not set(aliases) & set(mla_jit.TORCH_OPS)
    for name in mla_jit.TORCH_OPS:
        getattr(mla_jit, name)  # loads the op module, which registers its ops
        assert name in library.defined(), name
        op = getattr(torch.ops.mla_jit, name)
        assert op.default._schema.name == f"mla_jit::{name}"
        entry = singleton.find(f"mla_jit::{name}")
        assert entry.fake_impl.kernel is not None, f"{name} has no fake implementation"
        # An op writes only the arguments its schema marks (a!), the ones FlashAttention's and vLLM's
        # signatures write in place.
        written = {a.name for a in op.default._schema.arguments if a.alias_info and a.alias_info.is_write}
        assert written == WRITTEN_ARGUMENTS.get(name, set()), (name, written)
    for name in errors:
        assert issubclass(getattr(mla_jit, name), mla_jit.MlaJitError)
    # flash_attn_varlen_func(out=...) goes through a second op while tracing: it writes out only.
    op = torch.ops.mla_jit.flash_attn_varlen_func_out
    assert {a.name for a in op.default._schema.arguments if a.alias_info and a.alias_info.is_write} == {"out"}
    assert singleton.find("mla_jit::flash_attn_varlen_func_out").fake_impl.kernel is not None


def test_import_is_light():
    """`import mla_jit` loads neither torch nor the ops (the CLI's start-up time depends on it)."""
    code = "import sys, mla_jit; print('torch' in sys.modules, 'mla_jit.ops' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


COMPILE_ON_META = textwrap.dedent("""
    import os, sys, torch
    import mla_jit
    from mla_jit.jit import build
    from mla_jit.runtimes import decode_plan

    def no_build(*args, **kwargs):
        raise AssertionError("tracing must not compile or load a kernel")
    build.build = no_build
    decode_plan.sm_parts_for = lambda device, rows, h_kv: 66   # meta tensors have no GPU to ask

    def step_tensors(q, k_cache, block_table, lens, layers: int):
        meta, splits = mla_jit.get_mla_metadata(lens, q.shape[1] * q.shape[2] // k_cache.shape[2], k_cache.shape[2])
        outs = [mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits, causal=True)[0]
                for _ in range(layers)]
        return torch.stack(outs), meta, splits

    def step_lazy(q, k_cache, block_table, lens, layers: int):
        sched, _ = mla_jit.get_mla_metadata()
        outs = []
        for _ in range(layers):
            out, lse = mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, sched, None, causal=True)
            outs.append(out)
        return torch.stack(outs), lse, sched.tile_scheduler_metadata

    def layer(q, k_cache, block_table, lens, sched):
        return mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, sched, None, softmax_scale=0.1)

    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    q = torch.empty(4, 2, 16, 576, dtype=torch.bfloat16, device="meta")
    k_cache = torch.empty(10, 64, 1, 576, dtype=torch.bfloat16, device="meta")
    block_table = torch.empty(4, 3, dtype=torch.int32, device="meta")
    lens = torch.empty(4, dtype=torch.int32, device="meta")
    out, meta, splits = torch.compile(step_tensors, fullgraph=True, backend="aot_eager")(q, k_cache, block_table, lens, 3)
    assert out.shape == (3, 4, 2, 16, 512) and meta.shape == (66, 8) and splits.shape == (5,), (out.shape, meta.shape)
    out, lse, meta = torch.compile(step_lazy, fullgraph=True, backend="aot_eager")(q, k_cache, block_table, lens, 2)
    assert out.shape == (2, 4, 2, 16, 512) and lse.shape == (4, 16, 2) and meta.shape == (66, 8)
    # A schedule made outside the compiled function, filled by its first traced call (a side effect).
    sched, _ = mla_jit.get_mla_metadata()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k_cache, block_table, lens, sched)
    assert sched.have_initialized and sched.tile_scheduler_metadata.shape == (66, 8)
    assert sched.config.b == 4 and sched.config.page_block_size == 64
    out, lse = compiled(q, k_cache, block_table, lens, sched)   # the filled schedule: reused
    assert out.shape == (4, 2, 16, 512) and lse.dtype == torch.float32
    # vLLM's FP8 form: e4m3 q and cache, descales as tensors or None; bf16 out.
    def layer_fp8(q, k_cache, block_table, lens, meta, splits, descale):
        out, lse = mla_jit.flash_mla_with_kvcache_fp8(q, k_cache, block_table, lens, 512, meta, splits, None, True,
                                                      descale, descale)
        none_out, _ = mla_jit.flash_mla_with_kvcache_fp8(q, k_cache, block_table, lens, 512, meta, splits)
        return out, lse, none_out
    meta = torch.empty(66, 8, dtype=torch.int32, device="meta")
    splits = torch.empty(5, dtype=torch.int32, device="meta")
    q8, k8 = q.to(torch.float8_e4m3fn), k_cache.to(torch.float8_e4m3fn)
    out, lse, none_out = torch.compile(layer_fp8, fullgraph=True, backend="aot_eager")(
        q8, k8, block_table, lens, meta, splits, torch.empty(1, device="meta"))
    assert out.dtype == none_out.dtype == torch.bfloat16 and out.shape == (4, 2, 16, 512), (out.dtype, out.shape)
    assert dict(counters["graph_break"]) == {}, dict(counters["graph_break"])
    print("OK")
""")


def test_torch_compile_traces_a_decode_step_without_graph_breaks(tmp_path):
    """fullgraph=True over both schedule forms; tracing runs the fake implementations only: it
    never builds a kernel or touches the cache (a fresh process, the ops not yet imported)."""
    cache = tmp_path / "cache"
    env = {**os.environ, "MLA_JIT_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", COMPILE_ON_META], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
    assert not cache.exists()


# ---- the op layer with the GPU stubbed ----------------------------------------------------------

class _FakeDecodePlan:
    built: list = []

    def __init__(self, q, k_cache, block_table, head_dim_v, parts):
        self.default_scale = q.shape[-1] ** -0.5
        self.shapes = ((*q.shape[:3], head_dim_v), (q.shape[0], q.shape[2], q.shape[1]))
        self.calls = []
        self.descales = []
        _FakeDecodePlan.built.append(self)

    def run(self, q, q_ptr, k_cache, k_ptr, block_table, cache_seqlens, metadata, num_splits, scale, causal,
            descale_q=None, descale_k=None):
        assert (q_ptr, k_ptr) == (q.data_ptr(), k_cache.data_ptr())
        self.calls.append((q.data_ptr(), metadata.data_ptr(), scale, causal))
        self.descales.append((descale_q, descale_k))
        return (q.new_zeros(self.shapes[0], dtype=runtime.out_dtype(q.dtype)),
                q.new_zeros(self.shapes[1], dtype=torch.float32))


class _FakeMetadataPlan:
    runs = 0

    def __init__(self, device_index, batch, rows, h_kv):
        self.batch = batch

    def run(self, cache_seqlens):
        _FakeMetadataPlan.runs += 1
        return (torch.full((3, runtime.METADATA_SIZE), 7, dtype=torch.int32),
                torch.zeros(self.batch + 1, dtype=torch.int32))


@pytest.fixture
def stub_gpu(monkeypatch):
    """CPU tensors pass the CUDA checks; plans are fakes that record what they were asked."""
    monkeypatch.setattr(validate, "on_gpu", lambda tensor: True)
    monkeypatch.setattr(runtime, "DecodePlan", _FakeDecodePlan)
    monkeypatch.setattr(runtime, "MetadataPlan", _FakeMetadataPlan)
    monkeypatch.setattr(runtime, "decode_plans", {})
    monkeypatch.setattr(runtime, "metadata_plans", {})
    _FakeDecodePlan.built = []
    _FakeMetadataPlan.runs = 0


def _inputs(b=2, s_q=1, h_q=16, h_kv=1, page=64, d=576, dtype=torch.bfloat16):
    q = torch.randn(b, s_q, h_q, d).to(dtype)
    k_cache = torch.randn(8, page, h_kv, d).to(dtype)
    block_table = torch.arange(b * 4, dtype=torch.int32).view(b, 4) % 8
    lens = torch.full((b,), 100, dtype=torch.int32)
    return q, k_cache, block_table, lens


def test_warm_calls_skip_validation_and_reuse_the_plan(stub_gpu):
    q, k_cache, block_table, lens = _inputs()
    meta, splits = mla_jit.get_mla_metadata(lens, 16, 1)
    out, lse = mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits)
    assert out.shape == (2, 1, 16, 512) and lse.shape == (2, 16, 1)
    q2 = q.clone()  # new data, same signature
    mla_jit.flash_mla_with_kvcache(q2, k_cache, block_table, lens, 512, meta, splits, softmax_scale=0.5,
                                   causal=True)
    # The torch op (what a compiled graph calls) rides the same plan; the schema's defaults apply.
    torch.ops.mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits)
    (plan,) = _FakeDecodePlan.built
    assert plan.calls == [(q.data_ptr(), meta.data_ptr(), 576 ** -0.5, False),
                          (q2.data_ptr(), meta.data_ptr(), 0.5, True),
                          (q.data_ptr(), meta.data_ptr(), 576 ** -0.5, False)]
    # Another signature (h_q), another plan; an empty batch needs none.
    mla_jit.flash_mla_with_kvcache(*_inputs(h_q=32)[:1], k_cache, block_table, lens, 512, meta, splits)
    assert len(_FakeDecodePlan.built) == 2
    q0, k0, bt0, lens0 = _inputs(b=0)
    meta0, splits0 = mla_jit.get_mla_metadata(lens0, 16, 1)
    out0, lse0 = mla_jit.flash_mla_with_kvcache(q0, k0, bt0, lens0, 512, meta0, splits0)
    assert out0.shape == (0, 1, 16, 512) and lse0.shape == (0, 16, 1) and len(_FakeDecodePlan.built) == 2


def test_bad_arguments_raise_typed_errors_naming_them(stub_gpu):
    q, k_cache, block_table, lens = _inputs()
    meta, splits = mla_jit.get_mla_metadata(lens, 16, 1)
    good = dict(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=lens, head_dim_v=512,
                tile_scheduler_metadata=meta, num_splits=splits)
    mla_jit.flash_mla_with_kvcache(**good)  # warm: the bad calls below must not ride its plan
    bad = [("q", q.float(), "q"), ("q", q[..., :512], "k_cache"), ("q", q.expand(2, 17, 16, 576), "s_q"),
           ("q", torch.randn(2, 1, 256, 576).to(torch.bfloat16), "query heads per KV head"),
           ("q", torch.randn(2, 1, 16, 584).to(torch.bfloat16)[..., 1:577],
            "16-byte"),
           ("q", "not a tensor", "q"),
           ("k_cache", k_cache.half(), "k_cache"), ("k_cache", k_cache.view(-1, 32, 1, 576)[:, :24], "k_cache"),
           ("k_cache", torch.randn(8, 48, 1, 576).to(torch.bfloat16), "page block size"),
           ("k_cache", torch.randn(8, 64, 3, 576).to(torch.bfloat16), "h_kv"),
           ("head_dim_v", 256, "head_dim_v"), ("head_dim_v", "512", "head_dim_v"),
           ("block_table", block_table.long(), "block_table"), ("block_table", block_table[:1], "block_table"),
           ("cache_seqlens", lens[:1], "cache_seqlens"), ("cache_seqlens", lens.long(), "cache_seqlens"),
           ("num_splits", splits[:-1], "num_splits"),
           ("tile_scheduler_metadata", meta[:, :4], "tile_scheduler_metadata"),
           ("tile_scheduler_metadata", meta.float(), "tile_scheduler_metadata")]
    for name, value, match in bad:
        with pytest.raises(mla_jit.InvalidArgumentError, match=match) as info:
            mla_jit.flash_mla_with_kvcache(**{**good, name: value})
        assert info.value.argument.startswith(name) or match in info.value.argument, (name, str(info.value))
    for scale in (float("nan"), float("inf"), "0.1", [0.1]):
        with pytest.raises(mla_jit.InvalidArgumentError, match="softmax_scale"):
            mla_jit.flash_mla_with_kvcache(**good, softmax_scale=scale)
    for args, match in (((lens, 16, 0), "num_heads_k"), ((lens, 16, 9), "num_heads_k"), ((lens, 0, 1), "num_q_tokens"),
                        ((lens, "16", 1), "num_q_tokens"), ((lens.long(), 16, 1), "cache_seqlens"),
                        ((lens.view(1, 2), 16, 1), "cache_seqlens")):
        with pytest.raises(mla_jit.InvalidArgumentError, match=match):
            mla_jit.get_mla_metadata(*args)
    assert len(_FakeDecodePlan.built) == 1


@pytest.mark.parametrize("name,value", [("is_fp8_kvcache", True), ("attn_sink", torch.zeros(16)),
                                        ("extra_k_cache", torch.zeros(1)), ("extra_indices_in_kvcache", torch.zeros(1)),
                                        ("topk_length", torch.zeros(2)), ("extra_topk_length", torch.zeros(2))])
def test_sparse_arguments_without_indices_say_the_feature_is_not_available(stub_gpu, name, value):
    """The record format and the sparse arguments serve the sparse decode (with indices; its own
    tests: test_sparse_decode_cpu.py); in a dense call, and the extra cache anywhere, they are not
    available."""
    q, k_cache, block_table, lens = _inputs()
    meta, splits = mla_jit.get_mla_metadata(lens, 16, 1)
    with pytest.raises(mla_jit.FeatureNotAvailableError, match=name) as info:
        mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits, **{name: value})
    assert info.value.argument == name and "not available" in str(info.value)
    assert isinstance(info.value, NotImplementedError)
    with pytest.raises(mla_jit.FeatureNotAvailableError, match="is_fp8_kvcache"):
        mla_jit.get_mla_metadata(lens, 16, 1, is_fp8_kvcache=True)
    with pytest.raises(mla_jit.FeatureNotAvailableError, match="is_fp8_kvcache"):   # a sparse bf16 cache
        mla_jit.get_mla_metadata(lens, 16, 1, 16, False, 2048)


FP8 = torch.float8_e4m3fn


def test_fp8_calls_pass_their_descales_and_return_bf16(stub_gpu):
    """vLLM's flash_mla_with_kvcache_fp8 and SGLang's flash_mla_with_kvcache(descale_q=, descale_k=)
    share one plan per signature; the descale tensors (their pointers) are passed on every call.
    Given or None (1.0) is part of the signature."""
    q, k_cache, block_table, lens = _inputs(dtype=FP8)
    meta, splits = mla_jit.get_mla_metadata(lens, 16, 1)
    dq, dk, dq2, dk2 = torch.tensor([0.5]), torch.tensor([0.25]), torch.tensor([2.0]), torch.tensor([4.0])
    out, lse = mla_jit.flash_mla_with_kvcache_fp8(q, k_cache, block_table, lens, 512, meta, splits, None, True, dq, dk)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 1, 16, 512) and lse.dtype == torch.float32
    mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits, causal=True, descale_q=dq2,
                                   descale_k=dk2)
    torch.ops.mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits, None, True, dq, dk)
    (plan,) = _FakeDecodePlan.built
    assert [(a is x, b is y) for (a, b), (x, y) in zip(plan.descales, ((dq, dk), (dq2, dk2), (dq, dk)))] == \
        [(True, True)] * 3
    assert [call[3] for call in plan.calls] == [True] * 3
    mla_jit.flash_mla_with_kvcache_fp8(q, k_cache, block_table, lens, 512, meta, splits)
    mla_jit.flash_mla_with_kvcache_fp8(q, k_cache, block_table, lens, 512, meta, splits, descale_k=dk)
    assert len(_FakeDecodePlan.built) == 3
    assert _FakeDecodePlan.built[1].descales == [(None, None)] and _FakeDecodePlan.built[2].descales == [(None, dk)]
    # FlashMLA's current schedule form; an empty batch (no plan) returns bf16 too.
    sched, _ = mla_jit.get_mla_metadata()
    out, _ = mla_jit.flash_mla_with_kvcache_fp8(q, k_cache, block_table, lens, 512, sched, None, descale_q=dq,
                                                descale_k=dk)
    assert sched.have_initialized and out.dtype == torch.bfloat16 and len(_FakeDecodePlan.built) == 3
    q0, k0, bt0, lens0 = _inputs(b=0, dtype=FP8)
    meta0, splits0 = mla_jit.get_mla_metadata(lens0, 16, 1)
    out0, lse0 = mla_jit.flash_mla_with_kvcache_fp8(q0, k0, bt0, lens0, 512, meta0, splits0, descale_q=dq)
    assert out0.shape == (0, 1, 16, 512) and out0.dtype == torch.bfloat16 and lse0.shape == (0, 16, 1)


def test_fp8_bad_arguments_raise_typed_errors_naming_them(stub_gpu):
    q, k_cache, block_table, lens = _inputs(dtype=FP8)
    bf16_q, bf16_cache = _inputs()[:2]
    meta, splits = mla_jit.get_mla_metadata(lens, 16, 1)
    one = torch.ones(1)
    good = dict(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=lens, head_dim_v=512,
                tile_scheduler_metadata=meta, num_splits=splits, descale_q=one, descale_k=one)
    mla_jit.flash_mla_with_kvcache(**good)  # warm: the bad calls below must not ride its plan
    bad = [(dict(k_cache=bf16_cache), "k_cache", "float8_e4m3fn"),   # FP8 q, bf16 cache
           (dict(descale_q=one.double()), "descale_q", "float32"), (dict(descale_k=one.half()), "descale_k", "float32"),
           (dict(descale_q=torch.ones(2)), "descale_q", "shape"),
           (dict(descale_k=torch.ones(1, 1)), "descale_k", "dims"),
           (dict(descale_k=1.0), "descale_k", "Tensor"),
           (dict(q=bf16_q, k_cache=bf16_cache), "descale_q", "FP8"),              # descales with a bf16 cache
           (dict(q=bf16_q, k_cache=bf16_cache, descale_q=None), "descale_k", "FP8"),
           # Strides of 8 elements are 16 bytes of bf16 but 8 of e4m3.
           (dict(q=torch.zeros(2, 1, 16, 584, dtype=FP8)[..., :576]), "q", "16 bytes")]
    for change, name, match in bad:
        with pytest.raises(mla_jit.InvalidArgumentError, match=match) as info:
            mla_jit.flash_mla_with_kvcache(**{**good, **change})
        assert info.value.argument == name, (name, str(info.value))
    mla_jit.flash_mla_with_kvcache(**{**good, "q": torch.zeros(2, 1, 16, 592, dtype=FP8)[..., :576]})  # 16 B strides
    # Another device than q's (the signature tells devices apart by index: CUDA's, or -1 for both
    # the CPU and meta, so without the warm plans here).
    runtime.decode_plans.clear()
    with pytest.raises(mla_jit.InvalidArgumentError, match="meta") as info:
        mla_jit.flash_mla_with_kvcache(**{**good, "descale_q": torch.ones(1, device="meta")})
    assert info.value.argument == "descale_q"
    # A bf16 q over the FP8 cache (de-quantized on chip) takes descale_k only.
    with pytest.raises(mla_jit.InvalidArgumentError, match="FP8") as info:
        mla_jit.flash_mla_with_kvcache(**{**good, "q": bf16_q})
    assert info.value.argument == "descale_q"
    out, _ = mla_jit.flash_mla_with_kvcache(**{**good, "q": bf16_q, "descale_q": None})
    assert out.dtype == torch.bfloat16
    with pytest.raises(mla_jit.InvalidArgumentError, match="k_cache"):
        mla_jit.flash_mla_with_kvcache_fp8(bf16_q, bf16_cache, block_table, lens, 512, meta, splits)
    # is_fp8_kvcache keeps FlashMLA's meaning (its sparse records): not available, FP8 tensors or not.
    with pytest.raises(mla_jit.FeatureNotAvailableError, match="is_fp8_kvcache"):
        mla_jit.flash_mla_with_kvcache(**good, is_fp8_kvcache=True)
    assert len(_FakeDecodePlan.built) == 3   # the good call's, the 16-byte strides' and the bf16 q's


def test_fp8_fake_implementation_returns_bf16_out():
    q = torch.empty(3, 2, 16, 576, dtype=FP8, device="meta")
    k_cache = torch.empty(10, 64, 1, 576, dtype=FP8, device="meta")
    block_table = torch.empty(3, 4, dtype=torch.int32, device="meta")
    lens, splits = torch.empty(3, dtype=torch.int32, device="meta"), torch.empty(4, dtype=torch.int32, device="meta")
    meta = torch.empty(66, 8, dtype=torch.int32, device="meta")
    one = torch.empty(1, device="meta")
    mla_jit.flash_mla_with_kvcache  # registers the ops
    for descales in ((), (one, one), (None, one)):
        out, lse = torch.ops.mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits, None,
                                                            True, *descales)
        assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((3, 2, 16, 512), torch.bfloat16, (3, 16, 2),
                                                                torch.float32)
    out, _ = torch.ops.mla_jit.flash_mla_with_kvcache(q.to(torch.float16), k_cache.to(torch.float16), block_table,
                                                      lens, 512, meta, splits)
    assert out.dtype == torch.float16


def test_lazy_schedule_is_filled_once_and_checked_for_consistency(stub_gpu):
    q, k_cache, block_table, lens = _inputs(b=2, s_q=2, h_q=32)
    sched, none = mla_jit.get_mla_metadata()
    assert none is None and not sched.have_initialized and sched.tile_scheduler_metadata is None
    out, lse = mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, sched, None, causal=True)
    assert sched.have_initialized and _FakeMetadataPlan.runs == 1
    assert sched.config == mla_jit.FlashMLASchedMeta.Config(2, 2, 32, 64, 1, True, False, None, None, None)
    assert sched.tile_scheduler_metadata.shape == (3, 8) and sched.num_splits.shape == (3,)
    for _ in range(3):  # every later layer: the same schedule tensors, no new metadata launch
        mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, sched, None, causal=True)
    assert _FakeMetadataPlan.runs == 1
    (plan,) = _FakeDecodePlan.built
    assert {call[1] for call in plan.calls} == {sched.tile_scheduler_metadata.data_ptr()}
    mismatches = [(dict(q=_inputs(b=3, s_q=2, h_q=32)[0]), "b=3"), (dict(q=_inputs(s_q=1, h_q=32)[0]), "s_q=1"),
                  (dict(q=_inputs(s_q=2, h_q=16)[0]), "h_q=16"), (dict(causal=False), "causal=False"),
                  (dict(k_cache=torch.randn(8, 16, 1, 576).to(torch.bfloat16)), "page_block_size=16")]
    base = dict(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=lens, head_dim_v=512,
                tile_scheduler_metadata=sched, num_splits=None, causal=True)
    for change, match in mismatches:
        with pytest.raises(mla_jit.InvalidArgumentError, match=match) as info:
            mla_jit.flash_mla_with_kvcache(**{**base, **change})
        assert info.value.argument == "tile_scheduler_metadata"
    with pytest.raises(mla_jit.InvalidArgumentError, match="num_splits"):
        mla_jit.flash_mla_with_kvcache(**{**base, "num_splits": sched.num_splits})
    fresh, _ = mla_jit.get_mla_metadata()
    with pytest.raises(mla_jit.InvalidArgumentError, match="k_cache"):
        mla_jit.flash_mla_with_kvcache(**{**base, "tile_scheduler_metadata": fresh, "k_cache": k_cache[0]})


def test_a_renamed_copy_of_the_package_registers_its_own_namespace(tmp_path):
    """bench_decode.py --against-package imports a previous commit's package beside this one: each
    registers its ops under its own name, so the two never collide."""
    import shutil
    shutil.copytree(REPO / "mla_jit", tmp_path / "mla_jit_copy", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import torch, mla_jit, mla_jit_copy; mla_jit.flash_mla_with_kvcache; mla_jit_copy.flash_mla_with_kvcache; "
            "print(torch.ops.mla_jit.flash_mla_with_kvcache.default._schema.name, "
            "torch.ops.mla_jit_copy.flash_mla_with_kvcache.default._schema.name)")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["mla_jit::flash_mla_with_kvcache", "mla_jit_copy::flash_mla_with_kvcache"]

"""GPU-free: arch parsing, configs, rendering of every registered template, TMA validation."""
import dataclasses

import pytest
import torch

import mla_jit
from mla_jit import presets
from mla_jit.jit import arch as arch_mod
from mla_jit.jit import render, tma
from mla_jit.jit.arch import Arch, parse_arch
from mla_jit.runtimes import registry


@pytest.mark.parametrize("text,name", [("sm_90a", "sm_90a"), ("sm90", "sm_90a"), ("9.0", "sm_90a"),
                                       ("sm_80", "sm_80"), ("86", "sm_86"), ("compute_89", "sm_89")])
def test_parse_arch(text, name):
    assert parse_arch(text).name == name


@pytest.mark.parametrize("text", ["sm_70", "sm_100a", "hopper", ""])
def test_parse_arch_rejects(text):
    with pytest.raises(mla_jit.UnsupportedArchError):
        parse_arch(text)


def test_cubin_compatibility_rules():
    assert Arch(9, 0, "a").can_run_cubin_for(Arch(9, 0, "a"))
    assert Arch(8, 6).can_run_cubin_for(Arch(8, 0))
    assert not Arch(9, 0, "a").can_run_cubin_for(Arch(8, 0))
    assert not Arch(8, 0).can_run_cubin_for(Arch(8, 6))


def test_override_selects_older_family_but_targets_the_gpu(monkeypatch):
    arch_mod._resolve_for_device.cache_clear()
    monkeypatch.setattr(arch_mod, "device_arch", lambda i: Arch(9, 0, "a"))
    monkeypatch.setenv("MLA_JIT_ARCH", "sm_80")
    pair = arch_mod.resolve_for_device(0)
    assert (pair.tuning.name, pair.target.name) == ("sm_80", "sm_90a")
    monkeypatch.setattr(arch_mod, "device_arch", lambda i: Arch(8, 0))
    monkeypatch.setenv("MLA_JIT_ARCH", "sm_90a")
    with pytest.raises(mla_jit.UnsupportedArchError, match="cannot run"):
        arch_mod.resolve_for_device(0)
    arch_mod._resolve_for_device.cache_clear()


def _all_configs():
    out = []
    for family in registry.families().values():
        for tuning in family.tunings:
            pair = arch_mod.resolve_for_build(tuning)
            for cfg in family.prewarm_configs(pair.tuning, presets.resolve(None)):
                out.append((family, cfg, pair))
    return out


def test_every_template_renders_for_every_prewarm_config():
    rendered = _all_configs()
    assert {f.template for f, _, _ in rendered} == set(render.template_names())
    for family, cfg, pair in rendered:
        src = family.source(cfg, pair)
        for entry in src.entry_points:
            assert f'extern "C" __global__' in src.source and entry in src.source
        assert "{{" not in src.source and "{%" not in src.source


def test_missing_template_parameter_is_an_error():
    import jinja2
    with pytest.raises(jinja2.UndefinedError):
        render.render("tile_copy.cu.j2", {"entry": "x"})


def test_config_spec_round_trip():
    for family, cfg, pair in _all_configs():
        assert family.config_from_spec(family.config_spec(cfg)) == cfg
        assert family.config_spec(cfg) in family.prewarm_command(cfg, pair)


def test_configs_are_frozen_and_cached():
    from mla_jit.configs.toy import tile_copy_config
    a = tile_copy_config("bf16", Arch(9, 0, "a"))
    assert a is tile_copy_config("bf16", Arch(9, 0, "a"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.block_rows = 1


@pytest.mark.parametrize("spec,match", [
    (tma.TmaSpec(torch.bfloat16, (64, 64), (60,), (64, 64)), "strides"),
    (tma.TmaSpec(torch.bfloat16, (64, 64), (64,), (300, 1)), "box"),
    (tma.TmaSpec(torch.bfloat16, (64, 64), (64,), (4, 1)), "multiple of 16 bytes"),
    (tma.TmaSpec(torch.bfloat16, (128, 64), (128,), (128, 8), swizzle=128), "at most 128 bytes"),
    (tma.TmaSpec(torch.bfloat16, (64, 64), (64,), (64, 8), swizzle=16), "swizzle"),
    (tma.TmaSpec(torch.bfloat16, (64, 64), (64, 64), (64, 8)), "shape"),
    (tma.TmaSpec(torch.complex64, (64, 64), (64,), (64, 8)), "dtype"),
    (tma.TmaSpec(torch.bfloat16, (64, 64), (64,), (64, 8), l2_promotion=32), "L2 promotion"),
])
def test_tma_validation(spec, match):
    with pytest.raises(mla_jit.InvalidArgumentError, match=match):
        tma.validate(spec, 1 << 20)


def test_tma_validation_alignment_and_ok():
    spec = tma.TmaSpec(torch.bfloat16, (576, 4096), (576,), (64, 64), swizzle=128)
    assert tma.validate(spec, 1 << 20) == 2
    with pytest.raises(mla_jit.InvalidArgumentError, match="aligned"):
        tma.validate(spec, (1 << 20) + 8)


def test_import_has_no_side_effects(tmp_path):
    import subprocess
    import sys
    code = ("import mla_jit, mla_jit.ops.toy, mla_jit.cli, torch, os, sys; "
            "assert not torch.cuda.is_initialized(); "
            "assert not os.path.exists(os.environ['MLA_JIT_CACHE_DIR'])")
    env = {"MLA_JIT_CACHE_DIR": str(tmp_path / "never"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)

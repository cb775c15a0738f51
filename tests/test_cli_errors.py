"""GPU-free: the CLI and build path under offline mode, its typed errors, finding nvcc, and a warm prewarm."""
from pathlib import Path

import pytest

from mla_jit import cli
from mla_jit.jit import build as build_mod
from mla_jit.jit import env as env_mod

from .cli_helpers import TILE_COPY_SPEC, no_traceback, run_cli


# ---- 6. prewarm compiles under MLA_JIT_OFFLINE=1 -------------------------------------------------


def test_prewarm_compiles_in_offline_mode(cli_env):
    env = {**cli_env, "MLA_JIT_OFFLINE": "1"}
    proc = run_cli("prewarm", "--config", TILE_COPY_SPEC, "--jobs", "1", env_extra=env)
    assert proc.returncode == 0, proc.stderr
    assert "prewarm: 1 compiled, 0 already cached, 0 failed" in proc.stdout
    assert "prewarm` compiles regardless" in env_mod.ENV_VARS["MLA_JIT_OFFLINE"].help


# ---- 7. typed errors with their reason -----------------------------------------------------------


@pytest.mark.parametrize("env_extra,argv,expect", [
    ({"MLA_JIT_LOCK_TIMEOUT": "abc"}, ["prewarm", "--config", TILE_COPY_SPEC], "MLA_JIT_LOCK_TIMEOUT='abc'"),
    ({"MLA_JIT_ARCH": "sm_100a"}, ["prewarm"], "MLA_JIT_ARCH=sm_100a: unsupported architecture sm_100a; "
                                              "supported: sm_80, sm_86, sm_89, sm_90a"),
    ({}, ["prewarm", "--arch", "sm_100a"], "unsupported architecture sm_100a; supported: sm_80, sm_86, sm_89, sm_90a"),
    ({}, ["prewarm", "--arch", "sm_90a@sm_80"], "TARGET >= TUNING"),
    ({"MLA_JIT_COMPILER": "gcc"}, ["prewarm"], "MLA_JIT_COMPILER='gcc'"),
    ({"MLA_JIT_DISABLE_CACHE": "1"}, ["prewarm"], "MLA_JIT_DISABLE_CACHE=1"),
])
def test_errors_are_one_line_without_traceback(cli_env, env_extra, argv, expect):
    proc = run_cli(*argv, env_extra={**cli_env, **env_extra})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    no_traceback(proc)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("mla-jit: error: ") and expect in lines[0], proc.stderr


def test_offline_miss_names_the_roots_searched(cache_root, tmp_path, monkeypatch):
    import mla_jit
    from .helpers import toy_source
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setenv("MLA_JIT_READONLY_CACHE_DIRS", str(shipped))
    monkeypatch.setenv("MLA_JIT_OFFLINE", "1")
    with pytest.raises(mla_jit.OfflineCacheMissError) as info:
        build_mod.build(toy_source())
    assert info.value.roots == (str(cache_root), str(shipped))
    assert f"searched {cache_root}, {shipped}" in str(info.value)


# ---- 8. nvcc under /usr/local/cuda; tests skip without nvcc ---------------------------------------


def _fake_cuda_home(tmp_path) -> Path:
    home = tmp_path / "usr_local_cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Build fake'\n")
    nvcc.chmod(0o755)
    return home


def _no_nvcc_env(monkeypatch, tmp_path):
    monkeypatch.delenv("MLA_JIT_NVCC", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    empty = tmp_path / "empty_bin"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))


def test_nvcc_is_found_under_the_system_cuda_home(monkeypatch, tmp_path):
    from mla_jit.jit.compiler import NvccCompiler, get_compiler
    _no_nvcc_env(monkeypatch, tmp_path)
    home = _fake_cuda_home(tmp_path)
    monkeypatch.setattr(NvccCompiler, "SYSTEM_CUDA_HOMES", (str(home),))
    nvcc = get_compiler("nvcc")
    assert nvcc.executable() == str(home / "bin" / "nvcc")
    assert nvcc.candidates()[-1] == str(home / "bin" / "nvcc")   # looked at last
    assert NvccCompiler.SYSTEM_CUDA_HOMES != ("/usr/local/cuda",)
    monkeypatch.setattr(NvccCompiler, "SYSTEM_CUDA_HOMES", ("/usr/local/cuda",))
    assert nvcc.candidates() == ["/usr/local/cuda/bin/nvcc"]


def test_tests_needing_nvcc_skip_without_it(monkeypatch, tmp_path):
    import mla_jit
    from mla_jit.jit.compiler import NvccCompiler, get_compiler
    from .helpers import require_nvcc
    _no_nvcc_env(monkeypatch, tmp_path)
    monkeypatch.setattr(NvccCompiler, "SYSTEM_CUDA_HOMES", (str(tmp_path / "no_cuda"),))
    with pytest.raises(mla_jit.MlaJitError, match="nvcc not found"):
        get_compiler("nvcc").executable()
    with pytest.raises(pytest.skip.Exception, match="needs nvcc: nvcc not found"):
        require_nvcc()
    monkeypatch.setenv("MLA_JIT_NVCC", str(tmp_path / "nope"))
    with pytest.raises(mla_jit.ConfigError, match="MLA_JIT_NVCC"):
        get_compiler("nvcc").executable()


# ---- 9. a warm prewarm does not start compile processes -------------------------------------------


def test_warm_prewarm_starts_no_process(cache_root, monkeypatch, capsys):
    import concurrent.futures
    assert cli.main(["prewarm", "--op", "tile_copy", "--jobs", "1"]) == 0
    assert "3 compiled" in capsys.readouterr().out
    build_mod.clear_memo()

    def refuse(*a, **k):
        raise AssertionError("a warm prewarm must not start worker processes")
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", refuse)
    assert cli.main(["prewarm", "--op", "tile_copy", "--jobs", "4"]) == 0
    out = capsys.readouterr().out
    assert "prewarm: 0 compiled, 3 already cached, 0 failed" in out


def test_prewarm_compiles_only_the_misses_in_workers(cli_env):
    assert run_cli("prewarm", "--config", TILE_COPY_SPEC, "--jobs", "1", env_extra=cli_env).returncode == 0
    proc = run_cli("prewarm", "--op", "tile_copy", "--jobs", "2", env_extra=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert "prewarming 3 kernel(s): 1 already cached, compiling 2 with 2 process(es)" in proc.stdout
    assert "prewarm: 2 compiled, 1 already cached, 0 failed" in proc.stdout

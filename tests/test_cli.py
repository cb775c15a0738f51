"""GPU-free: every CLI command, through the installed console script."""
import json
import os
import shutil
import subprocess

import pytest


def _mla_jit(*args, env_extra=None, check=True):
    exe = shutil.which("mla-jit")
    assert exe, "the mla-jit console script is not installed"
    env = {**os.environ, **(env_extra or {})}
    proc = subprocess.run([exe, *args], capture_output=True, text=True, env=env)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture
def cli_env(tmp_path):
    return {"MLA_JIT_CACHE_DIR": str(tmp_path / "cache"), "MLA_JIT_OFFLINE": "0"}


def test_prewarm_list_info_clear(cli_env):
    out = _mla_jit("prewarm", "--op", "tile_copy", "--jobs", "2", env_extra=cli_env).stdout
    assert "prewarm: 3 compiled, 0 already cached, 0 failed" in out
    again = _mla_jit("prewarm", "--op", "tile_copy", "--arch", "sm_90a", env_extra=cli_env).stdout
    assert "0 compiled, 3 already cached, 0 failed" in again

    rows = json.loads(_mla_jit("list", "--json", env_extra=cli_env).stdout)
    assert len(rows) == 3 and {r["arch"] for r in rows} == {"sm_90a"}
    assert all(r["valid_manifest"] and r["size_bytes"] > 0 for r in rows)
    assert "tile_copy-bf16" in _mla_jit("list", env_extra=cli_env).stdout

    info = json.loads(_mla_jit("info", "--json", env_extra=cli_env).stdout)
    assert info["cache_roots"][0]["entries"] == 3
    assert info["versions"]["nvrtc_identity"].startswith("nvrtc-")
    assert info["env"]["MLA_JIT_CACHE_DIR"] == cli_env["MLA_JIT_CACHE_DIR"]
    assert "gpu" in info

    assert "removed 3" in _mla_jit("clear", "--yes", env_extra=cli_env).stdout
    assert json.loads(_mla_jit("list", "--json", env_extra=cli_env).stdout) == []


def test_prewarm_presets_and_errors(cli_env):
    bad = _mla_jit("prewarm", "--preset", "no-such-model", env_extra=cli_env, check=False)
    assert bad.returncode == 2 and "unknown preset" in bad.stderr
    bad = _mla_jit("prewarm", "--arch", "sm_70", env_extra=cli_env, check=False)
    assert bad.returncode == 2 and "sm_70" in bad.stderr
    bad = _mla_jit("prewarm", "--op", "nope", env_extra=cli_env, check=False)
    assert bad.returncode == 2 and "unknown op" in bad.stderr
    # No family serves sm_80 yet for the toy ops: nothing to do, not an error.
    ok = _mla_jit("prewarm", "--arch", "sm_80", "--op", "tile_copy", env_extra=cli_env)
    assert "nothing to prewarm" in ok.stdout


def test_clear_asks_for_confirmation(cli_env):
    os.makedirs(cli_env["MLA_JIT_CACHE_DIR"])   # a missing root has nothing to clear: no question
    proc = subprocess.run([shutil.which("mla-jit"), "clear"], input="n\n", capture_output=True, text=True,
                          env={**os.environ, **cli_env})
    assert proc.returncode == 1 and "nothing removed" in proc.stdout

import os

import pytest


def _hopper_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _hopper_available():
        return
    skip = pytest.mark.skip(reason="needs a Hopper (sm90) GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    """A fresh, private writable cache root and a clean in-process memo."""
    from mla_jit.jit import build
    root = tmp_path / "cache"
    monkeypatch.setenv("MLA_JIT_CACHE_DIR", str(root))
    for var in ("MLA_JIT_READONLY_CACHE_DIRS", "MLA_JIT_OFFLINE", "MLA_JIT_DISABLE_CACHE", "MLA_JIT_ARCH"):
        monkeypatch.delenv(var, raising=False)
    build.clear_memo()
    yield root
    build.clear_memo()


@pytest.fixture(params=["nvrtc", "nvcc"])
def compiler_env(request, monkeypatch):
    if request.param == "nvcc":
        from .helpers import require_nvcc
        require_nvcc()
    monkeypatch.setenv("MLA_JIT_COMPILER", request.param)
    return request.param


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile.gettempdir() (where the per-user fallback cache root lives) as a fresh directory."""
    import tempfile
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def pytest_report_header(config):
    return f"mla_jit GPU tests: {'enabled' if _hopper_available() else 'skipped (no Hopper GPU)'}; " \
           f"MLA_JIT_COMPILER={os.environ.get('MLA_JIT_COMPILER', 'nvrtc')}"


@pytest.fixture
def cli_env(tmp_path):
    """Environment of a CLI subprocess: a private cache root and TMPDIR, every other knob at its default."""
    from mla_jit.jit import env as env_mod
    tmp = tmp_path / "tmp"   # TMPDIR of the CLI: where a fallback or temporary root would appear
    tmp.mkdir()
    env = {"MLA_JIT_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp)}
    for var in ("MLA_JIT_OFFLINE", "MLA_JIT_READONLY_CACHE_DIRS", "MLA_JIT_DISABLE_CACHE", "MLA_JIT_ARCH",
                "MLA_JIT_LOCK_TIMEOUT", "MLA_JIT_COMPILER"):
        env[var] = env_mod.ENV_VARS[var].default
    return env

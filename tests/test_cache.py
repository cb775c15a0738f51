"""GPU-free: cache keys, publish, integrity, locks, races, roots, offline mode."""
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import mla_jit
from mla_jit.cache import key as cache_key
from mla_jit.cache import store
from mla_jit.jit import build as build_mod
from mla_jit.jit.build import build, kernel_key
from mla_jit.jit.compiler import get_compiler

from .helpers import toy_source

REPO = Path(__file__).resolve().parent.parent


def _key(src=None):
    return kernel_key(src or toy_source(), get_compiler("nvrtc"))


def test_key_is_stable_and_content_only():
    assert _key() == _key()
    assert _key(toy_source("fp32")) != _key(toy_source("bf16"))
    assert kernel_key(toy_source(), get_compiler("nvcc")) != _key()


def test_changed_header_changes_key(tmp_path):
    include = tmp_path / "include"
    shutil.copytree(REPO / "mla_jit" / "include", include)
    source = toy_source().source
    before = cache_key.header_digest(source, include)
    header = include / "mla_jit" / "common" / "sm90.cuh"
    header.write_text(header.read_text() + "\n// changed\n")
    cache_key.clear_memo()
    assert cache_key.header_digest(source, include) != before
    # A header the source cannot include does not change its key.
    (include / "mla_jit" / "unrelated.cuh").write_text("// not included by the toy kernel\n")
    cache_key.clear_memo()
    assert cache_key.header_digest(source, include) == cache_key.header_digest(source, include)


def test_header_included_by_relative_path_is_part_of_the_key(tmp_path):
    """splitkv_ws.cuh includes its siblings as "common.cuh": an edit there (or in what it includes)
    must change the key of every decode kernel built from it."""
    include = tmp_path / "include"
    shutil.copytree(REPO / "mla_jit" / "include", include)
    source = '#include "mla_jit/decode/splitkv_ws.cuh"\n'
    reached = dict(cache_key._reachable_headers(source, include))
    assert {"mla_jit/decode/common.cuh", "mla_jit/decode/combine.cuh", "mla_jit/common/sm90.cuh"} <= set(reached)
    before = cache_key.header_digest(source, include)
    header = include / "mla_jit" / "decode" / "common.cuh"
    header.write_text(header.read_text() + "\n// changed\n")
    cache_key.clear_memo()
    assert cache_key.header_digest(source, include) != before


def test_relocated_package_gives_the_same_key(tmp_path):
    shutil.copytree(REPO / "mla_jit", tmp_path / "mla_jit", ignore=shutil.ignore_patterns("__pycache__"))
    code = textwrap.dedent("""
        import mla_jit, sys
        from tests.helpers import toy_source
        from mla_jit.jit.build import kernel_key
        from mla_jit.jit.compiler import get_compiler
        assert mla_jit.__file__.startswith(sys.argv[1]), mla_jit.__file__
        print(kernel_key(toy_source(), get_compiler("nvrtc")))
    """)
    shutil.copytree(REPO / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == _key()


def test_compile_then_disk_hit_then_relocated_root_hit(cache_root, tmp_path, monkeypatch):
    first = build(toy_source())
    assert first.origin == "compiled"
    build_mod.clear_memo()
    second = build(toy_source())
    assert second.origin == "disk" and second.cubin == first.cubin
    moved = tmp_path / "moved"
    shutil.copytree(cache_root, moved)
    monkeypatch.setenv("MLA_JIT_CACHE_DIR", str(moved))
    build_mod.clear_memo()
    third = build(toy_source())
    assert third.origin == "disk" and str(third.path).startswith(str(moved))


def test_entry_layout_and_manifest(cache_root):
    binary = build(toy_source())
    entry = binary.path
    assert entry.parent == cache_root / "sm_90a"
    assert entry.name == f"{binary.name}-{binary.key}"
    assert sorted(p.name for p in entry.iterdir()) == ["kernel.cu", "kernel.cubin", "manifest.json"]
    manifest = json.loads((entry / "manifest.json").read_text())
    for field in ("cubin_sha256", "compiler", "flags", "log", "compile_seconds", "key", "arch"):
        assert field in manifest
    assert oct(cache_root.stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "empty", "no_manifest"])
def test_damaged_entry_is_rebuilt(cache_root, damage):
    binary = build(toy_source())
    cubin = binary.path / "kernel.cubin"
    if damage == "corrupt":
        data = bytearray(cubin.read_bytes())
        data[len(data) // 2] ^= 0xFF
        cubin.write_bytes(bytes(data))
    elif damage == "truncate":
        cubin.write_bytes(cubin.read_bytes()[:100])
    elif damage == "empty":
        cubin.write_bytes(b"")
    else:
        (binary.path / "manifest.json").unlink()
    build_mod.clear_memo()
    rebuilt = build(toy_source())
    assert rebuilt.origin == "compiled"
    assert rebuilt.cubin == binary.cubin
    assert store.read_entry(store.CacheRoot(cache_root, True), "sm_90a", binary.name, binary.key) is not None


def test_readonly_root_is_used(cache_root, tmp_path, monkeypatch):
    shipped = build(toy_source())
    readonly = tmp_path / "shipped"
    shutil.copytree(cache_root, readonly)
    for path in sorted(readonly.rglob("*"), reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    monkeypatch.setenv("MLA_JIT_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("MLA_JIT_READONLY_CACHE_DIRS", f"{tmp_path / 'missing'}{os.pathsep}{readonly}")
    build_mod.clear_memo()
    hit = build(toy_source())
    assert hit.origin == "disk" and str(hit.path).startswith(str(readonly)) and hit.cubin == shipped.cubin
    assert not list((tmp_path / "empty").rglob("kernel.cubin"))


def test_unwritable_root_falls_back_with_one_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MLA_JIT_CACHE_DIR", str(blocker / "cache"))
    build_mod.clear_memo()
    with caplog.at_level("WARNING", logger="mla_jit"):
        binary = build(toy_source())
        store.writable_root()
    assert binary.origin == "compiled" and binary.path.is_dir()
    assert not str(binary.path).startswith(str(blocker))
    assert sum("not writable" in r.getMessage() for r in caplog.records) == 1
    build_mod.clear_memo()


def test_offline_mode_raises_with_prewarm_command_which_works(cache_root, monkeypatch, capsys):
    from mla_jit import cli
    monkeypatch.setenv("MLA_JIT_OFFLINE", "1")
    src = toy_source()
    with pytest.raises(mla_jit.OfflineCacheMissError) as info:
        build(src)
    err = info.value
    assert err.prewarm_command == src.prewarm_command and err.prewarm_command in str(err)
    assert src.name in str(err)
    assert not list(cache_root.rglob("kernel.cubin"))
    # The command in the error, run as printed, produces exactly the missing kernel.
    import shlex
    argv = shlex.split(err.prewarm_command)
    assert argv[0] == "mla-jit"
    monkeypatch.setenv("MLA_JIT_OFFLINE", "0")
    assert cli.main(argv[1:] + ["--jobs", "1"]) == 0
    monkeypatch.setenv("MLA_JIT_OFFLINE", "1")
    build_mod.clear_memo()
    assert build(src).origin == "disk"


def test_disabled_cache_compiles_in_memory(cache_root, monkeypatch):
    monkeypatch.setenv("MLA_JIT_DISABLE_CACHE", "1")
    binary = build(toy_source())
    assert binary.origin == "compiled" and binary.path is None
    assert not cache_root.exists() or not list(cache_root.rglob("kernel.cubin"))
    assert build(toy_source()) is binary  # memoized in the process


def _race_worker(args):
    cache_dir, barrier_path = args
    os.environ["MLA_JIT_CACHE_DIR"] = cache_dir
    while not os.path.exists(barrier_path):  # start together
        time.sleep(0.001)
    from tests.helpers import toy_source
    from mla_jit.jit.build import build
    from mla_jit.cache.store import sha256
    b = build(toy_source())
    return b.origin, sha256(b.cubin), str(b.path)


def test_eight_processes_race_on_one_cold_key(cache_root, tmp_path):
    barrier = tmp_path / "go"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(8) as pool:
        pending = pool.map_async(_race_worker, [(str(cache_root), str(barrier))] * 8)
        time.sleep(3.0)  # let every worker import and wait at the barrier
        barrier.write_text("go")
        results = pending.get(timeout=600)
    origins = [r[0] for r in results]
    assert origins.count("compiled") == 1, origins
    assert origins.count("disk") == 7
    assert len({r[1] for r in results}) == 1 and len({r[2] for r in results}) == 1
    entry = Path(results[0][2])
    assert store.sha256((entry / "kernel.cubin").read_bytes()) == results[0][1]


KILL_CHILD = textwrap.dedent("""
    import os, sys, time
    from mla_jit.cache import store
    real_write = store._write_synced
    def slow_write(path, data):
        real_write(path, data)
        if path.name == "kernel.cubin":
            print("WRITING", flush=True)
            time.sleep(60)
    store._write_synced = slow_write
    from tests.helpers import toy_source
    from mla_jit.jit.build import build
    build(toy_source())
""")


def test_kill_during_publish_leaves_no_entry_and_no_stale_lock(cache_root, monkeypatch):
    monkeypatch.setenv("MLA_JIT_LOCK_TIMEOUT", "30")
    child = subprocess.Popen([sys.executable, "-c", KILL_CHILD], stdout=subprocess.PIPE, text=True,
                             cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdout.readline().strip() == "WRITING"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    src = toy_source()
    key = _key(src)
    assert store.lookup("sm_90a", src.name, key, [store.CacheRoot(cache_root, True)]) is None
    assert not store.entry_dir(cache_root, "sm_90a", src.name, key).exists()
    t0 = time.perf_counter()
    binary = build(src)
    assert binary.origin == "compiled" and binary.path.is_dir()
    assert time.perf_counter() - t0 < 25  # the dead child's lock did not block us

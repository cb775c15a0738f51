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

from .helpers import require_nvcc, toy_source

REPO = Path(__file__).resolve().parent.parent


def _key(src=None):
    return kernel_key(src or toy_source(), get_compiler("nvrtc"))


def test_key_is_stable_and_content_only():
    assert _key() == _key()
    assert _key(toy_source("fp32")) != _key(toy_source("bf16"))


def test_key_depends_on_the_compiler():
    require_nvcc()
    assert kernel_key(toy_source(), get_compiler("nvcc")) != _key()


def test_changed_header_changes_key(tmp_path):
    include = tmp_path / "include"
    shutil.copytree(REPO / "mla_jit" / "include", include)
    source = toy_source().source
    before = cache_key.header_digest(source, include)
    header = include / "mla_jit" / "common" / "sm90.cuh"
    header.write_text(header.read_text() + "\n// changed\n")
    cache_key.clear_memo()
    changed = cache_key.header_digest(source, include)
    assert changed != before


def test_unrelated_header_leaves_the_key_alone(tmp_path):
    """A header the source cannot reach (even one under our include dir) does not enter its digest:
    the digest after adding it equals the digest computed before."""
    include = tmp_path / "include"
    shutil.copytree(REPO / "mla_jit" / "include", include)
    source = toy_source().source
    cache_key.clear_memo()
    before = cache_key.header_digest(source, include)
    (include / "mla_jit" / "unrelated.cuh").write_text("// not included by the toy kernel\n")
    (include / "mla_jit" / "toy" / "unrelated_sibling.cuh").write_text("// a sibling, not included\n")
    cache_key.clear_memo()
    after = cache_key.header_digest(source, include)
    assert after == before
    # The check can fail: including the new header does change the digest.
    cache_key.clear_memo()
    assert cache_key.header_digest(source + '#include "mla_jit/unrelated.cuh"\n', include) != before


def test_header_digest_is_memoized_and_cleared(tmp_path):
    include = tmp_path / "include"
    shutil.copytree(REPO / "mla_jit" / "include", include)
    source = '#include "mla_jit/toy/tile_copy.cuh"\n'
    cache_key.clear_memo()
    before = cache_key.header_digest(source, include)
    header = include / "mla_jit" / "toy" / "tile_copy.cuh"
    header.write_text(header.read_text() + "\n// changed\n")
    assert cache_key.header_digest(source, include) == before   # memoized: not re-read
    cache_key.clear_memo()
    assert cache_key.header_digest(source, include) != before


def test_third_party_version_files_enter_the_digest_by_label(tmp_path):
    include = tmp_path / "include"
    shutil.copytree(REPO / "mla_jit" / "include", include)
    a, b = tmp_path / "a" / "version.h", tmp_path / "b" / "version.h"
    for f in (a, b):
        f.parent.mkdir()
        f.write_text("#define V 1\n")
    source = toy_source().source
    cache_key.clear_memo()
    assert cache_key.header_digest(source, include, [("lib/version.h", a)]) == \
        cache_key.header_digest(source, include, [("lib/version.h", b)])       # no path in the digest
    b.write_text("#define V 2\n")
    cache_key.clear_memo()
    assert cache_key.header_digest(source, include, [("lib/version.h", a)]) != \
        cache_key.header_digest(source, include, [("lib/version.h", b)])


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


def test_unwritable_root_falls_back_with_one_warning(tmp_path, monkeypatch, caplog, private_tmp):
    """An op falls back to ONE private root per user, reused by every process (here: two builds with
    the in-process memo cleared in between), with one warning."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MLA_JIT_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("MLA_JIT_OFFLINE", raising=False)
    build_mod.clear_memo()
    build_mod._warned.clear()
    with caplog.at_level("WARNING", logger="mla_jit"):
        binary = build(toy_source())
        build_mod.target_root()
        build_mod.clear_memo()
        again = build(toy_source())
    fallback = private_tmp / f"mla_jit-cache-{os.getuid()}"
    assert binary.origin == "compiled" and binary.path.is_dir() and binary.path.parent.parent == fallback
    assert again.origin == "disk" and again.path == binary.path      # the same root, not a new one
    assert oct(fallback.stat().st_mode & 0o777) == "0o700"
    assert [p.name for p in private_tmp.iterdir()] == [fallback.name]  # no other temporary root
    warnings = [r.getMessage() for r in caplog.records if "not usable" in r.getMessage()]
    assert len(warnings) == 1 and str(blocker) in warnings[0] and str(fallback) in warnings[0]
    build_mod.clear_memo()


@pytest.mark.parametrize("problem", ["open_to_others", "symlink", "other_owner"])
def test_fallback_root_is_checked(tmp_path, monkeypatch, private_tmp, problem):
    fallback = private_tmp / f"mla_jit-cache-{os.getuid()}"
    if problem == "open_to_others":
        fallback.mkdir(mode=0o700)
        fallback.chmod(0o777)
    elif problem == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        fallback.symlink_to(tmp_path / "elsewhere")
    else:
        if os.getuid() != 0:
            pytest.skip("needs root to give the directory to another user")
        fallback.mkdir(mode=0o700)
        os.chown(fallback, 4242, -1)
    with pytest.raises(mla_jit.CacheError, match=str(fallback)):
        store.private_temp_root()


def test_missing_readonly_root_warns_once_per_path(cache_root, tmp_path, monkeypatch, caplog):
    missing_a, missing_b = tmp_path / "missing_a", tmp_path / "missing_b"
    monkeypatch.setenv("MLA_JIT_READONLY_CACHE_DIRS", f"{missing_a}{os.pathsep}{missing_b}")
    build_mod._warned.clear()
    with caplog.at_level("WARNING", logger="mla_jit"):
        for _ in range(3):
            roots = build_mod.cache_roots()
    assert [r.path for r in roots] == [cache_root]
    messages = [r.getMessage() for r in caplog.records if "MLA_JIT_READONLY_CACHE_DIRS" in r.getMessage()]
    assert len(messages) == 2
    assert str(missing_a) in messages[0] and str(missing_b) in messages[1]


def test_bad_lock_timeout_is_a_typed_error_naming_the_variable(cache_root, monkeypatch):
    monkeypatch.setenv("MLA_JIT_LOCK_TIMEOUT", "abc")
    with pytest.raises(mla_jit.ConfigError, match="MLA_JIT_LOCK_TIMEOUT"):
        build(toy_source())


def test_offline_mode_raises_with_prewarm_command_which_works(cache_root, monkeypatch, capsys):
    from mla_jit import cli
    monkeypatch.setenv("MLA_JIT_OFFLINE", "1")
    src = toy_source()
    with pytest.raises(mla_jit.OfflineCacheMissError) as info:
        build(src)
    err = info.value
    assert err.prewarm_command == src.prewarm_command and err.prewarm_command in str(err)
    assert src.name in str(err)
    assert err.roots[0] == str(cache_root) and str(cache_root) in str(err)   # where it looked
    assert not list(cache_root.rglob("kernel.cubin"))
    # The command in the error, run as printed, produces exactly the missing kernel.
    import shlex
    argv = shlex.split(err.prewarm_command)
    assert argv[0] == "mla-jit"
    # prewarm compiles whatever MLA_JIT_OFFLINE says (it governs ops only).
    assert cli.main(argv[1:] + ["--jobs", "1"]) == 0
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

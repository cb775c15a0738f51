"""GPU-free: the CLI as a new user meets it on a machine without a GPU (bad cache dirs, bad --config
specs, EOF and broken pipes, Ctrl-C, --help, startup cost; test_cli_errors.py has the rest)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mla_jit import cli, presets
from mla_jit.jit.arch import SUPPORTED_ARCHS
from mla_jit.runtimes import registry

from .cli_helpers import REPO, TILE_COPY_SPEC, no_traceback, run_cli


# ---- 1. an unusable MLA_JIT_CACHE_DIR ----------------------------------------------------------


def _unusable_dirs(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    dirs = [(blocker / "cache", "not a directory")]
    if Path("/proc/self").is_dir():
        dirs.append((Path("/proc/mla_jit_cache"), ""))
    return dirs


def test_prewarm_fails_on_an_unusable_cache_dir_before_compiling(cli_env, tmp_path):
    for cache_dir, reason in _unusable_dirs(tmp_path):
        env = {**cli_env, "MLA_JIT_CACHE_DIR": str(cache_dir)}
        proc = run_cli("prewarm", "--op", "tile_copy", "--jobs", "1", env_extra=env)
        assert proc.returncode != 0, proc.stdout
        no_traceback(proc)
        errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(errors) == 1 and errors[0].startswith("mla-jit: error: "), proc.stderr
        assert str(cache_dir) in errors[0] and reason in errors[0]
        assert "compiled" not in proc.stdout and "prewarming" not in proc.stdout
        assert list(Path(env["TMPDIR"]).iterdir()) == []   # no temporary root took the kernels


def test_list_info_clear_report_an_unusable_root_and_create_nothing(cli_env, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    env = {**cli_env, "MLA_JIT_CACHE_DIR": str(blocker / "cache")}
    listed = run_cli("list", env_extra=env)
    assert listed.returncode == 0 and "no cached kernels" in listed.stdout
    assert str(blocker / "cache") in listed.stderr and "unusable" in listed.stderr
    info = json.loads(run_cli("info", "--json", env_extra=env).stdout)
    root = info["cache_roots"][0]
    assert root["path"] == str(blocker / "cache") and root["status"] == "unusable"
    assert "not a directory" in root["problem"]
    cleared = run_cli("clear", "--yes", env_extra=env)
    assert cleared.returncode == 2 and str(blocker / "cache") in cleared.stderr
    no_traceback(cleared)
    # A missing root: reported as missing, and still not created.
    missing = {**cli_env, "MLA_JIT_CACHE_DIR": str(tmp_path / "not" / "yet")}
    assert "does not exist" in run_cli("list", env_extra=missing).stderr
    assert json.loads(run_cli("info", "--json", env_extra=missing).stdout)["cache_roots"][0]["status"] == "missing"
    assert "nothing to remove" in run_cli("clear", "--yes", env_extra=missing).stdout
    assert not (tmp_path / "not").exists()
    assert list(Path(cli_env["TMPDIR"]).iterdir()) == []   # no temporary roots leaked


def test_ops_share_one_private_fallback_root_which_list_shows(cli_env, tmp_path):
    """Two processes building with an unusable MLA_JIT_CACHE_DIR: one warning each, one private
    root per user (the second process finds the first one's kernel), and `list` shows it."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    env = {**os.environ, **cli_env, "MLA_JIT_CACHE_DIR": str(blocker / "cache"), "PYTHONPATH": str(REPO)}
    code = ("from tests.helpers import toy_source; from mla_jit.jit.build import build; "
            "b = build(toy_source()); print(b.origin, b.path)")
    runs = [subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    (origin1, path1), (origin2, path2) = (r.stdout.split() for r in runs)
    fallback = Path(cli_env["TMPDIR"]) / f"mla_jit-cache-{os.getuid()}"
    assert (origin1, origin2) == ("compiled", "disk") and path1 == path2 and path1.startswith(str(fallback))
    assert all(r.stderr.count("not usable") == 1 and str(blocker) in r.stderr for r in runs)
    assert os.listdir(cli_env["TMPDIR"]) == [fallback.name]
    listed = run_cli("list", env_extra={**cli_env, "MLA_JIT_CACHE_DIR": str(blocker / "cache")})
    assert "tile_copy-fp32" in listed.stdout and str(fallback) in listed.stdout
    assert "unusable" in listed.stderr and str(fallback) in listed.stderr


# ---- 2. --config validated in the parent, one line, exit code 2 ----------------------------------


@pytest.mark.parametrize("spec,expect", [
    ("tile_copy:dtype=bf16", "missing fields block_rows, block_cols, num_threads"),
    ("tile_copy:dtype=bf16,block_rows=abc,block_cols=64,num_threads=256", "block_rows: expected an integer, got 'abc'"),
    ("mla_metadata:block_n=abc,fixed_overhead_blocks=5", "block_n: expected an integer"),
    ("mla_decode_sm90:dtype=bf16,head_dim=576,head_dim_v=512,page_size=64,block_m=64,block_n=64,num_stages=3,"
     "schedule=nope,cluster_m=1", "DecodeConfig.schedule: expected one of ws, ws_unfused, got 'nope'"),
    ("tile_copy:dtype=fp8,block_rows=64,block_cols=64,num_threads=256", "TileCopyConfig.dtype: expected one of bf16"),
    ("wgmma_gemm:dtype=bf16,block_m=64,block_n=100,block_k=64", "WgmmaGemmConfig.block_n: expected one of"),
    ("mla_metadata:block_n=32,fixed_overhead_blocks=5", "MetadataConfig.block_n: expected one of 64"),
    ("mla_decode_sm80:dtype=bf16,head_dim=576,head_dim_v=512,page_size=64,block_m=48,block_n=32,num_stages=2,"
     "num_warps=8,smem_limit=166912", "Sm80DecodeConfig.block_m: expected one of 16, 32, 64"),
    ("tile_copy:dtype=fp32,block_rows=64,block_cols=64,num_threads=256,colour=red", "has no field 'colour'"),
    ("nope:x=1", "unknown kernel family 'nope'"),
])
def test_bad_config_spec_is_one_line_and_exit_2(cli_env, spec, expect):
    proc = run_cli("prewarm", "--config", spec, env_extra=cli_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    no_traceback(proc)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expect in lines[0], proc.stderr
    assert not Path(cli_env["MLA_JIT_CACHE_DIR"]).exists()   # nothing started


def test_config_from_spec_is_strict():
    from mla_jit.errors import ConfigSpecError
    from mla_jit.jit.arch import parse_arch
    family = registry.get("mla_decode_sm90")
    good = family.config_spec(next(iter(family.prewarm_configs(parse_arch("sm_90a"), presets.resolve(None)))))
    assert family.config_from_spec(good).schedule in ("ws", "ws_unfused")
    with pytest.raises(ConfigSpecError, match="head_dim: expected an integer"):
        family.config_from_spec(good.replace("head_dim=576", "head_dim=5x"))
    with pytest.raises(ConfigSpecError, match="missing field page_size"):
        family.config_from_spec(good.replace("page_size=64,", ""))
    with pytest.raises(ConfigSpecError, match="expected mla_decode_sm90:"):
        family.config_from_spec(good.replace("mla_decode_sm90:", "tile_copy:"))


# ---- 3. EOF at the prompt, broken pipes, Ctrl-C --------------------------------------------------


def test_clear_at_eof_removes_nothing(cli_env):
    os.makedirs(cli_env["MLA_JIT_CACHE_DIR"])
    proc = run_cli("clear", env_extra=cli_env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1 and "nothing removed" in proc.stdout
    no_traceback(proc)
    assert proc.stderr == ""


@pytest.mark.parametrize("command", [["list"], ["list", "--json"], ["info"], ["--help"]])
def test_broken_pipe_is_quiet(cli_env, command):
    os.makedirs(cli_env["MLA_JIT_CACHE_DIR"])
    read_end, write_end = os.pipe()
    os.close(read_end)   # the reader is gone before the CLI writes (`mla-jit list | head -0`)
    try:
        proc = subprocess.run([shutil.which("mla-jit"), *command], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, **cli_env})
    finally:
        os.close(write_end)
    assert proc.stderr == "", proc.stderr   # no traceback, no "Exception ignored ... BrokenPipeError"
    if command[0] != "--help":
        assert proc.returncode == 141   # what a tool killed by SIGPIPE reports


def test_list_piped_into_head(cli_env):
    assert run_cli("prewarm", "--config", TILE_COPY_SPEC, "--jobs", "1", env_extra=cli_env).returncode == 0
    proc = subprocess.run(f"'{shutil.which('mla-jit')}' list | head -1", shell=True, capture_output=True,
                          text=True, env={**os.environ, **cli_env})
    assert proc.stdout.startswith("arch") and proc.stderr == ""


FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "Cuda compilation tools"; echo "Build fake_nvcc_for_tests"; exit 0; fi
touch "{marker}.$$"
exec sleep 60
"""


def test_ctrl_c_during_prewarm_is_one_line(cli_env, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while two workers compile:
    no worker tracebacks, one line from the parent, exit code 130, nothing left running."""
    marker = tmp_path / "compiling"
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(marker=marker))
    nvcc.chmod(0o755)
    env = {**os.environ, **cli_env, "MLA_JIT_NVCC": str(nvcc)}
    proc = subprocess.Popen([shutil.which("mla-jit"), "prewarm", "--op", "tile_copy", "--compiler", "nvcc",
                             "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("compiling.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list(tmp_path.glob("compiling.*"))) == 2, "the workers never reached the compiler"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert [ln for ln in err.splitlines() if ln.strip()] == ["mla-jit: prewarm interrupted (0 compiled before)"]
    deadline = time.monotonic() + 10
    while _live_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live_members(proc.pid) == []   # no worker or (fake) compiler left running


def _live_members(pgid: int) -> list[str]:
    """Processes of group `pgid` that are not zombies (from /proc; [] where there is no /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(stat.parent.name)
    return out


# ---- 4. the toy families only when asked for -----------------------------------------------------


def _families_of(*argv):
    args = cli.build_parser().parse_args(["prewarm", *argv])
    return {family.name for family, _, _ in cli.prewarm._enumerate_jobs(args)}


def test_examples_are_not_prewarmed_by_default(monkeypatch):
    monkeypatch.delenv("MLA_JIT_ARCH", raising=False)
    examples = {f.name for f in registry.families().values() if not f.default_prewarm}
    assert examples == {"tile_copy", "wgmma_gemm"}
    indexer = {"indexer_logits_sm90", "indexer_paged_sm90", "indexer_metadata"}
    assert _families_of() == {"mla_metadata", "mla_decode_sm90", "merge_states", "prefill_sm90", *indexer,
                              "mla_sparse_sm90", "mla_sparse_narrow_sm90"}
    assert _families_of("--preset", "deepseek-v3") == {"mla_metadata", "mla_decode_sm90", "merge_states",
                                                        "prefill_sm90"}   # (V3 has no indexer; V3.2 does)
    # Hopper: the sparse attention's wgmma kernels (16 heads at TP 8: the narrow one for the FP8
    # records, the wide one for the prefill's bf16 rows)
    assert _families_of("--preset", "deepseek-v3.2-tp8") >= indexer | {"mla_sparse_sm90", "mla_sparse_narrow_sm90"}
    assert "mla_sparse_narrow_sm90" not in _families_of("--preset", "deepseek-v3.2-tp1")   # (128 heads)
    assert "mla_sparse_decode" not in _families_of("--preset", "deepseek-v3.2")
    assert _families_of("--arch", "sm_89") == {"mla_metadata", "mla_decode_sm80", "merge_states", "prefill_sm80",
                                               "indexer_metadata", "indexer_logits_sm80", "indexer_paged_sm80",
                                               "mla_sparse_decode"}
    assert _families_of("--op", "tile_copy") == {"tile_copy"}
    assert _families_of("--op", "wgmma_gemm", "--op", "get_mla_metadata") == {"wgmma_gemm", "mla_metadata"}
    assert _families_of("--config", TILE_COPY_SPEC) == {"tile_copy"}
    source = "".join(p.read_text() for p in (REPO / "mla_jit" / "cli").glob("*.py"))
    assert "tile_copy" not in source and "wgmma" not in source


# ---- 5. --help: generated, complete, fast --------------------------------------------------------


@pytest.mark.parametrize("argv", [["--help"], ["prewarm", "--help"]])
def test_help_lists_ops_presets_and_archs(cli_env, argv):
    proc = run_cli(*argv, env_extra=cli_env)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    ops = {op for f in registry.families().values() for op in f.ops}
    names = [*ops, *registry.families(), *presets.PRESETS, *presets.PRESET_GROUPS, *SUPPORTED_ARCHS]
    missing = [n for n in names if n not in text]
    assert not missing, missing
    for line in proc.stdout.splitlines():   # the lists are complete: no "deepseek-v3-tp8, ..."
        if any(n in line for n in [*presets.PRESETS, *SUPPORTED_ARCHS]):
            assert "..." not in line, line


IMPORT_PROBE = textwrap.dedent("""
    import sys
    from mla_jit import cli
    try:
        code = cli.main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy")
                   or m in ("mla_jit.jit.stream", "mla_jit.jit.tma", "mla_jit.ops"))
    print("HEAVY", heavy, file=sys.stderr)
    sys.exit(code or 0)
""")


@pytest.mark.parametrize("argv", [["--help"], ["prewarm", "--help"], ["list"], ["clear", "--yes"],
                                  ["prewarm", "--config", TILE_COPY_SPEC, "--jobs", "1"]])
def test_cli_does_not_import_torch(cli_env, argv):
    proc = subprocess.run([sys.executable, "-c", IMPORT_PROBE, *argv], capture_output=True, text=True,
                          env={**os.environ, **cli_env})
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stderr, proc.stderr


def test_help_import_time(cli_env):
    """`python -X importtime` of the CLI module plus building its parser: no torch, no CUDA bindings,
    no CUTLASS scan (the wall-clock figure is in the report; here only what is imported)."""
    code = "from mla_jit import cli; cli.build_parser()"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          env={**os.environ, **cli_env})
    assert proc.returncode == 0, proc.stderr
    modules = [ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    assert not [m for m in modules if m.split(".")[0] in ("torch", "cutlass_library")
                or m.startswith("cuda.bindings")], modules

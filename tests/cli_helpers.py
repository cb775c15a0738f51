"""Helpers of the CLI tests: run the installed `mla-jit` (its environment: the `cli_env` fixture)."""
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TILE_COPY_SPEC = "tile_copy:dtype=fp32,block_rows=64,block_cols=64,num_threads=256"


def run_cli(*args, env_extra=None, **kwargs):
    exe = shutil.which("mla-jit")
    assert exe, "the mla-jit console script is not installed"
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, **kwargs)


def no_traceback(proc):
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr

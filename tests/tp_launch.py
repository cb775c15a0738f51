"""Start the ranks of tests/tp_rank.py as torchrun does (torch.distributed.run, one process per rank)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RANK_SCRIPT = REPO / "tests" / "tp_rank.py"


def start_ranks(nproc: int, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """torchrun --standalone --nproc-per-node nproc tests/tp_rank.py ARGS, with `env` over os.environ."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(RANK_SCRIPT), *args]
    return subprocess.Popen(cmd, env={**os.environ, **env}, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_ranks(proc: subprocess.Popen, out_dir: Path, nproc: int, timeout: float) -> list[dict]:
    """Every rank's report, after the launcher exited 0 (else AssertionError with its output)."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        raise AssertionError(f"ranks still running after {timeout} s:\n{output[-6000:]}") from None
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{output[-6000:]}"
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(nproc)]


def release_when_ready(out_dir: Path, nproc: int, proc: subprocess.Popen, timeout: float) -> None:
    """Write out_dir/go once every rank has written its ready file (all are then waiting on it)."""
    deadline = time.monotonic() + timeout
    while not all((out_dir / f"ready{r}").exists() for r in range(nproc)):
        if proc.poll() is not None or time.monotonic() > deadline:
            output = proc.communicate()[0] if proc.poll() is not None else "(still running)"
            raise AssertionError(f"ranks never all became ready:\n{output[-6000:]}")
        time.sleep(0.05)
    (out_dir / "go").write_text("go")

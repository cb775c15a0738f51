"""GPU-free: .ci/run installs into a virtual environment of its own and leaves the checkout's .venv
alone, and installs exactly as the README's second command says (run here with a stub python3)."""
import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A python3 whose `-m venv DIR` makes DIR/bin/activate define pip and python as loggers.
STUB_PYTHON3 = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  cat > "$3/bin/activate" <<'ACT'
pip() { echo "pip $*" >> "$CI_LOG"; }
python() { echo "python $*" >> "$CI_LOG"; }
ACT
  echo "venv $3" >> "$CI_LOG"
  exit 0
fi
echo "unexpected python3 $*" >> "$CI_LOG"
exit 1
"""


def _readme_test_command() -> str:
    """`pip install ... && python -m pytest -q` of the README's second command."""
    readme = (REPO / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if "pytest" in ln and ln.startswith("python3 -m venv"))
    return line.split("activate && ", 1)[1].strip()


def test_ci_script_uses_its_own_venv_and_the_readme_install(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy2(REPO / ".ci" / "run", checkout / ".ci" / "run")
    (checkout / ".venv").mkdir()
    (checkout / ".venv" / "keep-me").write_text("the developer's environment")
    stub_bin = tmp_path / "bin"
    stub_bin.mkdir()
    (stub_bin / "python3").write_text(STUB_PYTHON3)
    (stub_bin / "python3").chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    log = tmp_path / "ci.log"
    env = {**os.environ, "PATH": f"{stub_bin}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp),
           "CI_LOG": str(log)}
    proc = subprocess.run(["bash", str(checkout / ".ci" / "run")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (checkout / ".venv" / "keep-me").is_file()          # the checkout's .venv is untouched
    lines = log.read_text().splitlines()
    venv = Path(lines[0].split(" ", 1)[1])
    assert venv.parent == tmp and venv != checkout / ".venv"   # a directory of its own ...
    assert list(tmp.iterdir()) == []                           # ... removed at exit
    assert lines[1:] == ["pip install torch==2.13.0 -e .[test]", "python -m pytest -q"]
    # And literally the README's command.
    script = (REPO / ".ci" / "run").read_text()
    assert _readme_test_command() in script
    assert not re.search(r"rm -rf \.venv\b", script)

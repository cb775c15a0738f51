"""The README's env table lists exactly the variables mla_jit reads."""
import re
from pathlib import Path

from mla_jit.jit.env import ENV_VARS


def test_readme_env_table_matches_env_module():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    documented = set(re.findall(r"^\| `(MLA_JIT_[A-Z0-9_]+)` \|", readme, re.MULTILINE))
    assert documented == set(ENV_VARS)


def test_no_getenv_outside_env_module():
    root = Path(__file__).resolve().parent.parent / "mla_jit"
    offenders = [p for p in root.rglob("*.py")
                 if p.name != "env.py" and re.search(r"os\.environ\.get\(\s*[\"']MLA_JIT|getenv\(", p.read_text())]
    assert offenders == []

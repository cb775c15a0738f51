"""The README's env table lists exactly the variables mla_jit declares (core and families), with
their defaults; only jit/env.py reads the environment for configuration."""
import re
from pathlib import Path

import mla_jit.runtimes  # noqa: F401  (families declare their knobs when imported)
from mla_jit.jit.env import ENV_VARS

ROOT = Path(__file__).resolve().parent.parent


def _readme_env_rows() -> dict[str, str]:
    readme = (ROOT / "README.md").read_text()
    return dict(re.findall(r"^\| `(MLA_JIT_[A-Z0-9_]+)` \| (?:`([^`]*)`|\(empty\)) \|", readme, re.MULTILINE))


def test_readme_env_table_matches_the_registry():
    from mla_jit.jit.env import markdown_table
    rows = _readme_env_rows()
    assert set(rows) == set(ENV_VARS)
    for name, default in rows.items():
        assert default == ENV_VARS[name].default, name
    # The whole table, help texts included, is the registry's (regenerate it with env.markdown_table()).
    assert markdown_table() in (ROOT / "README.md").read_text()


def test_family_knobs_are_declared_by_their_family():
    assert ENV_VARS["MLA_JIT_SM90_DECODE_SCHEDULE"].owner == "mla_jit.configs.decode"
    assert ENV_VARS["MLA_JIT_SM90_DECODE_SCHEDULE"].choices == ("auto", "ws", "ws_unfused")
    core = (ROOT / "mla_jit" / "jit" / "env.py").read_text()
    assert "SM90" not in core and "DECODE" not in core


def test_no_getenv_outside_env_module():
    root = ROOT / "mla_jit"
    offenders = [p for p in root.rglob("*.py")
                 if p.name != "env.py" and re.search(r"os\.environ\.get\(\s*[\"']MLA_JIT|getenv\(", p.read_text())]
    assert offenders == []

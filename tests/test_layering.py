"""GPU-free, static: the layers of the JIT core. cache/ does not import jit/; jit/ and cache/ know no
kernel family; the modules the CLI imports do not import torch at module level."""
import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "mla_jit"
FAMILY_WORDS = ("decode", "mla_decode", "metadata", "tile_copy", "wgmma")


def _imports(path: Path) -> list[str]:
    """Absolute names of every module `path` imports (relative imports resolved), at any depth."""
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            out.append(module)
            out += [f"{module}.{a.name}" for a in node.names]
    return out


def _module_level_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", sorted((PKG / "cache").glob("*.py")), ids=lambda p: p.name)
def test_cache_does_not_import_jit(path):
    offenders = [m for m in _imports(path) if m == "mla_jit.jit" or m.startswith("mla_jit.jit.")]
    assert offenders == [], f"{path.name} imports {offenders}"


def _code_identifiers(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every name and string literal in the code (comments and docstrings excluded).
    `.decode(...)`, the bytes method, is not a family name."""
    out = []
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    docstrings = {n.body[0].value.lineno for n in ast.walk(ast.parse(path.read_text()))
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
                  and isinstance(n.body[0].value.value, str)}
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME:
            if tok.string == "decode" and i and tokens[i - 1].string == ".":
                continue
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and tok.start[0] not in docstrings:
            out.append((tok.start[0], tok.string.replace(".decode(", ".(")))   # f"{b.decode()}"
    return out


@pytest.mark.parametrize("path", sorted([*(PKG / "jit").glob("*.py"), *(PKG / "cache").glob("*.py")]),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_core_names_no_family(path):
    pattern = re.compile("|".join(FAMILY_WORDS), re.IGNORECASE)
    offenders = [(line, text) for line, text in _code_identifiers(path) if pattern.search(text)]
    assert offenders == [], f"{path.parent.name}/{path.name} names a kernel family: {offenders}"


def _cli_modules() -> list[str]:
    """The mla_jit modules `mla-jit prewarm` loads (its parser, every family, the build path)."""
    code = ("import sys; from mla_jit import cli; cli.build_parser(); from mla_jit.jit import build; "
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('mla_jit'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return proc.stdout.split()


def test_modules_the_cli_imports_do_not_import_torch_at_module_level():
    modules = _cli_modules()
    assert "mla_jit.jit.stream" not in modules and "mla_jit.jit.tma" not in modules
    assert not [m for m in modules if m.startswith("mla_jit.ops")]
    offenders = []
    for name in modules:
        rel = Path(*name.split(".")[1:])
        path = PKG / rel / "__init__.py" if (PKG / rel).is_dir() else PKG / rel.with_suffix(".py")
        if any(m.split(".")[0] == "torch" for m in _module_level_imports(path)):
            offenders.append(name)
    assert offenders == []

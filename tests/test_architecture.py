"""The architecture holds: layers import downwards only, nothing below the app
draws on the terminal, no import cycle, and modules and engine functions stay
small enough to read (docs/architecture.md).

The layer contracts live in pyproject.toml and are checked by import-linter;
a negative control shows that the check sees a broken layer.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specrepl"
MAX_MODULE_LINES = 500
MAX_ENGINE_FUNCTION_LINES = 60
LAYERS = ("store", "engine", "models", "chat", "train", "measure", "app")

LINT = "from importlinter.cli import lint_imports; raise SystemExit(lint_imports(no_cache=True))"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LINT],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts)


def test_the_import_contracts_are_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_the_contracts_see_a_lower_layer_importing_a_higher_one(tmp_path: Path) -> None:
    shutil.copytree(PACKAGE, tmp_path / "specrepl", ignore=shutil.ignore_patterns("*.safetensors"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    paths = tmp_path / "specrepl" / "store" / "paths.py"
    paths.write_text(paths.read_text() + "\nfrom specrepl.app import cli  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "specrepl.store.paths -> specrepl.app.cli" in result.stdout


def test_every_module_sits_in_a_layer() -> None:
    outside = [
        path.relative_to(PACKAGE).as_posix()
        for path in modules()
        if len(path.relative_to(PACKAGE).parts) > 1
        and path.relative_to(PACKAGE).parts[0] not in (*LAYERS, "heads", "data")
    ]
    assert outside == []
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "testing.py", "version.py"]


@pytest.mark.parametrize("path", modules(), ids=lambda path: path.relative_to(ROOT).as_posix())
def test_module_is_short_and_says_what_it_is_for(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    assert ast.get_docstring(ast.parse(text)), "a module docstring says what it is for"


@pytest.mark.parametrize(
    "path",
    sorted((PACKAGE / "engine").rglob("*.py")),
    ids=lambda path: path.relative_to(ROOT).as_posix(),
)
def test_engine_functions_read_on_one_screen(path: Path) -> None:
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_ENGINE_FUNCTION_LINES
    ]
    assert long == []

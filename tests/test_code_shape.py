"""How big the package's pieces may grow: a module at most 400 lines, a function at most 60
(generated code under `elastic_keras/proto/` aside). A file that outgrows them has more than
one job; split it where the jobs part."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "elastic_keras"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MODULES = sorted(p for p in PACKAGE.rglob("*.py")
                 if p.relative_to(PACKAGE).parts[0] != "proto")


def _functions_over(tree, limit):
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(path):
    source = path.read_text()
    lines = source.count("\n")
    assert lines <= MAX_MODULE_LINES, (
        f"elastic_keras/{path.relative_to(PACKAGE)} has {lines} lines; at most "
        f"{MAX_MODULE_LINES}")
    long = _functions_over(ast.parse(source), MAX_FUNCTION_LINES)
    assert not long, (f"elastic_keras/{path.relative_to(PACKAGE)}: functions over "
                      f"{MAX_FUNCTION_LINES} lines (name, line, length): {long}")


def test_a_long_function_is_found():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert _functions_over(ast.parse(f"def f():\n{body}\n"), MAX_FUNCTION_LINES) == [
        ("f", 1, MAX_FUNCTION_LINES + 1)]

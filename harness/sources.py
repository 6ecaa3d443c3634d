"""The house's Python files parsed once per test process: the architecture tests, the harness's
layer rules and the fast lane's rules each walk the same ~570 files, and parsing them once per
module cost each xdist worker ~2.5 s a module. The trees are shared: read them, never change them."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@cache
def walked(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``path``'s tree in ``ast.walk``'s order, listed once: the tests walk each
    file a dozen times, and ``ast.walk`` is a Python generator (~8 s a process, walked anew)."""
    return tuple(ast.walk(parsed(path)))

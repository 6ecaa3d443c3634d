"""The code's layering: each app imports only the apps below it, no module imports itself back
(between apps or inside one), ckptlib stands alone, one writer owns a job's status, and no module
grows past the size a reader can hold.

The floors, bottom first (``ARCHITECTURE.md`` draws them): jobs < logs < agent < failover <
notify < console. Tests and migrations are left out; imports inside functions count (a lazy import that
dodges a cycle is still a cycle).
"""
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["jobs", "logs", "agent", "failover", "notify", "console"]
PACKAGES = [*LAYERS, "ckptlib"]
MAX_LINES = 600


def production(module: str) -> bool:
    parts = module.split(".")
    return "tests" not in parts and "migrations" not in parts


@cache
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, include_external_packages=True)


def imports_of(module: str) -> set[str]:
    return {m for m in graph().find_modules_directly_imported_by(module) if production(m)}


def modules_of(package: str) -> list[str]:
    return sorted(m for m in graph().find_descendants(package) | {package} if production(m))


def cycles(modules: list[str]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), i.e. the import cycles."""
    inside = set(modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in imports_of(module) & inside:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(inside):
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("lower", LAYERS[:-1])
def test_no_app_imports_an_app_above_it(lower):
    above = LAYERS[LAYERS.index(lower) + 1 :]
    upward = sorted(
        f"{module} -> {target}"
        for module in modules_of(lower)
        for target in imports_of(module)
        if target.split(".")[0] in above
    )
    assert upward == [], f"{lower} may import only {LAYERS[: LAYERS.index(lower)]}; found:\n" + "\n".join(upward)


def test_no_import_cycle_between_or_inside_the_apps():
    everything = [m for package in PACKAGES for m in modules_of(package)]
    assert cycles(everything) == []


def test_the_cycle_finder_finds_a_cycle():
    # The check above is only as good as the walk: a made-up two-module ring must be found.
    fake = {"a.x": {"a.y"}, "a.y": {"a.x"}, "a.z": {"a.x"}}
    real = imports_of
    try:
        globals()["imports_of"] = lambda m: fake.get(m, set())
        assert cycles(["a.x", "a.y", "a.z"]) == [["a.x", "a.y"]]
    finally:
        globals()["imports_of"] = real


def test_ckptlib_imports_neither_django_nor_an_app():
    forbidden = {"django", "rest_framework", "channels", "celery", *LAYERS}
    found = sorted(
        f"{module} -> {target}"
        for module in modules_of("ckptlib")
        for target in imports_of(module)
        if target.split(".")[0] in forbidden
    )
    assert found == []


# --- the one writer of a job's status ----------------------------------------------------------
GUARDED = {"status", "status_reason", "failover_count"}
WRITER = ROOT / "jobs" / "services" / "lifecycle.py"
WRITE_CALLS = {"update", "create", "get_or_create", "update_or_create", "bulk_create", "bulk_update", "save"}


def production_files(suffix: str) -> list[Path]:
    files = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob(f"*{suffix}"):
            parts = path.relative_to(ROOT).parts
            if "tests" not in parts and "migrations" not in parts and "vendor" not in parts:
                files.append(path)
    return sorted(files)


def guarded_writes(path: Path, *, root: Path = ROOT) -> list[str]:
    """Every place the file sets a guarded field: a keyword of a write call, a key of its
    ``defaults``, a name in ``update_fields``, or an attribute assignment."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITE_CALLS:
            for keyword in node.keywords:
                if keyword.arg in GUARDED:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.func.attr}({keyword.arg}=…)")
                if keyword.arg in ("defaults", "update_fields"):
                    names = {
                        elt.value
                        for elt in ast.walk(keyword.value)
                        if isinstance(elt, ast.Constant) and isinstance(elt.value, str)
                    }
                    for name in sorted(names & GUARDED):
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.func.attr}({keyword.arg}: {name})")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in GUARDED:
                    found.append(f"{path.relative_to(root)}:{node.lineno} .{target.attr} = …")
    return found


def test_only_the_one_writer_sets_a_jobs_status_reason_or_failover_count():
    writes = [w for path in production_files(".py") if path != WRITER for w in guarded_writes(path)]
    assert writes == [], "write these through jobs.services.lifecycle (transition / record_reason):\n" + "\n".join(writes)


def test_the_writer_check_sees_a_write(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("Job.objects.filter(pk=1).update(status_reason='x')\njob.failover_count = 2\n")
    found = sorted(w.split(" ", 1)[1] for w in guarded_writes(sample, root=tmp_path))
    assert found == [".failover_count = …", "update(status_reason=…)"]


# --- module size -------------------------------------------------------------------------------
def test_no_module_is_over_600_lines():
    static = ROOT / "console" / "static" / "console"
    files = production_files(".py") + sorted(static.rglob("*.js"))
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert long == []


def test_every_socket_of_the_browser_code_goes_through_the_one_reconnect_helper():
    static = ROOT / "console" / "static" / "console"
    opening = sorted(str(p.relative_to(static)) for p in static.rglob("*.js") if "new WebSocket(" in p.read_text())
    assert opening == ["socket.js"]

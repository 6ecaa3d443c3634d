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

from agent import runfiles

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
    upward = sorted(f"{module} -> {target}" for module in modules_of(lower) for target in imports_of(module) if target.split(".")[0] in above)
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
    found = sorted(f"{module} -> {target}" for module in modules_of("ckptlib") for target in imports_of(module) if target.split(".")[0] in forbidden)
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
                    names = {elt.value for elt in ast.walk(keyword.value) if isinstance(elt, ast.Constant) and isinstance(elt.value, str)}
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


# --- the test suite's own house rules ----------------------------------------------------------

HOUSE = ["console", "jobs", "logs", "agent", "failover", "notify", "ckptlib", "bench", "client"]


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if "migrations" not in p.parts)


def module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts)


def hooks_defined_twice(module: ast.Module) -> list[str]:
    """Top-level functions named ``pytest_*`` defined more than once in one module: Python keeps
    the last, so the first never runs."""
    seen: set[str] = set()
    twice = []
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("pytest_"):
            if node.name in seen:
                twice.append(node.name)
            seen.add(node.name)
    return twice


def test_no_pytest_hook_is_defined_twice_in_a_module():
    found = {module_name(p): hooks_defined_twice(parsed(p)) for p in [ROOT / "conftest.py", *python_files(*HOUSE)]}
    assert {m: names for m, names in found.items() if names} == {}


def test_the_hook_check_sees_a_second_definition():
    assert hooks_defined_twice(ast.parse("def pytest_runtest_teardown(item):\n    pass\n\ndef pytest_runtest_teardown(item):\n    pass\n")) == [
        "pytest_runtest_teardown"
    ]


def fixture_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if isinstance(target, ast.Attribute) and target.attr == "fixture":
                    names.add(node.name)
    return names


def fixtures_imported_by_name(files: list[Path], root: Path = ROOT) -> list[str]:
    """``from module import a_fixture`` anywhere (a fixture reaches a test through a conftest or
    the root conftest's plugins, never by import: an imported fixture shadows, or is shadowed by,
    a test's parameter of the same name, and pyflakes reports it as redefined)."""
    fixtures: dict[str, set[str]] = {}
    for path in files:
        if names := fixture_names(path):
            fixtures[module_name(path, root)] = names
    found = []
    for path in files:
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ImportFrom) and node.module in fixtures:
                for alias in node.names:
                    if alias.name in fixtures[node.module]:
                        found.append(f"{module_name(path, root)}:{node.lineno} imports the fixture {node.module}.{alias.name}")
    return found


def test_no_fixture_is_imported_by_name():
    assert fixtures_imported_by_name([ROOT / "conftest.py", *python_files(*HOUSE)]) == []


def test_the_fixture_check_sees_an_imported_fixture(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "fixtures.py").write_text("import pytest\n\n@pytest.fixture\ndef owner():\n    return 1\n")
    (tmp_path / "pkg" / "test_x.py").write_text("from pkg.fixtures import owner\n\ndef test_a(owner):\n    pass\n")
    found = fixtures_imported_by_name(sorted((tmp_path / "pkg").glob("*.py")), root=tmp_path)
    assert found == ["pkg.test_x:1 imports the fixture pkg.fixtures.owner"]


RUN_FILE_NAMES = (runfiles.SPEC_FILE, runfiles.PID_FILE, runfiles.OUTPUT_FILE, runfiles.EXIT_FILE)
RUN_FILES_CONTRACT = "agent/runfiles.py"


def run_file_literals(path: Path) -> list[str]:
    """Where a module names a run file (the files a job's runner writes and its agent reads) as a
    string of its own."""
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RUN_FILE_NAMES:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    return found


def test_the_run_files_are_named_only_by_their_contract_module():
    """``agent.runfiles`` defines every file the runner writes and the agent reads (names, types,
    limits); everyone else, tests and benchmarks included, goes through it."""
    assert (ROOT / RUN_FILES_CONTRACT).exists()
    found = [hit for p in python_files(*HOUSE) if p != ROOT / RUN_FILES_CONTRACT for hit in run_file_literals(p)]
    assert found == []

"""The house rules no import contract can say: one writer owns a job's status, the run files are
named by their contract module alone, no module grows past the size a reader can hold, the test
suite's own rules (no pytest hook defined twice, no fixture imported by name), one reconnect
helper for the browser's sockets, no ``getattr`` reach into an agent (failover and the agent's
plug-ins use ``agent.plugins.AgentView``'s typed methods), and ``settings.BACKEND`` read by
``agent.backend`` alone.

The layering itself (each app imports only the apps below it, no import cycle inside an app,
ckptlib free of Django and the apps) is import-linter's contracts in ``pyproject.toml``, checked by
``lint-imports`` in ``make lint``; the tests here make sure those contracts fail when broken.
"""

from __future__ import annotations

import abc
import ast
import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest
from importlinter.adapters.building import GraphBuilder
from importlinter.application import use_cases
from importlinter.configuration import configure, settings

from agent import runfiles
from harness.sources import parsed, walked

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["jobs", "logs", "agent", "failover", "notify", "console", "ckptlib"]
MAX_LINES = 600


# --- the import contracts (pyproject.toml's [tool.importlinter]) -------------------------------
@pytest.fixture
def contract_kept(monkeypatch):
    """Whether a contract holds for the code's import graph with some imports added."""
    # zope.interface (Twisted's, under Channels) hangs a descriptor on abc.ABC that raises for its
    # subclasses; import-linter's check of a contract's options reads every attribute of the
    # contract class (an ABC) and trips on it. `lint-imports` runs without Django: no zope there.
    monkeypatch.delattr(abc.ABC, "__provides__", raising=False)

    def kept(contract: str, added: list[tuple[str, str]]) -> bool:
        class WithAdded(GraphBuilder):
            def build(self, *args, **kwargs):
                graph = super().build(*args, **kwargs)
                for importer, imported in added:
                    graph.add_import(importer=importer, imported=imported)
                return graph

        configure()
        settings.configure(GRAPH_BUILDER=WithAdded())
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                return use_cases.lint_imports(
                    config_filename=str(ROOT / "pyproject.toml"), limit_to_contracts=(contract,), cache_dir=None, is_debug_mode=True, no_logo=True
                )
        finally:
            configure()

    return kept


@pytest.mark.parametrize(
    ("contract", "added"),
    [
        ("floors", [("jobs.models", "console.views")]),
        ("floors", [("logs.services", "agent.runfiles")]),
        ("no-cycles", [("jobs.statuses", "jobs.models")]),
        ("ckptlib-alone", [("ckptlib._dist", "django.conf")]),
        ("ckptlib-alone", [("ckptlib._dist", "jobs.models")]),
    ],
)
def test_the_import_contracts_fail_on_a_violation(contract_kept, contract, added):
    assert not contract_kept(contract, added)


@pytest.mark.parametrize("contract", ["floors", "no-cycles", "ckptlib-alone"])
def test_the_code_keeps_the_import_contracts(contract_kept, contract):
    assert contract_kept(contract, [])


def test_a_tests_import_is_no_violation(contract_kept):
    assert contract_kept("floors", [("jobs.tests.conftest", "console.views")])


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
    for node in walked(path):
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


def sample_hits(tmp_path: Path, check: Callable[..., list[str]], source: str) -> list[str]:
    """What a house check (``check(path, root=…)``: ``"<place> <hit>"`` lines) finds in a sample
    module of ``source``, each hit without its place."""
    sample = tmp_path / "sample.py"
    sample.write_text(source)
    return [hit.split(" ", 1)[1] for hit in check(sample, root=tmp_path)]


def test_the_writer_check_sees_a_write(tmp_path):
    found = sorted(sample_hits(tmp_path, guarded_writes, "Job.objects.filter(pk=1).update(status_reason='x')\njob.failover_count = 2\n"))
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

HOUSE = ["console", "jobs", "logs", "agent", "failover", "notify", "ckptlib", "bench", "client", "harness"]


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
    for node in walked(path):
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
        for node in walked(path):
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
    for node in walked(path):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RUN_FILE_NAMES:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    return found


def test_the_run_files_are_named_only_by_their_contract_module():
    """``agent.runfiles`` defines every file the runner writes and the agent reads (names, types,
    limits); everyone else, tests and benchmarks included, goes through it."""
    assert (ROOT / RUN_FILES_CONTRACT).exists()
    found = [hit for p in python_files(*HOUSE) if p != ROOT / RUN_FILES_CONTRACT for hit in run_file_literals(p)]
    assert found == []


# --- failover reaches the agent through its typed view ----------------------------------------
# What only an agent object has: a reach for one of these names is a reach into the agent.
AGENT_ONLY = {"launcher", "slurm", "wake", "node_evidence_dir", "evidence_source"}


def agent_reaches(path: Path, *, root: Path = ROOT) -> list[str]:
    """``getattr``/``hasattr`` with a constant name on an agent: the object's expression names an
    agent (``agent``, ``self.checker.agent``), or the name is one only an agent has. What a
    plug-in may use of the agent is ``agent.plugins.AgentView``'s typed methods instead."""
    found = []
    for node in walked(path):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2):
            continue
        target, name = node.args[0], node.args[1]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        if "agent" in ast.unparse(target).lower() or name.value in AGENT_ONLY:
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.func.id}({ast.unparse(target)}, {name.value!r})")
    return found


def test_failover_and_the_agent_reach_an_agent_only_through_its_typed_view():
    files = [p for p in production_files(".py") if p.relative_to(ROOT).parts[0] in ("agent", "failover")]
    found = [hit for p in files for hit in agent_reaches(p)]
    assert found == [], "use agent.plugins.AgentView's methods (signal, wake, evidence_source):\n" + "\n".join(found)


def test_the_reach_check_sees_a_reach(tmp_path):
    found = sample_hits(
        tmp_path,
        agent_reaches,
        'a = getattr(self.checker.agent, "wake", None)\nb = getattr(view, "launcher")\nc = hasattr(agent, "x")\n'
        'd = getattr(plugin, "next_round_in", None)\ne = getattr(plugin, hook, None)\n',
    )
    assert found == ["getattr(self.checker.agent, 'wake')", "getattr(view, 'launcher')", "hasattr(agent, 'x')"]


# --- the backend is chosen in one place ---------------------------------------------------------
BACKEND_READER = "agent/backend.py"


def backend_reads(path: Path, *, root: Path = ROOT) -> list[str]:
    """Where a module reads ``settings.BACKEND`` (an attribute load on a name or attribute called
    ``settings``, or ``getattr(settings, "BACKEND")``). Writes are not reads: the harness and the
    benchmarks that set it (``harness/slurm.py``, ``bench/failover/console.py``) and the browser
    harness, which passes ``BACKEND`` to a console process's environment, choose a backend for
    what they start; they never branch on it."""

    def is_settings(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "settings") or (isinstance(node, ast.Attribute) and node.attr == "settings")

    found = []
    for node in walked(path):
        if (isinstance(node, ast.Attribute) and node.attr == "BACKEND" and isinstance(node.ctx, ast.Load) and is_settings(node.value)) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and is_settings(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "BACKEND"
        ):
            found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_settings_backend_is_read_only_by_the_backend_module():
    """Everything that depends on which engine runs the jobs asks ``agent.backend`` (tests,
    benchmarks and the harness included)."""
    reads = [hit for p in python_files(*HOUSE) for hit in backend_reads(p)]
    assert reads and all(hit.startswith(BACKEND_READER + ":") for hit in reads), "ask agent.backend instead:\n" + "\n".join(reads)


def test_the_backend_check_sees_a_read_and_not_a_write(tmp_path):
    found = sorted(
        sample_hits(
            tmp_path,
            backend_reads,
            'if settings.BACKEND == "slurm": pass\nkind = django.conf.settings.BACKEND\nk = getattr(settings, "BACKEND")\n'
            'settings.BACKEND = "slurm"\nBACKEND = "agents"\nenv["BACKEND"] = "slurm"\n',
        )
    )
    assert found == ["django.conf.settings.BACKEND", "getattr(settings, 'BACKEND')", "settings.BACKEND"]


# --- an end's outcome is decided by its kind, never by its words -------------------------------
# The constants that begin the words of an end (``jobs.backends.facts``, ``jobs.services.limits``)
# and the names an end's words go by (``JobAttempt.cause``; the failed-run handler's ``outcome``).
CAUSE_CONSTANTS = {"OUT_OF_MEMORY", "PIDS_LIMIT", "STORAGE_LIMIT", "PROJECT_STORAGE_LIMIT"}
CAUSE_NAMES = {"cause", "outcome"}


def cause_word_tests(path: Path, *, root: Path = ROOT) -> list[str]:
    """Where a module tests an end's words: a ``.startswith(``/``.endswith(`` call whose argument
    names one of ``CAUSE_CONSTANTS`` (alone or in a tuple) or whose receiver is a name or attribute
    in ``CAUSE_NAMES`` (``outcome.startswith(...)``, ``attempt.cause.endswith(...)``), or an
    ``in``/``not in`` whose left side names one of ``CAUSE_CONSTANTS``. The kind decides
    (``jobs.backends.outcomes``); the words are only shown."""

    def named(node: ast.AST) -> str | None:
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None

    def constants(node: ast.AST) -> bool:
        parts = node.elts if isinstance(node, ast.Tuple) else [node]
        return any(named(part) in CAUSE_CONSTANTS for part in parts)

    found = []
    for node in walked(path):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith", "endswith"):
            if named(node.func.value) in CAUSE_NAMES or any(constants(arg) for arg in node.args):
                found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and constants(node.left):
            found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_outcome_is_decided_by_the_words_of_a_cause():
    from jobs.backends import facts
    from jobs.services import limits

    assert set(vars(facts)) | set(vars(limits)) >= CAUSE_CONSTANTS
    found = [hit for p in production_files(".py") for hit in cause_word_tests(p)]
    assert found == [], "decide by the end's kind (jobs.backends.outcomes), not its words:\n" + "\n".join(found)


def test_the_cause_check_sees_a_test_of_words(tmp_path):
    found = sample_hits(
        tmp_path,
        cause_word_tests,
        "a = outcome.startswith(OUT_OF_MEMORY)\nb = text.startswith((PIDS_LIMIT, limits.STORAGE_LIMIT))\n"
        'c = attempt.cause.endswith("lost")\nd = OUT_OF_MEMORY in words\ne = name.startswith("due")\nf = kind in PLAIN\n',
    )
    assert found == [
        "outcome.startswith(OUT_OF_MEMORY)",
        "text.startswith((PIDS_LIMIT, limits.STORAGE_LIMIT))",
        "attempt.cause.endswith('lost')",
        "OUT_OF_MEMORY in words",
    ]

"""The fast lane (``make test-fast``, ``pytest -m "not slow"``) is hermetic: a test not marked
``slow`` starts no process, thread or socket, does not sleep and keeps no wall-clock deadline
(STYLE.md, "The gate"). This test reads the tests' source with ``ast``; it runs and imports none
of them.

A test counts as marked ``slow`` when its module's or class's ``pytestmark``, or a decorator of its
own or of its class, holds ``pytest.mark.slow`` or ``pytest.mark.scaleout`` (directly or through a
module-level name for the mark), or when it asks, directly or through other fixtures, for one of
``harness.lanes.REAL_PROCESS_FIXTURES``: the collection hook there marks those ``slow``.

For every other test it reads the test's body, the bodies of the fixtures it asks for (arguments,
``usefixtures``, autouse fixtures; found in its class, its module, the ``conftest.py`` files above
it and the root conftest's plugins), and the bodies of the functions and classes they call that
are defined in test code (the same module, or a test or ``harness`` module imported by name),
following calls to any depth. What it finds there:

* ``time.sleep`` and ``asyncio.sleep`` (but ``asyncio.sleep(0)``, which only yields), called or
  handed to a call (``watchdog(time.sleep, 1)``);
* ``threading.Thread``/``Timer``, thread and process pools, ``asyncio.to_thread``, a class of
  test code that subclasses ``threading.Thread`` or ``multiprocessing.Process``;
* ``subprocess`` (``Popen``, ``run``, ``check_output``...), ``multiprocessing``, ``os.fork``,
  ``os.system``, ``os.spawn*``, ``asyncio.create_subprocess_*``;
* ``socket`` (but its name look-ups), ``socketserver``, ``http.server``, ``http.client``,
  ``urllib.request.urlopen``, ``requests`` and ``httpx`` calls;
* the ``live_server`` fixture (a server thread);
* a wall-clock deadline: ``time.monotonic()``, ``perf_counter()`` or ``time.time()`` read inside a
  comparison (``while time.monotonic() < deadline``, ``assert time.time() - start < 5``). A clock
  read only for a value (a kernel record's timestamp, a due time handed to the code) is not one.

What it cannot see: product code that starts a thread or process on a test's behalf (an
``EmbeddedControlLoop(...).start()``, an agent's health monitor, a runner launched by
``agent.launch``): only test code is read, so such a test is caught only when it also waits with
a sleep or a deadline, which a test of a thread nearly always does; names bound at run time
(``getattr``, a function passed in and called); fixtures of installed plugins other than
``live_server``; a test whose parameters are only partly marked ``slow`` is read as not slow.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from harness.lanes import REAL_PROCESS_FIXTURES
from harness.sources import parsed

ROOT = Path(__file__).resolve().parents[2]
SLOW_MARKS = {"slow", "scaleout"}  # scaleout: harness.lanes' hook marks it slow too

SLEEPS = {"time.sleep", "asyncio.sleep"}
THREADS = {"threading.Thread", "threading.Timer", "concurrent.futures.ThreadPoolExecutor", "asyncio.to_thread", "_thread.start_new_thread"}
PROCESSES = {
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.popen",
    "os.posix_spawn",
    "os.posix_spawnp",
    "pty.spawn",
    "asyncio.create_subprocess_exec",
    "asyncio.create_subprocess_shell",
    "concurrent.futures.ProcessPoolExecutor",
}
PROCESS_MODULES = ("subprocess.", "multiprocessing.", "os.spawn", "os.exec")
SOCKET_MODULES = ("socket.", "socketserver.", "http.server.", "http.client.", "requests.", "httpx.")
SOCKET_CALLS = {"urllib.request.urlopen"}
SOCKET_LOOKUPS = {"socket.gethostname", "socket.getfqdn", "socket.inet_aton", "socket.inet_ntoa", "socket.htons", "socket.ntohs"}
CLOCKS = {"time.monotonic", "time.monotonic_ns", "time.perf_counter", "time.perf_counter_ns", "time.time", "time.time_ns"}
THREAD_BASES = {"threading.Thread", "multiprocessing.Process"}


def suite_roots() -> list[Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [ROOT / p for p in config["tool"]["pytest"]["ini_options"]["testpaths"]]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted name
    defs: dict[str, ast.AST] = field(default_factory=dict)  # module-level functions and classes
    aliases: dict[str, ast.expr] = field(default_factory=dict)  # module-level NAME = expression
    fixtures: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)

    def dotted(self, node: ast.expr) -> str | None:
        """``time.sleep``, ``subprocess.run``, ``console.tests.x.helper``: what an expression names."""
        if isinstance(node, ast.Name):
            if node.id in self.imports:
                return self.imports[node.id]
            if node.id in self.defs:
                return f"{self.name}.{node.id}"
            return node.id
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None


def is_fixture(node: ast.AST, module: Module) -> str | None:
    """The fixture's name where ``node`` is a function decorated with ``pytest.fixture``."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    for decorator in node.decorator_list:
        call = decorator if isinstance(decorator, ast.Call) else None
        target = call.func if call else decorator
        if module.dotted(target) in {"pytest.fixture", "pytest_asyncio.fixture"}:
            for keyword in call.keywords if call else []:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    return keyword.value.value
            return node.name
    return None


def autouse(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        isinstance(d, ast.Call) and any(k.arg == "autouse" and isinstance(k.value, ast.Constant) and k.value.value for k in d.keywords)
        for d in node.decorator_list
    )


@cache
def load(path: Path) -> Module:
    return parse(path, parsed(path))


def parse(path: Path, tree: ast.Module) -> Module:
    module = Module(module_name(path), path, tree)
    package = module.name.rsplit(".", 1)[0]
    for node in ast.walk(tree):  # breadth first: the module's own imports before a function's
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                module.imports.setdefault(local, alias.name if alias.asname else local)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *([base] if base else [])])
            for alias in node.names:
                module.imports.setdefault(alias.asname or alias.name, f"{base}.{alias.name}")
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            module.defs[node.name] = node
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            module.aliases[node.targets[0].id] = node.value
    for node in tree.body:
        name = is_fixture(node, module)
        if name:
            module.fixtures[name] = node
    return module


@cache
def support_modules() -> dict[str, Path]:
    """Test code a test may call into: every module of a ``tests`` package, the conftests, the
    test harness (``harness/``, its plugins and its helpers) and the root conftest's plugins."""
    found = {}
    for top in suite_roots():
        for path in top.rglob("*.py"):
            if "tests" in path.relative_to(ROOT).parts or path.name.startswith(("test_", "conftest")):
                found[module_name(path)] = path
    for path in (ROOT / "harness").rglob("*.py"):
        found[module_name(path)] = path
    for plugin in plugins():
        found[plugin] = ROOT / Path(*plugin.split(".")).with_suffix(".py")
    return found


@cache
def plugins() -> tuple[str, ...]:
    conftest = load(ROOT / "conftest.py")
    for node in conftest.tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def conftests_above(path: Path) -> list[Module]:
    found = []
    for folder in [path.parent, *path.parent.parents]:
        if (folder / "conftest.py").exists():
            found.append(load(folder / "conftest.py"))
        if folder == ROOT:
            break
    return found


def resolve(dotted: str, here: Module) -> tuple[Module, ast.AST] | None:
    """The definition in test code that ``pkg.tests.module.name`` names, if any."""
    if "." not in dotted:
        return None
    owner, name = dotted.rsplit(".", 1)
    if owner == here.name:
        module = here
    elif owner in support_modules() and support_modules()[owner].exists():
        module = load(support_modules()[owner])
    else:
        return None
    if name in module.defs:
        return module, module.defs[name]
    if name in module.imports and module.imports[name] != dotted:  # re-exported from other test code
        return resolve(module.imports[name], module)
    return None


def names_slow_mark(expr: ast.AST | None, module: Module, seen: frozenset = frozenset()) -> bool:
    for node in ast.walk(expr) if expr is not None else []:
        if isinstance(node, ast.Attribute) and node.attr in SLOW_MARKS and module.dotted(node.value) == "pytest.mark":
            return True
        if (
            isinstance(node, ast.Name)
            and node.id in module.aliases
            and node.id not in seen
            and names_slow_mark(module.aliases[node.id], module, seen | {node.id})
        ):
            return True
    return False


def used_fixtures(marks: list[ast.expr], module: Module, seen: frozenset = frozenset()) -> list[str]:
    """The names in ``pytest.mark.usefixtures(...)`` among ``marks``."""
    names = []
    for expr in marks:
        for node in ast.walk(expr):
            if isinstance(node, ast.Call) and module.dotted(node.func) == "pytest.mark.usefixtures":
                names += [a.value for a in node.args if isinstance(a, ast.Constant)]
            elif isinstance(node, ast.Name) and node.id in module.aliases and node.id not in seen:
                names += used_fixtures([module.aliases[node.id]], module, seen | {node.id})  # MARK = pytest.mark.usefixtures(...)
    return names


def call_finding(call: ast.Call, dotted: str) -> str | None:
    if dotted in SLEEPS:
        if dotted == "asyncio.sleep" and call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value == 0:
            return None
        return f"sleeps ({dotted})"
    if dotted in THREADS:
        return f"starts a thread ({dotted})"
    if dotted in PROCESSES or dotted.startswith(PROCESS_MODULES):
        return f"starts a process ({dotted})"
    if (dotted.startswith(SOCKET_MODULES) or dotted in SOCKET_CALLS) and dotted not in SOCKET_LOOKUPS:
        return f"opens a socket ({dotted})"
    return None


class Reader:
    """Follows one test through the test code it runs; remembers what it read."""

    def __init__(self, test_module: Module, test_class: ast.ClassDef | None):
        self.module = test_module
        self.test_class = test_class
        self.read: set[tuple[str, str]] = set()

    def fixture(self, name: str) -> tuple[Module, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        if self.test_class is not None:
            for node in self.test_class.body:
                if is_fixture(node, self.module) == name:
                    return self.module, node  # type: ignore[return-value]
        for module in [self.module, *conftests_above(self.module.path), *(load(support_modules()[p]) for p in plugins())]:
            if name in module.fixtures:
                return module, module.fixtures[name]
        return None

    def autouse_fixtures(self) -> list[str]:
        names = []
        bodies = [self.module.tree.body, *([self.test_class.body] if self.test_class else [])]
        for module in [*conftests_above(self.module.path), *(load(support_modules()[p]) for p in plugins())]:
            bodies.append(module.tree.body)
            names += [n for n, f in module.fixtures.items() if autouse(f)]
        for body in bodies[:2]:
            names += [n.name for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and is_fixture(n, self.module) and autouse(n)]
        return names

    def fixture_closure(self, names: list[str]) -> set[str]:
        closure: set[str] = set()
        todo = list(names)
        while todo:
            name = todo.pop()
            if name in closure:
                continue
            closure.add(name)
            found = self.fixture(name)
            if found:
                todo += [a.arg for a in found[1].args.args]
        return closure

    def findings(self, module: Module, node: ast.AST, via: str) -> list[str]:
        key = (module.name, f"{getattr(node, 'name', '?')}:{getattr(node, 'lineno', 0)}")
        if key in self.read:
            return []
        self.read.add(key)
        found = []
        if isinstance(node, ast.ClassDef) and any(module.dotted(b) in THREAD_BASES for b in node.bases):
            found.append(f"{via}starts a thread or process (class {node.name} subclasses one)")
        for child in ast.walk(node):
            if isinstance(child, ast.Call):
                dotted = module.dotted(child.func)
                if dotted is None:
                    continue
                finding = call_finding(child, dotted)
                passed = [module.dotted(a) for a in [*child.args, *(k.value for k in child.keywords)]]
                if not finding and SLEEPS & set(passed):
                    finding = f"sleeps ({(SLEEPS & set(passed)).pop()} handed to {dotted})"
                if finding:
                    found.append(f"{via}{finding} at {module.path.relative_to(ROOT)}:{child.lineno}")
                    continue
                target = resolve(dotted, module)
                if target is not None and target[1] is not node:
                    found += self.findings(target[0], target[1], f"{via}{dotted.rsplit('.', 1)[1]}() ")
            elif isinstance(child, ast.Compare):
                clocks = [module.dotted(c.func) for c in ast.walk(child) if isinstance(c, ast.Call) and module.dotted(c.func) in CLOCKS]
                if clocks:
                    found.append(f"{via}keeps a wall-clock deadline ({clocks[0]}() compared) at {module.path.relative_to(ROOT)}:{child.lineno}")
        return found


def functions_under_test(module: Module):
    """(test function, its class or None) for every test of a module."""
    for node in module.tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            yield node, None
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef) and member.name.startswith("test"):
                    yield member, node


def class_marks(test_class: ast.ClassDef | None) -> list[ast.expr]:
    if test_class is None:
        return []
    marks = list(test_class.decorator_list)
    for node in test_class.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            marks.append(node.value)
    return marks


def module_offences(module: Module) -> list[str]:
    offences = []
    module_marks = [module.aliases["pytestmark"]] if "pytestmark" in module.aliases else []
    for test, test_class in functions_under_test(module):
        marks = [*module_marks, *class_marks(test_class), *test.decorator_list]
        if any(names_slow_mark(m, module) for m in marks):
            continue
        reader = Reader(module, test_class)
        asked = [a.arg for a in test.args.args] + used_fixtures(marks, module) + reader.autouse_fixtures()
        closure = reader.fixture_closure(asked)
        if closure & REAL_PROCESS_FIXTURES:
            continue  # marked slow at collection
        found = reader.findings(module, test, "")
        if "live_server" in closure:
            found.append("uses the live_server fixture (a server thread)")
        for name in sorted(closure):
            fixture = reader.fixture(name)
            if fixture is not None:
                found += reader.findings(fixture[0], fixture[1], f"fixture {name}: ")
        if found:
            where = f"{module.path.relative_to(ROOT)}:{test.lineno} {test_class.name + '.' if test_class else ''}{test.name}"
            offences.append(f"{where}\n      " + "\n      ".join(dict.fromkeys(found)))
    return offences


def fast_lane_offences() -> list[str]:
    return [offence for top in suite_roots() for path in sorted(top.rglob("test_*.py")) for offence in module_offences(load(path))]


def test_no_test_of_the_fast_lane_starts_a_process_thread_or_socket_sleeps_or_keeps_a_deadline():
    offences = fast_lane_offences()
    assert not offences, (
        f"{len(offences)} tests outside the slow mark start a process, thread or socket, sleep or keep a wall-clock deadline; "
        "mark them pytest.mark.slow, or wait on an event the code exposes / move time with time_machine:\n  " + "\n  ".join(offences)
    )


def test_the_modules_the_fast_lane_does_not_import_hold_slow_tests_only():
    """``harness.lanes.SLOW_ONLY_MODULES`` are left out of the fast lane's collection: every test
    in them must be marked ``slow``, or the fast lane would silently lose it."""
    from harness.lanes import SLOW_ONLY_MODULES

    for name in sorted(SLOW_ONLY_MODULES):
        module = load(ROOT / name)
        module_marks = [module.aliases["pytestmark"]] if "pytestmark" in module.aliases else []
        tests = list(functions_under_test(module))
        assert tests, name
        for test, test_class in tests:
            marks = [*module_marks, *class_marks(test_class), *test.decorator_list]
            assert any(names_slow_mark(m, module) for m in marks), f"{name}:{test.lineno} {test.name} is not marked slow"


SAMPLE = """
import asyncio, socket, threading, time
import pytest
from subprocess import run as go

pytestmark = pytest.mark.django_db
slow = pytest.mark.slow

def helper():
    time.sleep(0.1)

def outer():
    helper()

@pytest.fixture
def worker():
    threading.Thread(target=print).start()

@pytest.fixture
def indirect(worker):
    return 1

class Server(threading.Thread):
    pass

USES_WORKER = pytest.mark.usefixtures("worker")

def test_a_helper_of_a_helper_sleeps():
    outer()

def test_a_fixture_of_a_fixture_starts_a_thread(indirect):
    pass

def test_a_deadline():
    deadline = time.time() + 5
    assert time.time() < deadline

def test_a_process():
    go(["true"])

def test_a_process_imported_inside():
    from os import system
    system("true")

def test_a_thread_class():
    Server()

def test_a_live_server(live_server):
    pass

async def test_a_yield_and_a_host_name():
    await asyncio.sleep(0)
    socket.gethostname()

@USES_WORKER
def test_a_fixture_through_a_named_mark():
    pass

def test_a_sleep_handed_to_a_call():
    later(time.sleep, 1)

@pytest.mark.slow
def test_marked():
    time.sleep(1)

@slow
def test_marked_by_name():
    time.sleep(1)

def test_a_live_console(live_console):
    time.sleep(1)

class TestGroup:
    pytestmark = pytest.mark.slow

    def test_in_a_slow_class(self):
        time.sleep(1)
"""


def test_the_checker_sees_what_it_is_meant_to_see():
    """The reader itself, on a module written for it."""
    offences = module_offences(parse(Path(__file__).with_name("test_fast_lane_sample.py"), ast.parse(SAMPLE)))
    found = {offence.split()[1]: offence for offence in offences}
    assert sorted(found) == [
        "test_a_deadline",
        "test_a_fixture_of_a_fixture_starts_a_thread",
        "test_a_fixture_through_a_named_mark",
        "test_a_helper_of_a_helper_sleeps",
        "test_a_live_server",
        "test_a_process",
        "test_a_process_imported_inside",
        "test_a_sleep_handed_to_a_call",
        "test_a_thread_class",
    ]
    assert "outer() helper() sleeps (time.sleep)" in found["test_a_helper_of_a_helper_sleeps"]
    assert "fixture worker: starts a thread (threading.Thread)" in found["test_a_fixture_of_a_fixture_starts_a_thread"]
    assert "wall-clock deadline (time.time() compared)" in found["test_a_deadline"]
    assert "starts a process (subprocess.run)" in found["test_a_process"]
    assert "class Server subclasses one" in found["test_a_thread_class"]
    assert "time.sleep handed to later" in found["test_a_sleep_handed_to_a_call"]
    assert "fixture worker: starts a thread" in found["test_a_fixture_through_a_named_mark"]

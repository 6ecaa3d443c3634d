"""What ``ARCHITECTURE.md`` states, checked against the code wherever code can check it.

* every name it puts in backticks exists: a module, a function, a class and its method, a setting,
  a Celery task name, a management command, a file, a job status; the few spans that are prose
  (``POST /api/v1/…``, ``podman run``) point at the code that makes them true (``PROSE``);
* the data-model sketch names every model and no other, and the relations it draws are the
  models' own (``RELATIONS``);
* who reads ``LogLine`` (``logs.queries`` alone) and who writes each table (``WRITERS``);
* the floors inside ``jobs.services``, what failover uses of the agent, tasks sent by name,
  the plug-ins registered through the lower floor's interfaces, the runner on the standard library;
* every link between the docs, and every ``.md`` file the code cites, exists.

A statement changed in ARCHITECTURE.md that one of these checks covers changes here too.
Production code only: tests, migrations and ``bench/`` are left out (the test harness, ``harness/``,
is no app package).
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import grimp
import pytest

from harness.sources import parsed, walked

ROOT = Path(__file__).resolve().parents[2]
APPS = ["jobs", "logs", "agent", "failover", "notify", "console"]
PACKAGES = [*APPS, "ckptlib"]
DOC = ROOT / "ARCHITECTURE.md"


# --- the code, read once ---------------------------------------------------------------------
def production(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return not ({"tests", "migrations", "vendor", "__pycache__"} & set(parts))


@cache
def files() -> dict[str, Path]:
    """Production modules by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if production(path):
                parts = list(path.relative_to(ROOT).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = path
    return found


def tree(module: str) -> ast.Module:
    return parsed(files()[module])


def nodes(module: str) -> tuple[ast.AST, ...]:
    """Every node of ``module``'s tree, in ``ast.walk``'s order."""
    return walked(files()[module])


def defined_in(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body defines (functions, classes, assignments, imports)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):
            names.update(defined_in(node.body))
    return names


@cache
def definitions() -> dict[str, set[str]]:
    """Every name defined anywhere (module level, class level, methods) → the modules defining it."""
    where: dict[str, set[str]] = {}
    for module in files():
        for node in nodes(module):
            if isinstance(node, (ast.Module, ast.ClassDef)):
                for name, value in defined_in(node.body).items():
                    if not isinstance(value, (ast.Import, ast.ImportFrom)):
                        where.setdefault(name, set()).add(module)
    return where


@cache
def string_literals() -> set[str]:
    return {node.value for module in files() for node in nodes(module) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


@cache
def task_names() -> set[str]:
    """Celery task names: the ``*_TASK`` constants and ``shared_task(name="…")`` literals."""
    names = set()
    for module in files():
        for node in nodes(module):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and any(isinstance(t, ast.Name) and t.id.endswith("_TASK") for t in node.targets)
            ):
                names.add(node.value.value)
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "shared_task":
                for keyword in node.keywords:
                    if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                        names.add(keyword.value.value)
    return names


@cache
def job_statuses() -> set[str]:
    from jobs.statuses import JobStatus

    return set(JobStatus.values)


@cache
def tracked_file_names() -> set[str]:
    """The names of the checkout's files (git's list: not var/'s container storage or .venv)."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {Path(line).name for line in listed.splitlines()}


def management_commands() -> set[str]:
    return {p.stem for p in ROOT.glob("*/management/commands/*.py") if not p.stem.startswith("_")}


# --- names in backticks ------------------------------------------------------------------------
# Spans that are prose rather than a name, each with (files, text every one of them must hold
# in one file) that makes it true.
PROSE = {
    "POST /api/v1/training-jobs/": [("console/urls.py", "api/v1/"), ("console/api/urls.py", '"training-jobs"')],
    "podman run": [("agent/sandbox.py", '"run"')],
    "UPDATE … CASE": [("jobs/services/bulk.py", "UPDATE"), ("jobs/services/bulk.py", "CASE")],
    '{"n", "t", "s"}': [("agent/*.py", '"n"'), ("agent/*.py", '"t"'), ("agent/*.py", '"s"')],
    "pyproject.toml": [("pyproject.toml", "[tool.importlinter]")],
    "lint-imports": [("Makefile", "lint-imports")],
    "make lint": [("Makefile", "\nlint:")],
}
# Names that are not this project's: where they come from.
EXTERNAL = {"PROTECT": "django.db.models.PROTECT"}
# Where a short dotted name (``runs.run_started``) may live.
PREFIXES = ["", "jobs.services.", "jobs.", "logs.", "agent.", "failover.services.", "failover.", "notify.", "console."]


def resolves(dotted: str) -> bool:
    """``a.b.C.d``: the longest prefix that is a module, then names defined inside it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module not in files():
            continue
        body: list[ast.stmt] = tree(module).body
        for name in parts[cut:]:
            node = defined_in(body).get(name)
            if node is None:
                submodule = f"{module}.{name}"
                if submodule in files():
                    module, body = submodule, tree(submodule).body
                    continue
                return False
            body = node.body if isinstance(node, ast.ClassDef) else []
        return True
    return False


def class_attribute(dotted: str) -> bool:
    """``NodeAgent.request_launch``: a class defined somewhere, and the name in its body."""
    cls, _, attr = dotted.partition(".")
    for module in definitions().get(cls, ()):
        for node in nodes(module):
            if isinstance(node, ast.ClassDef) and node.name == cls and attr in defined_in(node.body):
                return True
    return False


def prose_holds(span: str) -> bool:
    return all(any(text in path.read_text() for path in ROOT.glob(pattern)) for pattern, text in PROSE[span])


def external(name: str) -> bool:
    module, _, attr = EXTERNAL[name].rpartition(".")
    return hasattr(importlib.import_module(module), attr)


def why_unresolved(span: str) -> str | None:
    """None when the span names something that exists; else what it looked for."""
    if span in PROSE:
        return None if prose_holds(span) else f"the code behind it ({PROSE[span]})"
    if span in EXTERNAL:
        return None if external(span) else EXTERNAL[span]
    if span in job_statuses():
        return None
    text = re.sub(r"\(.*\)$", "", span).strip()  # on_reconcile(nodes), record_reason(failover_count + 1)
    words = text.split()
    if words[:2] == ["python", "-m"]:
        return None if words[2] in files() else f"module {words[2]}"
    if words[0] == "manage.py":
        return None if words[1] in management_commands() else f"management command {words[1]}"
    if "/" in text:
        return None if (ROOT / text).exists() else f"path {text}"
    if re.fullmatch(r"[\w-]+\.(py|md|js|json|jsonl|css|html)", text):
        known = text in string_literals() or text in tracked_file_names() or (ROOT / text).exists()
        return None if known else f"a file or a string {text!r} in the code"
    if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", text):
        if "." not in text:
            known = text in definitions() or text in {m.rsplit(".", 1)[-1] for m in files()} or text in string_literals()
            return None if known else f"a name {text!r} defined in the code"
        if any(resolves(prefix + text) for prefix in PREFIXES) or text in task_names() or class_attribute(text):
            return None
        return f"module or name {text}"
    return "a known form (add it to PROSE with the code that makes it true)"


def backticked(markdown: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return sorted({span for span in re.findall(r"`([^`\n]+)`", prose)})


def fenced(markdown: str) -> list[str]:
    return re.findall(r"```\n(.*?)```", markdown, flags=re.S)


@pytest.mark.slow  # git ls-files
def test_every_name_in_backticks_exists():
    missing = [f"`{span}`: no {why}" for span in backticked(DOC.read_text()) if (why := why_unresolved(span))]
    assert missing == [], "ARCHITECTURE.md names what the code does not have:\n" + "\n".join(missing)


def test_every_module_and_file_in_the_drawings_exists():
    names, paths = set(), set()
    for block in fenced(DOC.read_text()):
        names |= set(re.findall(r"\b(?:jobs|logs|agent|failover|notify|console)\.[a-z_][\w.]*[a-z_]", block))
        paths |= set(re.findall(r"\b[\w/]+\.py\b", block))
    missing = [n for n in sorted(names) if not any(resolves(p + n) for p in PREFIXES) and n not in task_names()]
    missing += [p for p in sorted(paths) if not any(str(f).endswith("/" + p) for f in files().values())]
    assert missing == []


@pytest.mark.slow  # git ls-files
def test_the_name_check_catches_a_wrong_name():
    # The last round's wrong statements, which this check must refuse.
    assert why_unresolved("dispatch.dispatch_launch") is not None
    assert why_unresolved("jobs.hooks") is not None
    assert why_unresolved("failover/CLASSIFY.md") is not None
    assert why_unresolved("runs.launchable") is not None
    assert why_unresolved("messages.dispatch_launches") is None
    assert why_unresolved("agent.launch_attempt") is None  # a task name
    assert why_unresolved("Pending - failoverinprogress") is None


# --- the data model --------------------------------------------------------------------------
def model_classes() -> set[str]:
    from django.apps import apps

    return {m.__name__ for m in apps.get_models() if m._meta.app_label in APPS}


def data_model_block() -> str:
    section = DOC.read_text().split("## The data model", 1)[1].split("\n## ", 1)[0]
    return fenced(section)[0]


# Class-like words of the sketch that are not our models: Django's user, knox's token, a Node's states.
NOT_MODELS_OF_OURS = {"User", "AuthToken", "Ready", "NotReady"}


def test_the_data_model_sketch_names_every_model_and_nothing_else():
    words = set(re.findall(r"\b[A-Z][A-Za-z]*\b", data_model_block()))
    # Class-like: capitalised with a lower-case letter (all-caps words are abbreviations), or a model.
    drawn = {w for w in words if not w.isupper() or w in model_classes()}
    assert model_classes() - drawn == set(), "models missing from the sketch"
    assert drawn - model_classes() - NOT_MODELS_OF_OURS == set(), "names in the sketch that are no model"


# (model, field, related model, on_delete name or None): the relations the sketch draws.
RELATIONS = [
    ("Project", "members", "User", None),
    ("Project", "personal_for", "User", "CASCADE"),
    ("ProjectVolume", "project", "Project", "CASCADE"),
    ("CodeBundle", "owner", "User", "CASCADE"),
    ("CodeBundle", "project", "Project", "CASCADE"),
    ("TrainingJob", "code", "CodeBundle", "PROTECT"),
    ("TrainingJob", "warm_start_job", "TrainingJob", "SET_NULL"),
    ("RegistryCredential", "project", "Project", "CASCADE"),
    ("RegistryCredential", "registry", "Registry", "CASCADE"),
    ("TrainingJob", "owner", "User", "CASCADE"),
    ("TrainingJob", "project", "Project", "PROTECT"),
    ("JobEvent", "job", "TrainingJob", "CASCADE"),
    ("JobAttempt", "job", "TrainingJob", "CASCADE"),
    ("JobAttempt", "preempted_for", "TrainingJob", "SET_NULL"),
    ("AttemptNode", "attempt", "JobAttempt", "CASCADE"),
    ("AttemptNode", "node", "Node", "PROTECT"),
    ("JobExclusion", "job", "TrainingJob", "CASCADE"),
    ("JobExclusion", "node", "Node", "CASCADE"),
    ("ResourceSample", "job", "TrainingJob", "CASCADE"),
    ("LogLine", "job", "TrainingJob", "CASCADE"),
    ("LogVolume", "job", "TrainingJob", "CASCADE"),
    ("JobProgress", "job", "TrainingJob", "CASCADE"),
    ("MetricPoint", "job", "TrainingJob", "CASCADE"),
    ("Checkpoint", "job", "TrainingJob", "CASCADE"),
    ("Replica", "job", "TrainingJob", "CASCADE"),
    ("Replica", "attempt", "JobAttempt", "CASCADE"),
    ("Replica", "holder", "Node", "CASCADE"),
    ("ReplicaEndpoint", "node", "Node", "CASCADE"),
    ("GPU", "node", "Node", "CASCADE"),
    ("GPU", "allocated_to", "AttemptNode", "SET_NULL"),
    ("NodeHealth", "node", "Node", "CASCADE"),
    ("HealthEvent", "node", "Node", "CASCADE"),
    ("EvidenceCursor", "node", "Node", "CASCADE"),
    ("SimulatedFault", "node", "Node", "CASCADE"),
    ("Subscription", "user", "User", "CASCADE"),
    ("Subscription", "job", "TrainingJob", "CASCADE"),
    ("Subscription", "project", "Project", "CASCADE"),
    ("Delivery", "subscription", "Subscription", "CASCADE"),
    ("Delivery", "event", "JobEvent", "CASCADE"),
]
ONE_TO_ONE = {("Project", "personal_for"), ("LogVolume", "job"), ("JobProgress", "job"), ("NodeHealth", "node"), ("ReplicaEndpoint", "node")}
# "The attempt … is its number, not a foreign key."
ATTEMPT_BY_NUMBER = ["JobEvent", "LogLine", "Checkpoint", "ResourceSample"]


def model(name: str):
    from django.apps import apps

    return next(m for m in apps.get_models() if m.__name__ == name and m._meta.app_label in [*APPS, "auth"])


@pytest.mark.parametrize("name, field, target, on_delete", RELATIONS)
def test_the_sketchs_relations_are_the_models(name, field, target, on_delete):
    f = model(name)._meta.get_field(field)
    assert f.is_relation and f.related_model.__name__ == target
    if on_delete is not None:
        assert f.remote_field.on_delete.__name__ == on_delete
    assert f.one_to_one == ((name, field) in ONE_TO_ONE)


def test_every_foreign_key_of_ours_is_drawn():
    drawn = {(n, f) for n, f, _, _ in RELATIONS}
    real = {(m.__name__, f.name) for m in map(model, model_classes()) for f in m._meta.get_fields() if f.is_relation and f.concrete}
    assert real - drawn == set()


@pytest.mark.parametrize("name", ATTEMPT_BY_NUMBER)
def test_the_attempt_is_a_number_not_a_key(name):
    assert not model(name)._meta.get_field("attempt").is_relation


# --- who reads and writes which table -----------------------------------------------------------
WRITE_CALLS = {"create", "update", "delete", "bulk_create", "bulk_update", "get_or_create", "update_or_create"}


def chain_root(node: ast.AST) -> tuple[str | None, list[str]]:
    """The name a call chain starts from and the attributes along it (``X.objects.filter(…).update``)."""
    attrs = []
    while True:
        if isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id, attrs[::-1]
        else:
            return None, attrs[::-1]


def manager_writes(module_tree: ast.Module) -> set[str]:
    """The models a module writes through their manager (``Model.objects…update(…)``). A queryset
    kept in a variable, or an instance's ``save()``, is not seen."""
    written = set()
    for node in ast.walk(module_tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITE_CALLS:
            root, attrs = chain_root(node.func)
            if root and "objects" in attrs:
                written.add(root)
    return written


# The table "Who owns which table": each model, the modules allowed to write it through its manager
# (a prefix covers a package). The admin writes through its forms, which this does not see.
WRITERS = {
    "TrainingJob": ["jobs.services.creation", "jobs.services.lifecycle"],
    "JobEvent": ["jobs.services.lifecycle"],
    "JobAttempt": ["jobs.services.placement", "jobs.services.runs", "agent.launch", "agent.node_agent", "failover.services"],
    "AttemptNode": ["jobs.services.placement", "jobs.services.runs", "agent.launch", "failover.services"],
    "JobExclusion": ["failover.services.policy", "failover.services.faults"],
    "ResourceSample": ["jobs.services.samples"],
    "Project": ["jobs.services.creation", "jobs.services.placement"],
    "ProjectVolume": [],
    "Registry": [],
    "RegistryCredential": [],
    "CodeBundle": ["jobs.services.bundles"],
    "Replica": ["agent.checkpointless"],
    "ReplicaEndpoint": ["agent.checkpointless"],
    "Image": ["console.management.commands.bootstrap"],
    "Node": [
        "agent.inventory",
        "agent.node_agent",
        "agent.slurm",
        "console.management.commands.nodeagent",
        "jobs.services.nodes",
        "jobs.services.runs",
        "failover.services",
    ],
    "GPU": ["agent.inventory", "jobs.services.placement", "failover.services"],
    "LogLine": ["logs.services"],
    "LogVolume": ["logs.services"],
    "JobProgress": ["logs.progress"],
    "MetricPoint": ["logs.progress"],
    "Checkpoint": ["logs.progress"],
    "NodeHealth": ["failover.services"],
    "SimulatedFault": ["failover.services"],
    "HealthEvent": ["failover.services"],
    "EvidenceCursor": ["failover.services"],
    "Subscription": ["notify"],
    "Delivery": ["notify.services"],
}


def test_every_model_has_its_writers_listed():
    assert set(WRITERS) == model_classes()


def test_each_table_is_written_only_by_its_owners():
    wrong = sorted(
        f"{module} writes {name}"
        for module in files()
        for name in manager_writes(tree(module)) & set(WRITERS)
        if not any(module == owner or module.startswith(owner + ".") for owner in WRITERS[name])
    )
    assert wrong == [], "ARCHITECTURE.md's table 'Who owns which table' says otherwise:\n" + "\n".join(wrong)


def test_logs_progress_writes_only_inside_ingestion():
    # "ingest_lines, which folds progress, loss points and checkpoints through logs.progress"
    importers = sorted(
        module
        for module in files()
        for node in nodes(module)
        if isinstance(node, ast.ImportFrom) and node.module == "logs.progress" and any(a.name == "record_metrics" for a in node.names)
    )
    assert importers == ["logs.services"]


def loglines_reads(module_tree: ast.Module) -> list[str]:
    """Where a module reads ``LogLine``: any use of the model (or a job's ``log_lines``) that is not a
    write through its manager, and any SQL string that selects from it."""
    found = []
    writes = set()
    for node in ast.walk(module_tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITE_CALLS:
            root, attrs = chain_root(node.func)
            if root == "LogLine" and "objects" in attrs:
                for inner in ast.walk(node.func):
                    writes.add(id(inner))
    for node in ast.walk(module_tree):
        if isinstance(node, ast.Attribute) and node.attr == "objects" and getattr(node.value, "id", None) == "LogLine":
            if id(node) not in writes:
                found.append(f"line {node.lineno}: LogLine.objects (a read)")
        elif isinstance(node, ast.Attribute) and node.attr == "log_lines":
            found.append(f"line {node.lineno}: .log_lines")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(r"\bSELECT\b", node.value):
            found.append(f"line {node.lineno}: SQL {node.value[:40]!r}")
    return found


def test_every_read_of_loglines_is_in_logs_queries():
    users = sorted(module for module in files() if any(isinstance(n, ast.Name) and n.id == "LogLine" for n in nodes(module)))
    assert set(users) <= {"logs.models", "logs.queries", "logs.services"}, users
    assert loglines_reads(tree("logs.services")) == []
    assert not any("logs_logline" in text for text in string_literals())


def test_the_read_check_sees_a_read():
    sample = ast.parse(
        "LogLine.objects.filter(job_id=1).update(text='x')\n"
        "LogLine.objects.filter(job_id=1).delete()\n"
        "n = LogLine.objects.filter(job_id=1).count()\n"
        "cursor.execute(f'SELECT MAX(seq) FROM {table}')\n"
    )
    found = loglines_reads(sample)
    assert sorted(f.split(":")[0] for f in found) == ["line 3", "line 4"]


# --- floors, interfaces, tasks -----------------------------------------------------------------------
@cache
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES)


def imports_of(module: str) -> set[str]:
    return {m for m in graph().find_modules_directly_imported_by(module) if m in files()}


# "`lifecycle`, `paths`, `limits` and `messages` < `placement` < `runs`, `actions`, `creation` < `control`"
SERVICE_FLOORS = [["lifecycle", "paths", "limits", "messages"], ["placement"], ["runs", "actions", "creation"], ["control"]]


def test_the_floors_inside_jobs_services():
    upward = []
    for i, floor in enumerate(SERVICE_FLOORS):
        above = {f"jobs.services.{name}" for later in SERVICE_FLOORS[i + 1 :] for name in later}
        for name in floor:
            upward += [f"{name} -> {t}" for t in sorted(imports_of(f"jobs.services.{name}") & above)]
    assert upward == []


def test_the_services_that_stand_on_the_models_alone():
    assert imports_of("jobs.services.bulk") == set()  # Django alone
    for name in ("capacity", "samples", "images"):
        assert imports_of(f"jobs.services.{name}") <= {"jobs.models"}, name
    assert imports_of("jobs.services.nodes") <= {"jobs.models", "jobs.services.wakeups"}
    assert imports_of("jobs.fairshare") == set()  # database-free
    assert manager_writes(tree("jobs.services.quotas")) == set()  # reads only


AGENT_INTERFACES = {"agent.plugins", "agent.sampling", "agent.local_agents", "agent.processes"}


def test_failover_uses_nothing_else_of_the_agent():
    used = {t for m in files() if m.startswith("failover.") for t in imports_of(m) if t.startswith("agent.")}
    assert used <= AGENT_INTERFACES
    from_processes = {
        alias.name
        for m in files()
        if m.startswith("failover")
        for node in nodes(m)
        if isinstance(node, ast.ImportFrom) and node.module == "agent.processes"
        for alias in node.names
    }
    assert from_processes <= {"signal_run"}


def test_work_reaches_the_agent_by_task_name():
    from jobs.services import messages

    agent_tasks = {
        kw.value.id
        for node in nodes("agent.tasks")
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "shared_task"
        for kw in node.keywords
        if kw.arg == "name" and isinstance(kw.value, ast.Name)
    }
    assert agent_tasks == {"LAUNCH_TASK", "RECONCILE_TASK"}
    assert {messages.LAUNCH_TASK, messages.RECONCILE_TASK} == {"agent.launch_attempt", "agent.reconcile"}
    assert not any(t.startswith("agent") for m in files() if m.startswith("jobs.") for t in imports_of(m))


# "failover … plugs into jobs (a FailedRunHandler, a control-round hook) and into the agent (a plug-in)" …
REGISTRATIONS = {
    "failover.apps": {"handle_failed_runs_with", "on_control_round", "register"},
    "logs.apps": {"on_control_round"},
    "notify.apps": {"on_status_change"},
    "agent.apps": {"register", "wake_agents_with"},
}


@pytest.mark.parametrize("module, calls", sorted(REGISTRATIONS.items()))
def test_plugins_register_through_the_lower_floors_interfaces(module, calls):
    made = {getattr(n.func, "attr", getattr(n.func, "id", None)) for n in nodes(module) if isinstance(n, ast.Call)}
    assert calls <= made


def test_every_long_lived_socket_rechecks_access():
    consumers = [
        (module, node)
        for module in files()
        for node in nodes(module)
        if isinstance(node, ast.ClassDef) and any("WebsocketConsumer" in ast.unparse(b) for b in node.bases)
    ]
    assert consumers, "no consumer found: the check looks in the wrong place"
    missing = [f"{m}.{n.name}" for m, n in consumers if not any(ast.unparse(b) == "AccessRechecks" for b in n.bases)]
    assert missing == []


@pytest.mark.slow  # a Python process of its own
def test_the_runner_needs_the_standard_library_only():
    # "the runner (`agent.runner`, standard library only)": it runs beside the job, without Django.
    code = "import json, sys, agent.runner; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    third_party = {m for m in loaded - set(sys.stdlib_module_names) if not m.startswith("_")} - {"agent", "logs", "ckptlib"}
    assert third_party == set()


# --- docs ---------------------------------------------------------------------------------------------
def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    found = {slug(h) for h in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M)}
    return found | set(re.findall(r'<a id="([^"]+)"', text))


DOCS = [ROOT / "README.md", DOC, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_between_the_docs_exists(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(target)
    assert broken == []


# Cited by code but not written yet: each entry must still be missing (remove it once the doc exists).
KNOWN_MISSING = {("failover/services/policy.py", "DESIGN.md")}


def cited_docs() -> set[tuple[str, str]]:
    cited = set()
    for path in files().values():
        for name in re.findall(r"\b((?:[\w-]+/)*[\w-]+\.md)\b", path.read_text()):
            cited.add((str(path.relative_to(ROOT)), name))
    return cited


def test_every_doc_the_code_cites_exists():
    missing = {(where, name) for where, name in cited_docs() if not (ROOT / name).exists() and not list(ROOT.glob(f"*/{name}"))}
    assert missing - KNOWN_MISSING == set(), "the code cites docs that do not exist"
    assert KNOWN_MISSING - missing == set(), "written since: remove it from KNOWN_MISSING"

"""The engines the control plane speaks to (issue 44): every one implements
``jobs.backends.base.Backend``, and the two kinds, the console's own agents and Slurm, end as
siblings, neither subclassing the other's classes.

Issue 44's step C6 got there: ``agent.slurm.SlurmEngine`` composes the agents' loop with Slurm's
ports (``agent.ports``) instead of subclassing ``NodeAgent`` and ``Launcher``, whose overrides it
had listed here in a ratchet that only shrank, to none.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from harness.sources import walked

ROOT = Path(__file__).resolve().parents[2]
APPS = ["jobs", "logs", "agent", "failover", "notify", "console"]

# The classes that implement Backend, by module and name. Issue 44's end (its step C6):
# {"agent.node_agent.NodeAgent", "agent.slurm.SlurmEngine"}, neither a subclass of the other's.
GOAL = {"agent.node_agent.NodeAgent", "agent.slurm.SlurmEngine"}
BACKENDS = GOAL

# The agents' classes the Slurm engine must stop subclassing, by the module that defines each.
AGENTS_CLASSES = {"NodeAgent": "agent.node_agent", "Launcher": "agent.launch"}
# What subclasses of them override (``__init__`` not counted): 11 at the start (issue 44's plan
# counted ten, before ``evidence_source``, its step C1, became one more); none since its step C6,
# and no production class subclasses them.
# None left: each became a call on a port the agent composes (``agent.ports``).
OVERRIDES: dict[str, set[str]] = {}


def production_files(root: Path = ROOT) -> list[Path]:
    return sorted(path for app in APPS for path in (root / app).rglob("*.py") if not {"tests", "migrations", "__pycache__"} & set(path.relative_to(root).parts))


def module_name(path: Path, root: Path = ROOT) -> str:
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    return name.removesuffix(".__init__")


def base_names(node: ast.ClassDef) -> set[str]:
    return {base.id if isinstance(base, ast.Name) else base.attr for base in node.bases if isinstance(base, (ast.Name, ast.Attribute))}


def subclasses_of(names: set[str], files: list[Path], root: Path = ROOT) -> dict[str, ast.ClassDef]:
    """The classes defined in ``files`` (at any depth) whose bases name one of ``names``."""
    return {
        f"{module_name(path, root)}.{node.name}": node for path in files for node in walked(path) if isinstance(node, ast.ClassDef) and base_names(node) & names
    }


def overrides(files: list[Path], bases: dict[str, set[str]], root: Path = ROOT) -> dict[str, set[str]]:
    """For each class in ``files`` that subclasses one of ``bases`` (name → its methods), the
    methods it defines that the base has (``__init__`` aside)."""
    found = {}
    for name, node in subclasses_of(set(bases), files, root).items():
        inherited = set().union(*(bases[base] for base in base_names(node) if base in bases))
        defined = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
        found[name] = (defined & inherited) - {"__init__"}
    return found


def test_the_engines_the_control_plane_speaks_to_implement_backend():
    from agent.node_agent import NodeAgent
    from agent.slurm import SlurmEngine
    from jobs.backends.base import Backend

    assert set(subclasses_of({"Backend"}, production_files())) == BACKENDS
    assert BACKENDS <= GOAL
    # What agent.backend may return is a complete Backend (no abstract method left).
    for engine in (NodeAgent, SlurmEngine):
        assert issubclass(engine, Backend) and not inspect.isabstract(engine), engine
    # Siblings: neither is the other's subclass.
    assert not issubclass(SlurmEngine, NodeAgent) and not issubclass(NodeAgent, SlurmEngine)


def test_no_engine_overrides_or_subclasses_the_agents_classes():
    import importlib

    bases = {
        name: {n for n in dir(getattr(importlib.import_module(module), name)) if not n.startswith("__")} | {"__init__"}
        for name, module in AGENTS_CLASSES.items()
    }
    found = {name: methods for name, methods in overrides(production_files(), bases).items() if methods}
    grown = {name: sorted(methods - OVERRIDES.get(name, set())) for name, methods in found.items() if methods - OVERRIDES.get(name, set())}
    assert grown == {}, "new overrides of the agents' classes (issue 44: call a port the engine composes instead):\n" + repr(grown)
    assert found == OVERRIDES, "fewer overrides than listed: take them off OVERRIDES (the ratchet only goes down)"
    # The goal reached: the engines compose the agents' classes, no production class subclasses them.
    assert BACKENDS == GOAL
    assert sorted(subclasses_of(set(AGENTS_CLASSES), production_files())) == []


def test_the_override_check_sees_an_override(tmp_path):
    (tmp_path / "agent").mkdir()
    sample = tmp_path / "agent" / "sample.py"
    sample.write_text(
        "class Engine(node_agent.NodeAgent):\n    def __init__(self): ...\n    def step(self): ...\n    def poll(self): ...\n"
        "class Other(Something):\n    def step(self): ...\n"
    )
    found = overrides([sample], {"NodeAgent": {"__init__", "step", "delay"}}, root=tmp_path)
    assert found == {"agent.sample.Engine": {"step"}}

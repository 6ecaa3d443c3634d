"""A stand-in for a node agent, for the health checker's tests: it serves node-a (the node the
``gpus`` fixture of ``failover/tests/conftest.py`` gives GPUs behind the fake pynvml)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class FakeAgent:
    name: str = "agent-1"
    node_names: list = field(default_factory=lambda: ["node-a"])

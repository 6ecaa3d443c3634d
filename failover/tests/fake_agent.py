"""A stand-in for a node agent, for the health checker's tests: it serves node-a (the node the
``gpus`` fixture of ``failover/tests/conftest.py`` gives GPUs behind the fake pynvml), its
evidence is this machine's, and it signals runs as the agents' launcher does (``signal_run``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.processes import signal_run
from jobs.backends.facts import EvidenceSource, LocalKernel


@dataclass(eq=False)
class FakeAgent:
    name: str = "agent-1"
    node_names: list = field(default_factory=lambda: ["node-a"])
    woken: int = 0

    def live_parts(self) -> list:
        return []

    def signal(self, part, sig: int) -> bool:
        return signal_run(part, sig)

    def wake(self) -> None:
        self.woken += 1

    def evidence_source(self) -> EvidenceSource:
        return LocalKernel()

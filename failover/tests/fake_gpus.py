"""A node with GPUs behind the fake pynvml and a kernel log the test writes, for the health
monitor's tests: the ``gpus`` fixture (a plugin of the root conftest) and ``FakeAgent``."""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field

import pytest

from failover.tests import fake_pynvml
from jobs.models import Node


@dataclass(eq=False)
class FakeAgent:
    name: str = "agent-1"
    node_names: list = field(default_factory=lambda: ["node-a"])


@pytest.fixture
def gpus(monkeypatch, nodes, settings, tmp_path):
    """node-a has real GPUs behind the fake pynvml, and a kernel log the test writes."""
    gc.collect()
    driver = fake_pynvml.reset(gpus=4)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    settings.KERNEL_LOG_PATH = str(tmp_path / "kmsg")
    (tmp_path / "kmsg").write_text("")
    Node.objects.filter(name="node-a").update(simulated=False)
    yield driver
    driver.release()

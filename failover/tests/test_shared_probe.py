"""The agent reads its node through the one probe its health checker keeps (NVML initialised and
the Xid event set registered once per node), also right before it reports a failed exit, so an
Xid that killed the run is stored before the control plane judges; the judge reads stored
evidence only and makes no probe."""

from __future__ import annotations

import pytest

from agent import local_agents
from failover.evidence import FindingKind
from failover.services import health, policy
from failover.tests import fake_agent
from jobs.models import AttemptNode, Node
from jobs.services.placement import place_waiting_jobs

pytestmark = pytest.mark.django_db


class FakeAgent(fake_agent.FakeAgent):
    def request_launch(self, attempt_id: int) -> None:  # local_agents.LocalAgent
        pass


def test_the_checker_keeps_one_probe_per_node(gpus):
    agent = FakeAgent()
    checker = health.HealthChecker(agent)
    node = Node.objects.get(name="node-a")

    checker.check(node)
    probe = checker.probe(node)
    checker.check(node)
    assert checker.probe(node) is probe

    assert gpus.inits == 1 and len(gpus.event_sets) == 1
    checker.close()
    assert gpus.shutdowns == 1 and not gpus.event_sets


def test_the_xid_that_killed_the_run_is_stored_before_the_exit_and_the_judge_makes_no_probe(gpus, make_job):
    agent = FakeAgent()
    local_agents.add(agent)
    checker = health.HealthChecker(agent)
    checker.on_round()  # the agent's periodic check: the probe is made, its event set registered
    job = make_job()
    [attempt] = [a for a in place_waiting_jobs() if a.job_id == job.pk]
    parts = list(AttemptNode.objects.filter(attempt=attempt).select_related("node"))
    assert parts[0].node.name == "node-a"
    gpu = parts[0].gpu_indices[0]
    gpus.xid(gpu, 79)  # the fault, before any judgement

    checker.before_failed_exit(parts[0])  # the agent, before it reports the exit
    for _ in range(2):
        per_node, _lines = policy.gather(attempt, parts)  # the control plane: stored evidence only

    [evidence] = per_node.values()
    assert [(f.kind, f.gpu, f.xid) for f in evidence.findings] == [(FindingKind.XID, gpu, 79)]
    assert gpus.inits == 1 and len(gpus.event_sets) == 1
    assert evidence.judge(exit_code=1).hardware
    checker.close()

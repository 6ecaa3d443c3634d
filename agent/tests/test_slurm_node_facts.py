"""Whether a Slurm node's GPUs are real is the node's own fact: what its health check's NVML saw
(``failover.nodecheck`` writes ``gpus_by_pci`` in its status), not what the console's machine has."""

from __future__ import annotations

import json

from agent.slurm import slurm_nodes
from jobs.backends.slurm.scheduler import NodeView


def test_a_node_whose_check_saw_gpus_is_real_one_that_saw_none_is_simulated(settings, tmp_path):
    settings.SIMULATED_GPUS = "auto"
    settings.SLURM_HEALTH_DIR = str(tmp_path)
    (tmp_path / "node-a.status.json").write_text(json.dumps({"checked_at": 1, "gpus_by_pci": {"0000:17:00.0": 0, "0000:28:00.0": 1}}))
    (tmp_path / "node-b.status.json").write_text(json.dumps({"checked_at": 1, "gpus_by_pci": {}}))
    views = [NodeView(name=name, gpus=2, takes_work=True, state="IDLE") for name in ("node-a", "node-b", "node-c")]
    specs = {spec.name: spec for spec in slurm_nodes(views)}
    assert not specs["node-a"].simulated
    assert specs["node-b"].simulated
    # Not checked yet: this machine's answer stands until the node's check speaks (no NVML here).
    assert specs["node-c"].simulated
    settings.SIMULATED_GPUS = "1"  # an operator's SIMULATED_GPUS=1 wins
    assert all(spec.simulated for spec in slurm_nodes(views))

"""What the agents record of the replicas they hold for checkpointless failover
(``agent.checkpointless``): where each rank's newest in-memory snapshots are, and where each
node's agent takes them."""

from __future__ import annotations

from django.db import models

from jobs.models import JobAttempt, Node, TrainingJob


class Replica(models.Model):
    """One rank's in-memory snapshot at one step, held in the memory of ``holder``'s agent: the
    job's alone, its archive's size and SHA-256 as the shipping agent packed it (the fetching
    agent checks both before ckptlib's own check)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="replicas")
    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="replicas")
    rank = models.PositiveSmallIntegerField()
    step = models.BigIntegerField()
    holder = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="held_replicas")
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["job", "rank", "-step"]
        constraints = [models.UniqueConstraint(fields=["job", "rank", "step"], name="replica_unique_step")]

    def __str__(self) -> str:
        return f"job {self.job_id} rank {self.rank} step {self.step} on {self.holder_id}"


class ReplicaEndpoint(models.Model):
    """Where a node's agent takes and serves replicas (``host:port``)."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="replica_endpoint")
    address = models.CharField(max_length=300)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.node_id} at {self.address}"

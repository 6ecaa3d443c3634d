"""Log lines of Training Jobs: one merged, ``seq``-ordered stream per job and stream name."""
from __future__ import annotations

from django.db import models


class LogLine(models.Model):
    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="log_lines")
    stream = models.CharField(max_length=32, default="master")
    attempt = models.PositiveSmallIntegerField()
    # Monotonic per (job, stream) across attempts: the merged stream is ordered by it.
    seq = models.BigIntegerField()
    # The line's number within its attempt's output, as the node agent counted it; with the
    # attempt it makes delivery idempotent.
    line_no = models.PositiveIntegerField()
    ts = models.DateTimeField()
    text = models.TextField()

    class Meta:
        ordering = ["job", "stream", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["job", "stream", "seq"], name="logline_unique_seq"),
            models.UniqueConstraint(fields=["job", "stream", "attempt", "line_no"], name="logline_unique_delivery"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.stream}#{self.seq}"

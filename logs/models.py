"""Log lines of Training Jobs: one merged, ``seq``-ordered stream per job and stream name, in
attempt order (a late line of an ended attempt is stored in that attempt's place, see
``logs.services.ingest_lines``)."""

from __future__ import annotations

from django.db import models


class LogLine(models.Model):
    # No index of its own: the unique (job, stream, seq) index leads with it, and one index less
    # is one B-tree less to update per line ingested.
    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="log_lines", db_index=False)
    stream = models.CharField(max_length=32, default="master")
    attempt = models.PositiveSmallIntegerField()
    # Contiguous per (job, stream) from 1: the merged stream is ordered by it, attempt by attempt
    # (all of attempt 1, then all of attempt 2 …), and within an attempt by ``line_no``. Lines an
    # ended attempt delivers late (a lost node's agent back) take seqs in their attempt's place
    # and the later attempts' lines move up (``logs.services.make_room``).
    seq = models.BigIntegerField()
    # The line's number within its attempt's output, as the node agent counted it; with the
    # attempt it makes delivery idempotent.
    line_no = models.PositiveIntegerField()
    ts = models.DateTimeField()
    text = models.TextField()

    class Meta:
        ordering = ["job", "stream", "seq"]
        # One index: a line's place in its stream. Each line is counted once by the line numbers
        # its job's LogVolume keeps per attempt (``logs.services.apply_log_cap``), under that row's
        # lock; an index of (attempt, line_no) cost a B-tree update per line (40% of an insert).
        constraints = [models.UniqueConstraint(fields=["job", "stream", "seq"], name="logline_unique_seq")]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.stream}#{self.seq}"


class LogVolume(models.Model):
    """How many lines a job has stored and dropped (past LOG_MAX_LINES_PER_JOB), kept so that a
    batch never counts rows; per stream, the cap's marker line, its tail (the last LOG_TAIL_LINES
    lines past the cap) and the last line number seen."""

    job = models.OneToOneField("jobs.TrainingJob", on_delete=models.CASCADE, related_name="log_volume")
    lines = models.BigIntegerField(default=0)  # rows stored now (the head, markers and tails)
    # The command's lines stored before the cap: what LOG_MAX_LINES_PER_JOB counts (the platform's
    # own lines are not counted, ``logs.services.platform_lines``).
    head = models.BigIntegerField(default=0)
    dropped = models.BigIntegerField(default=0)  # lines past the cap not stored: each marker's count, summed
    # "stream/attempt" → last line_no counted (delivery is at least once); "stream" → marker's seq.
    seen = models.JSONField(default=dict, blank=True)
    markers = models.JSONField(default=dict, blank=True)
    # stream → {"attempt": the seq of its first line}: where a line delivered late for an ended
    # attempt goes (before the first line of the next attempt that has any).
    starts = models.JSONField(default=dict, blank=True)
    # stream → {"past": line numbers counted past the cap, "from": seq of its tail's first row,
    # "rows": rows in its tail, "first": [attempt, line_no] of its first row (None: no row),
    # "late": {attempt: numbers of late batches dropped}, "dropped": its marker's count}.
    tails = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.job_id}: {self.lines} lines, {self.dropped} dropped"


class JobProgress(models.Model):
    """The latest training progress a job's log told (one row per job), from ``logs.progress_parser``."""

    job = models.OneToOneField("jobs.TrainingJob", on_delete=models.CASCADE, related_name="progress")
    step = models.BigIntegerField(null=True, blank=True)
    total = models.BigIntegerField(null=True, blank=True)
    epoch = models.FloatField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)
    lr = models.FloatField(null=True, blank=True)
    # How many MetricPoint rows the job has (kept here so a batch never counts them).
    points = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "job progress"

    def __str__(self) -> str:
        return f"{self.job_id}: step {self.step}/{self.total} loss {self.loss}"

    @property
    def percent(self) -> float | None:
        if self.step is None or not self.total:
            return None
        return max(0.0, min(100.0, 100.0 * self.step / self.total))


class MetricPoint(models.Model):
    """One point of a job's curves (loss, learning rate and the other numbers its log dicts told):
    at most one per step, thinned when a job has many."""

    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="metric_points")
    step = models.BigIntegerField()
    epoch = models.FloatField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)
    lr = models.FloatField(null=True, blank=True)
    # Every other number the Trainer logged at this step: {"eval_loss": 1.9, "grad_norm": 0.8, …}.
    values = models.JSONField(default=dict, blank=True)
    ts = models.DateTimeField()

    class Meta:
        ordering = ["job", "step"]
        constraints = [models.UniqueConstraint(fields=["job", "step"], name="metricpoint_unique_step")]

    def __str__(self) -> str:
        return f"{self.job_id}@{self.step}: {self.loss}"


class Checkpoint(models.Model):
    """A checkpoint ckptlib committed, as its commit line in the job's log told it.

    Ranks of one run that commit the same step are one row: their bytes add up, the slowest
    rank's seconds count.
    """

    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.PositiveSmallIntegerField()
    step = models.BigIntegerField()
    bytes = models.BigIntegerField(default=0)
    blocking_s = models.FloatField(default=0.0)
    persist_s = models.FloatField(default=0.0)
    ranks = models.PositiveSmallIntegerField(default=1)
    path = models.CharField(max_length=1000, blank=True)
    committed_at = models.DateTimeField()

    class Meta:
        ordering = ["job", "committed_at", "id"]
        constraints = [models.UniqueConstraint(fields=["job", "attempt", "step"], name="checkpoint_unique_step")]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.attempt} step {self.step}"

"""Subscriptions to a job's status changes, and the log of their deliveries (one row per
subscription and event: the unique pair is what keeps a notification from going out twice)."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone


class Kind(models.TextChoices):
    TERMINAL = "terminal", "Finished (Completed, Failed, Stopped, internalerror, maxretriesexceeded)"
    FAILOVER = "failover", "Failover started"
    INTERNAL_ERROR = "internalerror", "Failover refused (internalerror)"
    PREEMPTION = "preemption", "Preempted (spot capacity reclaimed)"


def all_kinds() -> list[str]:
    return list(Kind.values)


def new_secret() -> str:
    return secrets.token_urlsafe(32)


class Subscription(models.Model):
    class Channel(models.TextChoices):
        EMAIL = "email", "E-mail"
        WEBHOOK = "webhook", "Webhook"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_subscriptions")
    # Scope: one job, or one project's jobs, or (both empty) every job the user owns.
    job = models.ForeignKey("jobs.TrainingJob", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey("jobs.Project", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    kinds = models.JSONField(default=all_kinds, help_text="Which changes: terminal, failover, internalerror, preemption.")
    channel = models.CharField(max_length=10, choices=Channel.choices)
    email = models.EmailField(blank=True)
    url = models.URLField(max_length=500, blank=True)
    slack = models.BooleanField(default=False, help_text='Send a Slack-compatible body ({"text": …}).')
    secret = models.CharField(max_length=64, default=new_secret, help_text="Key of the X-Satrain-Signature HMAC.")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Nothing is sent to an e-mail address before its holder opens the signed link mailed to it.
    email_verified_at = models.DateTimeField(null=True, blank=True, help_text="When the address's holder confirmed it.")
    verification_sent_at = models.DateTimeField(null=True, blank=True, help_text="When the latest confirmation link was queued.")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.user} → {self.target} ({self.scope})"

    @property
    def awaiting_verification(self) -> bool:
        """An e-mail subscription whose address has not been confirmed: its deliveries are skipped."""
        return self.channel == self.Channel.EMAIL and self.email_verified_at is None

    @property
    def target(self) -> str:
        return self.email if self.channel == self.Channel.EMAIL else self.url

    @property
    def scope(self) -> str:
        if self.job_id:
            return f"job {self.job_id}"
        if self.project is not None:
            return f"project {self.project.name}"
        return "all my jobs"


class Delivery(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        SENDING = "sending", "Sending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"
        SKIPPED = "skipped", "Skipped (address not verified)"

    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey("jobs.JobEvent", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_try_at = models.DateTimeField(default=timezone.now)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True, help_text="HTTP status of the last try")
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        constraints = [models.UniqueConstraint(fields=["subscription", "event"], name="delivery_once_per_event")]
        indexes = [models.Index(fields=["state", "next_try_at"], name="delivery_due")]

    def __str__(self) -> str:
        return f"delivery {self.pk}: event {self.event_id} → {self.subscription_id} ({self.state})"

"""A job from the operator's terminal: ``manage.py job show|stop|resume <id>``.

The same services as the console's Stop and Resume buttons (``jobs.services.actions``), so the
event history, the node agent's SIGTERM and the live pages behave exactly as after a click; open
pages see the change at once (the embedded console's local relay, or Redis in scale-out).
"""

from __future__ import annotations

import argparse
import getpass
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from agent.resume import resumable_step
from jobs.models import TrainingJob
from jobs.services.actions import JobActionRefused, request_stop, resume_job


def job_id(raw: str) -> int:
    if not raw.isdigit() or len(raw) > 18 or int(raw) == 0:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a job id (a positive integer)")
    return int(raw)


def operator() -> str:
    try:
        who = getpass.getuser()
    except (KeyError, OSError):
        who = "operator"
    return f"{who} (manage.py job)"


class Command(BaseCommand):
    help = "Show, stop or resume a training job by id, as its Stop / Resume buttons do."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True, metavar="{show,stop,resume}")
        show = actions.add_parser("show", help="the job's status, reason, attempts and latest events")
        show.add_argument("id", type=job_id)
        show.add_argument("--events", type=int, default=10, help="how many of the latest events to list (default 10)")
        show.add_argument("--json", action="store_true", help="one JSON document instead of text")
        stop = actions.add_parser("stop", help="stop the job (a running one gets SIGTERM, then SIGKILL after the grace period)")
        stop.add_argument("id", type=job_id)
        stop.add_argument("--reason", default="stopped by an operator", help="the reason recorded in the job's history")
        resume = actions.add_parser("resume", help="resume a Stopped, Failed or Pending - internalerror job from its last checkpoint")
        resume.add_argument("id", type=job_id)

    def handle(self, *args, action: str, id: int, **options):
        job = TrainingJob.objects.select_related("owner", "project").filter(pk=id).first()
        if job is None:
            raise CommandError(f"No training job with id {id}.")
        try:
            if action == "stop":
                reason = options["reason"].strip()[:500] or "stopped by an operator"
                status = request_stop(job, actor=operator(), reason=reason)
                self.stdout.write(f"Job {job.pk} ({job.name}) is {status}.")
            elif action == "resume":
                step = resumable_step(job)
                resume_job(job, actor=operator(), checkpoint_step=step)
                self.stdout.write(f"Job {job.pk} ({job.name}) resumes from checkpoint step {step}; it is Pending.")
            else:
                self.show(job, events=max(0, options["events"]), as_json=options["json"])
        except JobActionRefused as exc:
            raise CommandError(str(exc)) from None

    def show(self, job: TrainingJob, *, events: int, as_json: bool) -> None:
        latest = list(job.events.order_by("-created_at", "-id")[:events])[::-1]
        facts = {
            "id": job.pk,
            "name": job.name,
            "owner": job.owner.get_username(),
            "project": job.project.name,
            "status": job.status,
            "reason": job.status_reason,
            "type": job.job_type,
            "gpus": f"{job.gpus_per_node} x {job.node_count} node(s)",
            "failovers": job.failover_count,
            "attempts": job.attempts.count(),
            "created": job.created_at.isoformat(),
            "started": job.started_at.isoformat() if job.started_at else None,
            "finished": job.finished_at.isoformat() if job.finished_at else None,
            "last_checkpoint_step": resumable_step(job),
        }
        history: list[dict[str, Any]] = [
            {"at": e.created_at.isoformat(), "from": e.from_status, "to": e.to_status, "reason": e.reason, "attempt": e.attempt, "actor": e.actor}
            for e in latest
        ]
        if as_json:
            self.stdout.write(json.dumps({**facts, "events": history}))
            return
        for key, value in facts.items():
            self.stdout.write(f"{key + ':':<22}{'-' if value in (None, '') else value}")
        if history:
            self.stdout.write("events:")
        for e in history:
            change = f"{e['from'] or '(new)'} -> {e['to']}" if e["from"] != e["to"] else e["to"]
            attempt = f" [attempt {e['attempt']}]" if e["attempt"] else ""
            self.stdout.write(f"  {e['at'][:19]}  {change}{attempt}  by {e['actor']}: {e['reason']}")

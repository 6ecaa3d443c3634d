"""The project usage line on the Training Jobs page ("team: using 6 of 8 GPUs; 2 borrowed")."""

from __future__ import annotations

from django import template

from jobs.models import Project
from jobs.services.quotas import WAITING_CAP, project_usage

register = template.Library()


@register.inclusion_tag("jobs/_quota_usage.html", takes_context=True)
def quota_usage(context) -> dict:
    """The user's projects that have a quota or hold GPUs (staff: their own memberships too)."""
    user = context["request"].user
    projects = Project.objects.filter(members=user) if user.is_authenticated else Project.objects.none()
    usage = [u for u in project_usage(projects, waiting_cap=WAITING_CAP, cpu_jobs=False) if u.quota or u.used_gpus or u.waiting_jobs]
    return {"usage": usage}

"""Template helpers of the console pages: status badges, icons and durations."""

from __future__ import annotations

import json
import signal as signals
from datetime import timedelta
from html import escape as esc
from typing import Any

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from jobs.services.limits import format_memory
from jobs.statuses import BADGE_GROUPS
from logs.terminal import plain_text

register = template.Library()

# Icons the templates use; each is a <symbol id="icon-NAME"> in templates/_icons.html.
ICONS = frozenset({"clock", "alert", "play", "stop", "refresh", "x", "check", "plus", "copy", "trash", "search", "server", "zap", "pause", "save", "menu"})


@register.simple_tag
def icon(name: str, label: str = "") -> str:
    """An inline icon from the page's sprite; decorative unless a label is given."""
    if name not in ICONS:
        raise template.TemplateSyntaxError(f"unknown icon {name!r}")
    if label:
        return format_html('<svg class="icon" role="img" aria-label="{}" focusable="false"><use href="#icon-{}"></use></svg>', label, name)
    return format_html('<svg class="icon" aria-hidden="true" focusable="false"><use href="#icon-{}"></use></svg>', name)


@register.simple_tag
def status_badge(status: str) -> SafeString:
    """A status told by colour, icon and text together."""
    return mark_safe(badge_html(status))


def badge_html(status: str) -> str:
    group, icon_name = BADGE_GROUPS.get(status, ("pending", "clock"))
    group, icon_name, status = esc(group), esc(icon_name), esc(status)
    return (
        f'<span class="badge badge--{group}" data-field="status" data-status="{status}" data-badge-group="{group}">'
        f'<svg class="icon" aria-hidden="true" focusable="false"><use href="#icon-{icon_name}"></use></svg>'
        f'<span class="badge__text">{status}</span></span>'
    )


@register.filter
def duration(value: timedelta | None) -> str:
    """``1d 2h 03m``, ``2h 03m 04s``, ``3m 04s`` or ``5s``; an em dash when there is none."""
    if value is None:
        return "—"
    seconds = max(int(value.total_seconds()), 0)
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    if days:
        return f"{days}d {hours}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


@register.filter
def env_lines(env: dict[str, str] | None) -> list[str]:
    return [f"{name}={value}" for name, value in (env or {}).items()]


@register.filter
def job_env_lines(job) -> list[str]:
    """A job's variables as NAME=value lines, its secret ones as NAME=•••• (values never shown)."""
    return env_lines(job.env) + env_lines(job.secret_env.masked())


@register.filter
def signal_name(number: int | None) -> str:
    """``SIGKILL (9)`` for a signal number."""
    if number is None:
        return "—"
    try:
        return f"{signals.Signals(number).name} ({number})"
    except ValueError:
        return f"signal {number}"


def number(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def progress_text(progress: Any) -> str:
    """``step 50/150 · epoch 1 · loss 0.036 · lr 0.01``: what the log told (console.js says it the same way)."""
    if progress is None:
        return "—"
    parts = []
    if progress.step is not None:
        parts.append(f"step {progress.step}/{progress.total}" if progress.total else f"step {progress.step}")
    if progress.epoch is not None:
        parts.append(f"epoch {progress.epoch:.4g}")
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4g}")
    if progress.lr is not None:
        parts.append(f"lr {progress.lr:.3g}")
    return " · ".join(parts) or "—"


@register.filter
def terminal_plain(text: str) -> str:
    """A log line as a page shows it: no ``ESC[A`` box, no colour codes (``logs.terminal``)."""
    return plain_text(text)


@register.simple_tag
def job_progress(job: Any, progress: Any = None, compact: bool = False) -> SafeString:
    """A progress bar with its text; the live script keeps it current.

    Without ``progress`` the job's own is used (the list selects it with the job: no query).
    """
    return mark_safe(progress_html(job, progress, compact))


def progress_html(job: Any, progress: Any = None, compact: bool = False) -> str:
    if progress is None:
        progress = getattr(job, "progress", None)
    percent = progress.percent if progress is not None else None
    name, text = esc(job.name), esc(progress_text(progress))
    if percent is None:
        bar = f'<progress max="100" aria-label="Training progress of {name}" hidden></progress>'
    else:
        percent = round(percent)
        bar = f'<progress max="100" value="{percent}" aria-label="Training progress of {name}">{percent}%</progress>'
        text = f"{percent}% · {text}"
    compact_class = " progress--compact" if compact else ""
    return f'<div class="progress{compact_class}" data-field="progress">{bar}<span class="progress__text" data-progress-text>{text}</span></div>'


@register.simple_tag
def run_clock_attrs(clock: Any) -> SafeString:
    """The attributes a running-time element counts on from (console.js): what ran, and since when
    it runs now."""
    return mark_safe(clock_attrs_html(clock))


def clock_attrs_html(clock: Any) -> str:
    if clock is None:
        return ""
    since = "" if clock.running_since is None else f' data-running-since="{esc(local_iso(clock.running_since))}"'
    return f' data-ran-seconds="{clock.ran_seconds:.3f}"{since}'


def local_iso(moment: Any) -> str:
    """What ``{{ moment|date:'c' }}`` writes: ISO 8601 in the current time zone."""
    return timezone.localtime(moment).isoformat()


@register.simple_tag(takes_context=True)
def job_list_rows(context: template.Context, jobs: Any, max_failovers: int) -> SafeString:
    """The Training Jobs table's rows, written in Python with ``html.escape`` (``esc``): through
    the template engine a row cost about 0.4 ms, and through ``format_html`` half that, so a page
    of 100 spent 20-40 ms on its rows alone (bench.list)."""
    me = context["request"].user.pk
    marker = 987654321
    detail = reverse("jobs:detail", args=[marker]).split(str(marker))
    return mark_safe("\n".join(job_list_row(job, me, max_failovers, detail) for job in jobs))


def job_list_row(job: Any, me: int, max_failovers: int, detail: list[str]) -> str:
    created = timezone.localtime(job.created_at)
    iso = created.isoformat()  # 2026-12-04T00:58:06.631163+00:00: its date and time, cut (strftime costs more)
    created_short, created_long = f"{iso[:10]} {iso[11:16]}", f"{iso[:10]} {iso[11:19]} {created.tzname() or ''}"
    clock = job.run_clock
    pk, name, reason = job.pk, esc(job.name), job.status_reason
    owner = "" if job.owner_id == me else f" · {esc(job.owner.get_username())}"
    hidden = "" if reason else " hidden"
    total = job.total_gpus
    running = duration(clock.so_far) if clock else "—"
    return (
        f'<tr data-job-id="{pk}" data-status="{esc(job.status)}">'
        f'<td class="col-check"><input type="checkbox" name="job_ids" value="{pk}" id="select-{pk}" aria-label="Select {name}"></td>'
        f'<td data-field="name" data-label="Name"><a class="strong" href="{esc(detail[0])}{pk}{esc(detail[1])}">{name}</a>'
        f'<div class="subtle">{esc(job.project.name)}{owner}</div></td>'
        f'<td data-label="Status">{badge_html(job.status)}<div class="subtle reason" data-field="status_reason" title="{esc(reason)}"{hidden}>'
        f"{esc(reason if len(reason) < 70 else Truncator(reason).chars(70))}</div></td>"
        f'<td data-field="job_type" data-label="Type">{esc(job.job_type)}</td>'
        f'<td data-field="image" class="mono small" data-label="Image">{esc(job.image)}</td>'
        f'<td class="num" data-field="gpus" data-label="GPUs × nodes"><span title="{total} GPU{"" if total == 1 else "s"} in total">'
        f"{job.gpus_per_node} × {job.node_count}</span></td>"
        f'<td class="num" data-field="failover_count" data-label="Failovers">{job.failover_count}/{max_failovers}</td>'
        f'<td data-field="created_at" data-label="Created"><time datetime="{iso}" title="{esc(created_long)}">{created_short}</time></td>'
        f'<td class="col-progress" data-label="Progress">{progress_html(job, compact=True)}</td>'
        f'<td class="num" data-field="running_time" data-label="Running time"{clock_attrs_html(clock)}>{running}</td>'
        "</tr>"
    )


@register.filter
def seconds(value: float | None) -> str:
    """``0.0123 s`` with three significant digits; an em dash when there is none."""
    return "—" if value is None else f"{value:.3g} s"


@register.filter
def evidence_items(evidence: dict[str, Any] | None) -> list[tuple[str, str]]:
    """An evidence dict as (name, text) pairs; nested values as compact JSON."""
    items = []
    for key, value in (evidence or {}).items():
        if value is None:
            text = "—"
        else:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        items.append((str(key).replace("_", " "), text))
    return items


@register.filter
def memory(mb: int | None) -> str:
    """MiB as the console writes memory sizes: "512 MiB", "23.5 GiB"."""
    return format_memory(int(mb)) if mb else "—"

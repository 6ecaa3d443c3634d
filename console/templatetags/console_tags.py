"""Template helpers of the console pages: status badges, icons and durations."""
from __future__ import annotations

import json
import signal as signals
from datetime import timedelta
from typing import Any

from django import template
from django.utils.html import format_html

from jobs.services.limits import format_memory
from jobs.statuses import BADGE_GROUPS
from logs.terminal import plain_text

register = template.Library()

# Icons the templates use; each is a <symbol id="icon-NAME"> in templates/_icons.html.
ICONS = frozenset(
    {"clock", "alert", "play", "stop", "refresh", "x", "check", "plus", "copy", "trash", "search", "server", "zap", "pause", "save", "menu"}
)


@register.simple_tag
def icon(name: str, label: str = "") -> str:
    """An inline icon from the page's sprite; decorative unless a label is given."""
    if name not in ICONS:
        raise template.TemplateSyntaxError(f"unknown icon {name!r}")
    if label:
        return format_html(
            '<svg class="icon" role="img" aria-label="{}" focusable="false"><use href="#icon-{}"></use></svg>', label, name
        )
    return format_html('<svg class="icon" aria-hidden="true" focusable="false"><use href="#icon-{}"></use></svg>', name)


@register.inclusion_tag("jobs/_badge.html")
def status_badge(status: str) -> dict[str, str]:
    """A status told by colour, icon and text together."""
    group, icon_name = BADGE_GROUPS.get(status, ("pending", "clock"))
    return {"status": status, "group": group, "icon": icon_name}


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


@register.inclusion_tag("jobs/_progress.html")
def job_progress(job: Any, progress: Any = None, compact: bool = False) -> dict[str, Any]:
    """A progress bar with its text; the live script keeps it current.

    Without ``progress`` the job's own is used (the list selects it with the job: no query).
    """
    if progress is None:
        progress = getattr(job, "progress", None)
    percent = progress.percent if progress is not None else None
    return {
        "job": job,
        "percent": None if percent is None else round(percent),
        "text": progress_text(progress),
        "compact": compact,
    }


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

"""``satrain``: the Simple AI Training console from a terminal.

Exit codes: 0 success; 1 an API or connection error (the console's message on stderr); 2 bad
usage; ``jobs wait``: 0 Completed, 3 Failed / Pending - internalerror / Pending -
maxretriesexceeded, 4 Stopped, 124 still not finished after ``--timeout``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from satrain import config
from satrain.api import BUNDLES, JOBS, ApiError, Client, JsonObject
from satrain.files import PackRefused, clone, is_git_url, pack_directory
from satrain.logs import follow, read_lines
from satrain.terminal import visible

app = typer.Typer(help="The Simple AI Training console from a terminal.", no_args_is_help=True)
jobs_app = typer.Typer(help="Training jobs: create, list, follow, stop, wait.", no_args_is_help=True)
nodes_app = typer.Typer(help="GPU nodes (staff): list, cordon, inject a fault, clear.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
app.add_typer(nodes_app, name="nodes")

out = Console(soft_wrap=True)
err = Console(stderr=True)

JOB_FIELDS = (
    "name",
    "project",
    "job_type",
    "image",
    "command",
    "env",
    "gpus_per_node",
    "node_count",
    "failover_enabled",
    "checkpointless",
    "output_dir",
    "max_run_minutes",
    "description",
)
TERMINAL = {"Completed", "Failed", "Stopped", "Pending - internalerror", "Pending - maxretriesexceeded"}
WAIT_EXIT = {"Completed": 0, "Failed": 3, "Pending - internalerror": 3, "Pending - maxretriesexceeded": 3, "Stopped": 4}
EVENTS_TABLE_MIN_WIDTH = 120  # columns below which `jobs events` prints blocks, not a table
RESUME_MISSING = "this console has no resume endpoint (POST /api/v1/training-jobs/<id>/resume/); update the console"


P = ParamSpec("P")
R = TypeVar("R")


def shown(value: Any) -> Text:
    """A value as plain text: what the console returns (names, descriptions, commands, reasons …)
    is user-chosen, so no Rich markup or emoji code in it is interpreted and its control
    characters are shown as ``\\xNN`` escapes (``satrain.terminal.visible``), never sent to the terminal."""
    if value is None:
        return Text("")
    # Non-ASCII as itself (a masked secret's "••••", a name in Korean); JSON still escapes controls.
    return Text(visible(json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else str(value)))


def say(console: Console, message: str, style: str = "") -> None:
    """Print a message holding values from the console (or the user) as plain text."""
    console.print(Text(visible(message), style=style), highlight=False)


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(Text.assemble(("Error:", "bold red"), " ", shown(message)), highlight=False)
    raise typer.Exit(code)


def client() -> Client:
    return Client(config.load())


def call(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    try:
        return fn(*args, **kwargs)
    except ApiError as exc:
        fail(exc.message)


# JSON escapes C0 controls itself; DEL and C1 controls (CSI is U+009B) are escaped here, so that
# no value of -o json drives the terminal either (they occur only inside JSON strings).
JSON_CONTROLS = {code: f"\\u{code:04x}" for code in range(0x7F, 0xA0)}


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False).translate(JSON_CONTROLS) + "\n")


# --- login --------------------------------------------------------------------------------------
@app.command()
def login(
    url: str = typer.Option(None, "--url", help="The console's address, e.g. https://console.example.org"),
    username: str = typer.Option(..., "--username", "-u", prompt=True),
    password: str = typer.Option(..., "--password", "-p", prompt=True, hide_input=True),
) -> None:
    """Get an API token with your username and password and keep it in the config file (0600)."""
    settings = config.load()
    if url:
        settings.url = url.rstrip("/")
    settings.token = None
    answer = call(Client(settings).token, username, password)
    settings.token, settings.username = answer["token"], username
    path = config.save(settings)
    say(out, f"Logged in to {settings.url} as {username}; token expires {answer.get('expiry')}; kept in {path}")


@app.command()
def logout() -> None:
    """Forget the stored token (revoke it on the console's API tokens page)."""
    settings = config.load()
    settings.token = None
    config.save(settings)
    out.print("Token forgotten.")


# --- jobs ---------------------------------------------------------------------------------------
def read_spec(path: str) -> JsonObject:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}", 2)
    try:
        spec = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        fail(f"{path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}", 2)
    if not isinstance(spec, dict):
        fail(f"{path} must hold one mapping of job fields ({', '.join(JOB_FIELDS)})", 2)
    unknown = sorted(set(spec) - set(JOB_FIELDS))
    if unknown:  # sent anyway (a newer console may know them); the API ignores fields it does not know
        err.print(
            Text.assemble(
                ("Warning:", "yellow"),
                " ",
                shown(
                    f"{path}: field{'s' if len(unknown) > 1 else ''} {', '.join(map(str, unknown))} not known to this client (it knows {', '.join(JOB_FIELDS)})"
                ),
            ),
            highlight=False,
        )
    return spec


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            fail(f"--env takes NAME=value, not {pair!r}", 2)
        env[name] = value
    return env


def show_job(job: JsonObject) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    for key in (
        "id",
        "name",
        "owner",
        "project_name",
        "status",
        "status_reason",
        "job_type",
        "image",
        "command",
        "env",
        "gpus_per_node",
        "node_count",
        "failover_enabled",
        "checkpointless",
        "failover_attempts",
        "output_dir",
        "max_run_minutes",
        "created_at",
        "started_at",
        "finished_at",
        "running_time_seconds",
        "description",
    ):
        if key in job:
            table.add_row(Text(key, style="bold"), shown(job[key]))
    if job.get("queue"):
        table.add_row(Text("starts", style="bold"), shown(job["queue"].get("text")))
    out.print(table)


@jobs_app.command("create")
def jobs_create(
    file: str | None = typer.Option(None, "--file", "-f", help="A YAML or JSON job spec (the API's fields); - reads stdin"),
    name: str | None = typer.Option(None, "--name", "-n"),
    command: str | None = typer.Option(None, "--command", "-c", help="e.g. 'python -m jobs.examples.train_tiny'"),
    image: str | None = typer.Option(None, "--image"),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs per node"),
    nodes: int | None = typer.Option(None, "--nodes", help="node count"),
    job_type: str | None = typer.Option(None, "--type", help="On-Demand or Spot"),
    env: list[str] = typer.Option([], "--env", "-e", help="NAME=value (repeat)"),
    failover: bool | None = typer.Option(None, "--failover/--no-failover"),
    checkpointless: bool | None = typer.Option(None, "--checkpointless/--no-checkpointless", help="every step's state in another node's memory"),
    output_dir: str | None = typer.Option(None, "--output-dir"),
    max_run_minutes: int | None = typer.Option(None, "--max-run-minutes"),
    project: int | None = typer.Option(None, "--project", help="project id"),
    description: str | None = typer.Option(None, "--description"),
    code: str | None = typer.Option(
        None, "--code", help="a directory, or a git URL (cloned here), to run in (/job/work): packed and uploaded; .gitignore/.satrainignore honoured"
    ),
    code_rev: str | None = typer.Option(None, "--code-rev", help="with a git URL as --code: a branch, tag or commit (default: its default branch)"),
    warm_start: str | None = typer.Option(None, "--warm-start", help="JOB[:STEP]: start from that job's checkpoint (its newest without STEP)"),
    output: str = typer.Option("table", "--output", "-o", help="table or json"),
) -> None:
    """Create a job from flags and/or a spec file (flags win over the file)."""
    spec = read_spec(file) if file else {}
    if code is not None:
        spec["code"] = upload_code(code, project if project is not None else spec.get("project"), code_rev)
    elif code_rev is not None:
        fail("--code-rev goes with a git URL as --code", 2)
    if warm_start:
        source, _, step = warm_start.partition(":")
        if not source.isdigit() or (step and not step.isdigit()):
            fail(f"--warm-start takes JOB or JOB:STEP (numbers), not {warm_start!r}", 2)
        spec["warm_start_job"], spec["warm_start_step"] = int(source), int(step) if step else None
    flags = {
        "name": name,
        "command": command,
        "image": image,
        "gpus_per_node": gpus,
        "node_count": nodes,
        "job_type": job_type,
        "failover_enabled": failover,
        "checkpointless": checkpointless,
        "output_dir": output_dir,
        "max_run_minutes": max_run_minutes,
        "project": project,
        "description": description,
    }
    spec.update({k: v for k, v in flags.items() if v is not None})
    if env:
        spec["env"] = {**(spec.get("env") or {}), **parse_env(env)}
    job = call(client().post, JOBS, spec)
    if output == "json":
        emit_json(job)
    else:
        say(out, f"Created job {job['id']} ({job['name']}): {job['status']}")


def upload_code(code: str, project: Any, revision: str | None = None) -> int:
    """Pack a directory, or a git repository cloned here at ``revision``, and upload it as a code
    bundle; its id."""
    with tempfile.TemporaryDirectory(prefix="satrain-code-") as scratch:
        try:
            if is_git_url(code):
                directory, name = Path(scratch) / "repo", code.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or "repo"
                commit = clone(code, revision, directory)
                say(err, f"Cloned {code} at {commit[:12]}")
                name = f"{name}@{commit[:12]}"
            elif revision is not None:
                fail("--code-rev goes with a git URL as --code, not a directory", 2)
            else:
                directory = Path(code)
                name = directory.resolve().name
            packed = pack_directory(directory)
        except (PackRefused, OSError) as exc:
            fail(f"--code: {exc}", 2)
    for left in packed.left_out[:10]:
        say(err, f"left out: {left}")
    bundle = call(client().upload, BUNDLES, packed.archive, name=f"{name}.tar.gz", fields={"project": project} if project else {})
    say(err, f"Uploaded {code} as code bundle {bundle['id']}: {packed.files} files, {packed.bytes:,} bytes")
    return int(bundle["id"])


@jobs_app.command("download")
def jobs_download(
    job_id: int,
    checkpoint: int | None = typer.Option(None, "--checkpoint", help="a committed checkpoint's step instead of the output directory"),
    work: bool = typer.Option(False, "--work", help="the work directory (/job/work: code and ./results) instead of the output directory"),
    path: str = typer.Option("", "--path", help="one file or directory below it"),
    destination: Path | None = typer.Option(None, "--output", "-o", help="where to: a directory (unpacked), or NAME.tar to keep the archive"),
) -> None:
    """Download what a job wrote: its output directory, its work directory or a checkpoint."""
    tree = f"checkpoint-{checkpoint}" if checkpoint is not None else "work" if work else "output"
    target = destination or Path(f"job-{job_id}-{tree}")
    try:
        written = client().download(f"{JOBS}{job_id}/outputs/{tree}/download/", {"path": path} if path else {}, target)
    except (ApiError, PackRefused, OSError) as exc:
        fail(exc.message if isinstance(exc, ApiError) else str(exc))
    say(out, f"Saved {tree}{'/' + path if path else ''} of job {job_id} to {written}")


@jobs_app.command("list")
def jobs_list(
    status: list[str] = typer.Option([], "--status", "-s", help="exact status text (repeat)"),
    job_type: str | None = typer.Option(None, "--type"),
    search: str | None = typer.Option(None, "--search", help="part of the name"),
    ordering: str | None = typer.Option(None, "--ordering"),
    output: str = typer.Option("table", "--output", "-o", help="table or json"),
) -> None:
    """The jobs you may see."""
    filters = {"status": ",".join(status) or None, "job_type": job_type, "search": search, "ordering": ordering}
    jobs = call(client().list_jobs, **filters)
    if output == "json":
        emit_json(jobs)
        return
    table = Table("ID", "NAME", "STATUS", "TYPE", "GPUS", "FAILOVERS", "OWNER", "CREATED", "STARTS")
    for job in jobs:
        table.add_row(
            *map(
                shown,
                (
                    job["id"],
                    job["name"],
                    job["status"],
                    job["job_type"],
                    f"{job['gpus_per_node']}×{job['node_count']}",
                    job["failover_attempts"],
                    job["owner"],
                    (job["created_at"] or "")[:19].replace("T", " "),
                    starts(job.get("queue")),
                ),
            )
        )
    out.print(table)


def starts(queue: JsonObject | None) -> str:
    """A waiting job's place and start estimate, short: "2nd, ~12 min", "1st, now", "3rd, ?"."""
    if not queue:
        return ""
    place = queue.get("place")
    where = f"{place}{'th' if 10 <= place % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(place % 10, 'th')}" if place else "?"
    seconds = queue.get("seconds")
    if seconds is None:
        return f"{where}, no estimate"
    if seconds == 0:
        return f"{where}, now"
    return f"{where}, ~{max(1, round(seconds / 60))} min" if seconds < 5400 else f"{where}, ~{seconds / 3600:.1f} h"


@jobs_app.command("get")
def jobs_get(job_id: int, output: str = typer.Option("table", "--output", "-o", help="table or json")) -> None:
    """One job's fields and status."""
    job = call(client().job, job_id)
    emit_json(job) if output == "json" else show_job(job)


@jobs_app.command("logs")
def jobs_logs(
    job_id: int,
    follow_: bool = typer.Option(False, "--follow", "-f", help="follow until the job ends (resumes after a disconnect)"),
    stream: str = typer.Option("master", "--stream", help="master or worker-<n>"),
    attempt: int | None = typer.Option(None, "--attempt", help="only this attempt's lines"),
    tail: int | None = typer.Option(None, "--tail", help="start with the last N lines"),
    timestamps: bool = typer.Option(False, "--timestamps", "-t"),
    raw: bool = typer.Option(False, "--raw", help="print lines as stored, terminal control sequences included"),
) -> None:
    """A job's log; with -f, follow it over the WebSocket until the job ends. Control characters
    in the log (escape sequences) are shown as \\xNN escapes unless --raw is given."""

    def emit(line: JsonObject) -> None:
        if attempt is None or line["attempt"] == attempt:
            text = line["text"] if raw else visible(line["text"])
            sys.stdout.write((f"{line['ts']} " if timestamps else "") + text + "\n")
            sys.stdout.flush()

    api = client()
    if not follow_:
        try:
            for line in read_lines(api, job_id, stream=stream, tail=tail):
                emit(line)
        except ApiError as exc:
            fail(exc.message)
        return

    def banner(number: str, text: str) -> None:
        if attempt is None or int(number) == attempt:
            say(err, f"── {text}", "dim")

    def reconnect(seq: int, why: str) -> None:
        say(err, f"{why}; reconnecting after line {seq}", "yellow")

    def inserted(seq: int) -> None:
        err.print(
            f"[yellow]lines of an earlier attempt arrived late (its node came back) and were stored before line {seq}; the log again from line {seq}:[/]",
            highlight=False,
        )

    status = call(follow, api, job_id, stream=stream, tail=tail, on_line=emit, on_banner=banner, on_reconnect=reconnect, on_inserted=inserted)
    say(err, f"job {job_id}: {status}", "bold")


def act(job_id: int, action: str) -> JsonObject:
    job: JsonObject = call(client().post, f"{JOBS}{job_id}/{action}/")
    return job


@jobs_app.command("stop")
def jobs_stop(job_id: int) -> None:
    """Stop a job (SIGTERM, then SIGKILL after the grace period)."""
    job = act(job_id, "stop")
    say(out, f"job {job_id}: {job['status']}")


@jobs_app.command("clone")
def jobs_clone(job_id: int, name: str | None = typer.Option(None, "--name")) -> None:
    """A new job with the same settings."""
    job = call(client().post, f"{JOBS}{job_id}/clone/", {"name": name} if name else {})
    say(out, f"Created job {job['id']} ({job['name']}): {job['status']}")


@jobs_app.command("delete")
def jobs_delete(job_id: int, yes: bool = typer.Option(False, "--yes", "-y", help="do not ask")) -> None:
    """Delete a finished job and its logs."""
    if not yes:
        typer.confirm(f"Delete job {job_id} and its logs?", abort=True)
    call(client().request, "DELETE", f"{JOBS}{job_id}/")
    out.print(f"job {job_id} deleted")


@jobs_app.command("resume")
def jobs_resume(job_id: int) -> None:
    """Resume a stopped or failed job from its last checkpoint (where the console offers it)."""
    try:
        job = client().post(f"{JOBS}{job_id}/resume/")
    except ApiError as exc:
        if exc.status == 405 or (exc.status == 404 and "training job" not in exc.message.lower()):
            fail(RESUME_MISSING)
        fail(exc.message)
    say(out, f"job {job['id']} ({job['name']}): {job['status']}")


@jobs_app.command("events")
def jobs_events(job_id: int, output: str = typer.Option("table", "--output", "-o")) -> None:
    """A job's status history."""
    events = call(client().get, f"{JOBS}{job_id}/events/")
    if output == "json":
        emit_json(events)
        return
    if out.width < EVENTS_TABLE_MIN_WIDTH:
        # A narrow terminal: one block per event, its reason on lines of its own (a table there
        # would squeeze the reason into a column one word wide).
        for event in events:
            when = (event["created_at"] or "")[:19].replace("T", " ")
            say(out, f"{when}  {event['from_status'] or '—'} → {event['to_status']}  (attempt {event['attempt'] or '—'}, {event['actor']})")
            if event["reason"]:
                out.print(Text("    ") + shown(event["reason"]), highlight=False)
        return
    table = Table("TIME", "FROM", "TO", "ATTEMPT", "ACTOR", "REASON")
    for event in events:
        table.add_row(
            *map(
                shown,
                (
                    (event["created_at"] or "")[:19].replace("T", " "),
                    event["from_status"],
                    event["to_status"],
                    event["attempt"],
                    event["actor"],
                    event["reason"],
                ),
            )
        )
    out.print(table)


@jobs_app.command("wait")
def jobs_wait(
    job_id: int,
    timeout: float = typer.Option(0, "--timeout", help="seconds; 0 waits for ever"),
    interval: float = typer.Option(2.0, "--interval", help="seconds between checks"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
) -> None:
    """Wait until the job finishes. Exit 0 Completed, 3 Failed/internalerror/maxretriesexceeded, 4 Stopped, 124 timeout."""
    api = client()
    deadline = time.monotonic() + timeout if timeout else None
    last = None
    while True:
        job = call(api.job, job_id)
        if job["status"] != last and not quiet:
            say(err, f"job {job_id}: {job['status']} {('— ' + job['status_reason']) if job.get('status_reason') else ''}")
        last = job["status"]
        if last in TERMINAL:
            say(out, last)
            raise typer.Exit(WAIT_EXIT.get(last, 3))
        if deadline is not None and time.monotonic() >= deadline:
            say(err, f"job {job_id} is still {last} after {timeout:g} s")
            raise typer.Exit(124)
        time.sleep(interval)


# --- nodes (staff) -------------------------------------------------------------------------------
NODES = "/api/v1/nodes/"


@nodes_app.command("list")
def nodes_list(output: str = typer.Option("table", "--output", "-o")) -> None:
    """Nodes, their GPUs and health."""
    page = call(client().get, NODES, limit=500)
    nodes = page["results"] if isinstance(page, dict) else page
    if output == "json":
        emit_json(nodes)
        return
    table = Table("NAME", "STATE", "HEALTHY", "CORDONED", "GPUS FREE", "UNHEALTHY GPUS", "REASON")
    for node in nodes:
        gpus = node["gpus"]
        free = sum(1 for g in gpus if g["healthy"] and not g["allocated"])
        bad = [str(g["index"]) for g in gpus if not g["healthy"]]
        table.add_row(
            *map(
                shown,
                (
                    node["name"],
                    node["state"],
                    "yes" if node["healthy"] else "NO",
                    "yes" if node["cordoned"] else "",
                    f"{free}/{len(gpus)}",
                    ",".join(bad),
                    node["health_reason"],
                ),
            )
        )
    out.print(table)


@nodes_app.command("cordon")
def nodes_cordon(name: str, undo: bool = typer.Option(False, "--undo", help="uncordon")) -> None:
    """Place no new jobs on a node (--undo: uncordon)."""
    node = call(client().post, f"{NODES}{name}/{'uncordon' if undo else 'cordon'}/")
    say(out, f"{node['name']}: {'cordoned' if node['cordoned'] else 'schedulable'}")


@nodes_app.command("uncordon")
def nodes_uncordon(name: str) -> None:
    """Make a cordoned node schedulable again."""
    nodes_cordon(name, undo=True)


@nodes_app.command("inject-fault")
def nodes_inject_fault(
    name: str,
    gpu: int | None = typer.Option(None, "--gpu", help="GPU index; none: the whole node"),
    kind: str = typer.Option("xid", "--kind", help="xid, ecc, gpu_lost, nvlink or thermal"),
    xid: int | None = typer.Option(None, "--xid", help="for an Xid fault, e.g. 79"),
) -> None:
    """Inject a hardware fault into a simulated node's GPU."""
    fault = call(client().post, f"{NODES}{name}/inject-fault/", {"kind": kind, "gpu": gpu, "xid": xid})
    where = f"GPU {fault['gpu']}" if fault.get("gpu") is not None else "the whole node"
    say(out, f"fault {fault['id']} ({fault['kind']}{' ' + str(fault['xid']) if fault.get('xid') else ''}) injected into {fault['node']}, {where}")


@nodes_app.command("clear")
def nodes_clear(name: str) -> None:
    """Mark a node healthy again (its faults repaired)."""
    answer = call(client().post, f"{NODES}{name}/clear/")
    say(out, str(answer["detail"]))


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""The run files: what a run's supervisor (``agent.runner``) and the node agent tell each other,
the one definition of their names, fields and limits. Standard library only (the runner
imports it); no other module names these files.

Each rank of an attempt has a run directory, ``<JOB_WORK_ROOT>/<job>/attempt-<n>/rank-<r>/``
(``run_dir_parts``), made by the agent and its own (0700). In it:

=====================  ==========================================  ===============================
file (constant)        written by, when                            read by
=====================  ==========================================  ===============================
``SPEC_FILE``          the agent, before it starts the runner      the runner, once (``read_spec``)
                       (``write_spec``; 0600: the job's secrets)   and ``kill_unfinished_runs``
``PID_FILE``           the runner, once the command's process      the agent: signals, "is the
                       group exists; again, whole, once the        runner up?", restarts
                       container's first process is known          (``read_pid``)
                       (``write_pid``)
``OUTPUT_FILE``        the runner, one record a line, appended     the agent's log ingest, from its
                       (``OutputWriter``)                          offset (``read_output``)
``EXIT_FILE``          the runner, last, once the output is whole  the agent (``read_exit``)
                       (``write_exit``)
``ENV_FILE``           the runner (0600), for Podman's             Podman; removed when the run
                       ``--env-file`` (``write_env``)              ends
``CONTAINER_PID_FILE`` Podman (``--pidfile``)                      the runner (``read_container_pid``)
``RUNNER_LOG_FILE``    the runner's own stderr (``open_runner_log``)  people
``PULL_AUTH_FILE``     the agent, for a scheduler's account        that rank's image pull (0600)
=====================  ==========================================  ===============================

The call order, for one rank:

1. The agent (``agent.launch``): ``clear_stale`` (an earlier install's files must not pass for this
   run's), ``write_spec``, then starts ``python -m agent.runner <spec path>`` with its stderr in
   ``open_runner_log`` and reports the runner's pid to the control plane.
2. The runner: ``read_spec``; ``write_env`` (in a container); starts the command; ``write_pid``
   (before the first output record); ``OutputWriter.emit`` for each line, numbered from 1 in
   order (past the log cap a line left out still takes its number); ``write_pid`` again when Podman
   has written ``CONTAINER_PID_FILE``; when the command has exited and its output is closed,
   ``remove_env`` and ``write_exit``: nothing is written after it.
3. The agent, each round and after any restart: ``read_exit`` first, then ``read_output`` from
   where it stopped (``complete=True`` once the exit record was there: the output is whole);
   it reports the exit once everything up to it is stored. No pid record and no exit record
   while the runner's process is gone means the runner was lost.

What a reader can rely on: ``PID_FILE`` and ``EXIT_FILE`` are replaced whole (a synced temporary
file renamed over them), so a reader sees a complete record or none; ``OUTPUT_FILE`` grows by
whole records, and a last line without its newline is left for the next read (unless the output
is complete). What a reader must not rely on: anything else. A run without a container runs as
the agent's own user, so its job could have written any of these files: every reader opens them
without following a link or blocking on a FIFO, reads at most a bounded size, and hands back
only typed, range-checked values (a bad field is None, a bad output record is counted and
skipped, an exit record that cannot be read is an exit of unknown status).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from agent.sandbox import ContainerPolicy, RunLimits

# --- the files -----------------------------------------------------------------------------------
PULL_AUTH_FILE = "pull-auth.json"  # a rank a scheduler runs rootless: its image pull's credentials (agent.rootless)
SPEC_FILE = "spec.json"
PID_FILE = "pid.json"
OUTPUT_FILE = "output.jsonl"
EXIT_FILE = "exit.json"
ENV_FILE = "env"
CONTAINER_PID_FILE = "container.pid"
RUNNER_LOG_FILE = "runner.log"
TMP_SUFFIX = ".tmp"  # the record being written, renamed over its file when whole

# --- the limits ----------------------------------------------------------------------------------
SPEC_MAX_BYTES = 16 << 20  # the job's environment, command and log preamble
RECORD_MAX_BYTES = 64 << 10  # a pid or exit record (a few cgroup paths at most)
CONTAINER_PID_MAX_BYTES = 64
# At most this much of one run's output per read, so one chatty run never starves the others, nor
# the heartbeat (which would get the node taken as lost).
OUTPUT_READ_MAX_BYTES = 4 << 20
# An output record's text longer than this is refused: the runner cuts lines far below, at the
# spec's ``max_line_chars`` (LOG_MAX_LINE_CHARS).
OUTPUT_TEXT_MAX_CHARS = 1 << 20
DEFAULT_MAX_LINE_CHARS = 16384
# What a record may hold: a line number a database column takes, a time from 1970 to 2200, a
# process id, an exit status, a signal number.
MAX_LINE_NO = 2**62
MAX_TIMESTAMP = 7_258_118_400.0
MAX_PID = 2**31
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def run_dir_parts(job_id: int, attempt_number: int, rank: int) -> list[str]:
    """A rank's run directory below ``JOB_WORK_ROOT``."""
    return [str(job_id), f"attempt-{attempt_number}", f"rank-{rank}"]


# --- checked values -------------------------------------------------------------------------------
def int_in(value: object, low: int, high: int) -> int | None:
    """An integer from a run's record when ``low <= value < high``, else None: what a job could
    have written there is never trusted (a bool, a float, a huge number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value < high else None


def whole_number(value: object) -> int | None:
    """A positive count from a record, or None."""
    return int_in(value, 1, 2**53)


def timestamp(value: object) -> float | None:
    """A unix time from 1970 to 2200, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < MAX_TIMESTAMP:
        return None
    return float(value)


def text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


class Refused(OSError):
    """A run file is not a plain file the agent may read (a link, a FIFO, a directory), or too big."""


def read_bounded(path: Path, limit: int) -> bytes:
    """A run file's content, at most ``limit`` bytes, opened without following a link or blocking
    on a FIFO. FileNotFoundError if it is missing; Refused if it is not a plain file or larger."""
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: a symlink where the file should be
        raise Refused(f"{path.name}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(f"{path.name} is not a plain file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Refused(f"{path.name} is larger than {limit} bytes")
    return data


def read_json(path: Path, limit: int = RECORD_MAX_BYTES) -> dict[str, Any] | None:
    """A JSON object from a run file, or None if it is missing or not one (see ``read_bounded``)."""
    try:
        value = json.loads(read_bounded(path, limit))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def write_json_atomic(path: Path, payload: Mapping[str, Any], *, mode: int = 0o644) -> None:
    """``payload`` as ``path``, replaced whole: a reader sees the old file, the new one, or none."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_private(path: Path, text: str, *, owner: int | None = None) -> None:
    """A file only the agent's user (or ``owner``: a scheduler's account) reads, made anew (never
    through a link left in its place): the job's environment, its spec, its pull's credentials."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
        if owner is not None and os.geteuid() == 0:
            os.fchown(fh.fileno(), owner, -1)
        fh.write(text)


# --- the spec: what to run (its container and limits: agent.sandbox) -----------------------------
@dataclass(frozen=True)
class RunSpec:
    """What the runner runs: the command (``bash -c``), where, its environment, its log's limits,
    its container (None: on the host), cgroup limits (None: none asked for) and its log's first lines."""

    command: str
    cwd: str
    env: dict[str, str]
    max_line_chars: int = DEFAULT_MAX_LINE_CHARS
    max_lines: int = 0  # 0: no cap
    max_bytes: int = 0  # the output file's cap in bytes (LOG_MAX_BYTES_PER_JOB); 0: no cap
    tail_lines: int = 10_000  # past a cap, the last lines kept and written when the run ends (LOG_TAIL_LINES)
    container: ContainerPolicy | None = None
    limits: RunLimits | None = None
    preamble: list[str] = field(default_factory=list)
    # The job's secret variables: read once by the runner, which rewrites the spec without them.
    secret_env: dict[str, str] = field(default_factory=dict)


class SpecRefused(ValueError):
    """The spec file is missing, unreadable, or not a spec."""


def write_spec(directory: Path, spec: RunSpec, *, owner: int | None = None) -> Path:
    """The agent writes the run's spec (0600, the agent's eyes only; ``owner``: the account a
    scheduler runs the rank as, whose runner reads it); returns its path, the runner's argument."""
    write_private(directory / SPEC_FILE, json.dumps(asdict(spec)), owner=owner)
    return directory / SPEC_FILE


def rewrite_spec(path: Path, spec: RunSpec) -> None:
    """Replace the spec whole (the runner: once it has read what must not stay on disk)."""
    write_json_atomic(path, asdict(spec), mode=0o600)


def read_spec(path: Path) -> RunSpec:
    """The spec the agent wrote; SpecRefused if it is not one."""
    try:
        raw = json.loads(read_bounded(path, SPEC_MAX_BYTES))
    except (OSError, ValueError, RecursionError) as exc:
        raise SpecRefused(f"unreadable spec: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecRefused("the spec is not an object")
    command, cwd, env = raw.get("command"), raw.get("cwd"), raw.get("env")
    if not isinstance(command, str) or not isinstance(cwd, str):
        raise SpecRefused("the spec names no command or directory")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise SpecRefused("the spec's environment is not names and strings")
    container, limits, preamble = raw.get("container"), raw.get("limits"), raw.get("preamble") or []
    if container is not None and not isinstance(container, dict):
        raise SpecRefused("the spec's container is not an object")
    if limits is not None and not isinstance(limits, dict):
        raise SpecRefused("the spec's limits are not an object")
    if not isinstance(preamble, list) or not all(isinstance(line, str) for line in preamble):
        raise SpecRefused("the spec's preamble is not lines")
    secret_env = raw.get("secret_env") or {}
    if not isinstance(secret_env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in secret_env.items()):
        raise SpecRefused("the spec's secret environment is not names and strings")
    return RunSpec(
        command=command,
        cwd=cwd,
        env=env,
        max_line_chars=int_in(raw.get("max_line_chars"), 1, 2**31) or DEFAULT_MAX_LINE_CHARS,
        max_lines=int_in(raw.get("max_lines"), 0, 2**53) or 0,
        max_bytes=int_in(raw.get("max_bytes"), 0, 2**62) or 0,
        tail_lines=int_in(raw.get("tail_lines", RunSpec.tail_lines), 0, 2**31) or 0,
        container=container,  # type: ignore[arg-type]  # its fields are read by agent.sandbox
        limits=limits,  # type: ignore[arg-type]
        preamble=preamble,
        secret_env=secret_env,
    )


def spec_container(directory: Path) -> ContainerPolicy | None:
    """The container a run's spec names, or None (no spec, or a run on the host)."""
    try:
        return read_spec(directory / SPEC_FILE).container
    except SpecRefused:
        return None


# --- the pid record: the run's processes ----------------------------------------------------------
@dataclass(frozen=True)
class PidRecord:
    """Who to signal: the runner, the command's process group (None: nothing to signal, a
    simulated run), when the runner started it, the run's cgroup directories, and in a container
    its name and first process (its init, once Podman has written it)."""

    runner_pid: int | None
    pgid: int | None
    started_at: float = 0.0
    cgroup: tuple[str, ...] = ()
    container: str | None = None
    container_pid: int | None = None
    gpus: tuple[int, ...] | None = None  # the GPUs Slurm gave it, not placement's (agent.allocation.follow_scheduler_gpus)
    node: str | None = None  # the node Slurm ran it on (``SLURMD_NODENAME``), not placement's


def write_pid(directory: Path, record: PidRecord) -> None:
    """The runner records its processes (replaced whole; a field not known is left out)."""
    payload = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(record).items() if v is not None}
    write_json_atomic(directory / PID_FILE, payload)


def pid_written(directory: Path) -> bool:
    return os.path.lexists(directory / PID_FILE)


def read_pid(directory: Path) -> PidRecord | None:
    """The run's processes, or None if the runner has not recorded them (or the record is not
    one). Every field is checked: one out of range is None (``cgroup``: its strings only)."""
    raw = read_json(directory / PID_FILE)
    if raw is None:
        return None
    cgroup = raw.get("cgroup")
    return PidRecord(
        runner_pid=int_in(raw.get("runner_pid"), 1, MAX_PID),
        pgid=int_in(raw.get("pgid"), 1, MAX_PID),
        started_at=timestamp(raw.get("started_at")) or 0.0,
        cgroup=tuple(d for d in cgroup if isinstance(d, str)) if isinstance(cgroup, list) else (),
        container=text_or_none(raw.get("container")),
        container_pid=int_in(raw.get("container_pid"), 2, MAX_PID),  # never 1: the node's own init
        gpus=gpu_list(raw.get("gpus")),
        node=node_name(raw.get("node")),
    )


def gpu_list(value: object) -> tuple[int, ...] | None:
    """GPU indices from a run's record (at most 64, each below 1024), or None."""
    ok = isinstance(value, list) and 0 < len(value) <= 64 and all(int_in(v, 0, 1024) is not None for v in value)
    return tuple(value) if ok and isinstance(value, list) else None


_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def node_name(value: object) -> str | None:
    """A node's name from a run's record (a DNS label or host name, at most 63 characters), or None."""
    return value if isinstance(value, str) and _NODE_NAME.fullmatch(value) else None


def read_container_pid(directory: Path) -> int | None:
    """The container's first process as Podman wrote it (``--pidfile``), or None (not yet)."""
    try:
        text = read_bounded(directory / CONTAINER_PID_FILE, CONTAINER_PID_MAX_BYTES).decode("ascii").strip()
        return int_in(int(text or 0), 2, MAX_PID)
    except (OSError, ValueError):
        return None


# --- the output: one record a line ----------------------------------------------------------------
class OutputLine(NamedTuple):
    """One record of ``OUTPUT_FILE``: ``{"n": line number, "t": unix time, "s": text}`` (a tuple:
    a flood makes one per line, and a frozen dataclass cost several times as much to make)."""

    number: int
    time: float
    text: str


WRITE_BUFFER_BYTES = 256 << 10  # records held at most before they are written


def output_record(number: int, time: float, text: str) -> bytes:
    """``json.dumps({"n": number, "t": time, "s": text}, ensure_ascii=False)`` and a newline, byte
    for byte, made with the encoder's C string escaper directly (a record a line: the dict and
    the encoder object cost more than the text)."""
    if type(number) is not int or type(time) is not float or not math.isfinite(time):
        return json.dumps({"n": number, "t": time, "s": text}, ensure_ascii=False).encode("utf-8") + b"\n"
    return f'{{"n": {number}, "t": {time!r}, "s": {encode_basestring(text)}}}\n'.encode()


def checked_record(record: object) -> OutputLine | None:
    """The line a parsed record stands for, or None when any field is missing or out of range."""
    if type(record) is not dict:
        return None
    number, stamp, text = record.get("n"), record.get("t"), record.get("s")
    # What the runner writes, checked with plain comparisons (``type`` is exact: no bool, no subclass).
    if (
        type(number) is int
        and 1 <= number < MAX_LINE_NO
        and type(stamp) is float
        and 0 <= stamp < MAX_TIMESTAMP
        and type(text) is str
        and len(text) <= OUTPUT_TEXT_MAX_CHARS
    ):
        return OutputLine(number, stamp, text)
    number, stamp, text = int_in(record.get("n"), 1, MAX_LINE_NO), timestamp(record.get("t")), record.get("s")
    if number is None or stamp is None or not isinstance(text, str) or len(text) > OUTPUT_TEXT_MAX_CHARS:
        return None
    return OutputLine(number, stamp, text)


class OutputWriter:
    """The runner's output file, appended in whole records: what one read of the command's output
    brought is written together by ``flush`` (the runner calls it before it waits for more), so
    the file only ever ends with a whole record. ``count`` is the number of the last line read,
    written or not; ``bytes`` what this writer has written or holds (the runner's caps are on it:
    a run on the host could append to the file itself, but never makes the runner write more)."""

    def __init__(self, directory: Path) -> None:
        fd = os.open(directory / OUTPUT_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        self.out: BinaryIO = os.fdopen(fd, "ab", buffering=0)
        self.pending = bytearray()
        self.count = 0
        self.bytes = 0

    def write(self, record: bytes) -> None:
        self.pending += record
        self.bytes += len(record)
        if len(self.pending) >= WRITE_BUFFER_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write what is held, whole (a short write is finished, never left half a record)."""
        view = memoryview(self.pending)
        while view:
            written = self.out.write(view)
            view = view[written or 0 :]
        view.release()
        self.pending.clear()

    def next_record(self, text: str, now: float) -> bytes:
        """The record the next line would be, not written yet (its size decides whether it is)."""
        return output_record(self.count + 1, now, text)

    def append(self, record: bytes) -> None:
        """Write the record ``next_record`` made: the next line."""
        self.count += 1
        self.write(record)

    def emit(self, text: str, now: float) -> None:
        """The next line."""
        self.append(self.next_record(text, now))

    def skip(self) -> None:
        """A line read and not written now (past the log cap): its number is taken."""
        self.count += 1

    def note(self, text: str, now: float) -> None:
        """A note numbered as the last line read, so a reader counts the lines skipped."""
        self.write(output_record(self.count, now, text))

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.out.close()

    def __enter__(self) -> OutputWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@dataclass(frozen=True)
class OutputChunk:
    """What one ``read_output`` found: the lines, how many records were unreadable (skipped), the
    offset to read from next, and whether everything written so far has been read."""

    lines: list[OutputLine]
    unreadable: int
    offset: int
    at_end: bool


def read_output(directory: Path, offset: int, *, complete: bool = False, max_bytes: int | None = None, max_lines: int | None = None) -> OutputChunk:
    """The whole records written after ``offset``, at most ``max_bytes`` (``OUTPUT_READ_MAX_BYTES``)
    of them and, with ``max_lines``, at most that many records (short lines: a slice costs what
    its lines cost, not its bytes). A last line without its newline is left for the next read,
    unless ``complete`` (the exit record is written: nothing more will come). A file the agent
    may not read (a link, a FIFO) is taken as no output; a run of more than ``max_bytes`` without
    a newline is skipped as unreadable."""
    limit = OUTPUT_READ_MAX_BYTES if max_bytes is None else max_bytes
    try:
        fd = os.open(directory / OUTPUT_FILE, READ_FLAGS)
    except OSError:
        return OutputChunk([], 0, offset, True)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return OutputChunk([], 0, offset, True)
        os.lseek(fd, offset, os.SEEK_SET)
        chunk = os.read(fd, limit)
        at_end = len(chunk) < limit or not os.read(fd, 1)
    finally:
        os.close(fd)
    size = len(chunk)
    if complete and at_end and chunk and not chunk.endswith(b"\n"):
        chunk += b"\n"  # the runner is done: its last line lacks only the newline
    end = chunk.rfind(b"\n")
    if end < 0:
        if size == limit:  # one "line" longer than a whole read: none the runner wrote
            return OutputChunk([], 1, offset + size, False)
        return OutputChunk([], 0, offset, at_end)
    if max_lines is not None and chunk.count(b"\n", 0, end + 1) > max_lines:
        end = -1
        for _ in range(max_lines):
            end = chunk.find(b"\n", end + 1)
        at_end = False
    records = chunk[: end + 1].splitlines()
    try:
        # One parse for the whole slice; the runner writes one JSON object per line.
        parsed = json.loads(b"[" + b",".join(records) + b"]")
    except (ValueError, RecursionError):
        parsed = [parse_record(raw) for raw in records]
    lines = [line for line in map(checked_record, parsed) if line is not None]
    consumed = min(end + 1, size)
    return OutputChunk(lines, len(parsed) - len(lines), offset + consumed, at_end and consumed == size)


def output_size(directory: Path) -> int:
    """The output file's size, without following a link (a link or no file: 0); what a reader
    compares with its offset to learn whether a run printed since, with no read."""
    try:
        info = os.lstat(directory / OUTPUT_FILE)
    except OSError:
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


def parse_record(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


# --- the exit record ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExitRecord:
    """How the run ended: its exit code or the signal that killed it (neither: the record could
    not be read), when, how many lines it printed, whether the kernel killed a process of it at
    its memory limit (``oom_kills``, under ``memory_limit_mb``), and the PID limit it was ended at."""

    exit_code: int | None
    signal: int | None
    ended_at: float | None = None
    lines: int = 0
    oom_kills: int = 0
    memory_limit_mb: int | None = None
    pids_limit_hit: int | None = None

    @property
    def readable(self) -> bool:
        return self.exit_code is not None or self.signal is not None

    @property
    def out_of_memory(self) -> bool:
        """The kernel killed a process of the run for exceeding the run's memory limit."""
        return self.oom_kills > 0


def write_exit(directory: Path, record: ExitRecord) -> None:
    """The runner's last write: once it exists, the output file is whole."""
    write_json_atomic(directory / EXIT_FILE, asdict(record))


def exit_written(directory: Path) -> bool:
    return os.path.lexists(directory / EXIT_FILE)


def read_exit(directory: Path) -> ExitRecord | None:
    """How the run ended, or None while it has not (no exit record). A record that is there but
    cannot be read, or holds neither an exit code nor a signal in range, is an end of unknown
    status (``readable`` is False)."""
    if not exit_written(directory):
        return None
    raw = read_json(directory / EXIT_FILE) or {}
    return ExitRecord(
        exit_code=int_in(raw.get("exit_code"), -(2**31), 2**31),
        signal=int_in(raw.get("signal"), 1, 128),
        ended_at=timestamp(raw.get("ended_at")),
        lines=int_in(raw.get("lines"), 0, MAX_LINE_NO) or 0,
        oom_kills=whole_number(raw.get("oom_kills")) or 0,
        memory_limit_mb=whole_number(raw.get("memory_limit_mb")),
        pids_limit_hit=whole_number(raw.get("pids_limit_hit")),
    )


# --- the runner's private files, and clean-up ------------------------------------------------------
def write_env(directory: Path, text: str) -> Path:
    """The job's environment for Podman's ``--env-file`` (0600); returns its path."""
    path = directory / ENV_FILE
    write_private(path, text)
    return path


def remove_env(directory: Path) -> None:
    (directory / ENV_FILE).unlink(missing_ok=True)


def container_pidfile(directory: Path) -> Path:
    """Where Podman writes the container's first process (cleared first)."""
    path = directory / CONTAINER_PID_FILE
    path.unlink(missing_ok=True)
    return path


def open_runner_log(directory: Path) -> BinaryIO:
    """The runner's own stderr, appended (the agent opens it for the runner)."""
    fd = os.open(directory / RUNNER_LOG_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "ab")


def clear_stale(directory: Path) -> None:
    """Before a runner starts in ``directory``: the files of an earlier install reusing
    JOB_WORK_ROOT must not pass for this run's."""
    for name in (PID_FILE, EXIT_FILE, OUTPUT_FILE, ENV_FILE, CONTAINER_PID_FILE):
        (directory / name).unlink(missing_ok=True)
        (directory / (name + TMP_SUFFIX)).unlink(missing_ok=True)


def unfinished_run_dirs(work_root: Path) -> Iterator[Path]:
    """The run directories below ``work_root`` whose runner recorded its processes and no exit."""
    for pid_file in Path(work_root).glob(f"**/rank-*/{PID_FILE}"):
        if not exit_written(pid_file.parent):
            yield pid_file.parent

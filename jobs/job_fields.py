"""Helpers for Training Jobs that need no models: the Command field, environment variables and
the text every field may hold."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names the platform sets for every run, or that change how the run's programs start: a job may
# not set them, in its environment field or in its command's leading assignments.
RESERVED_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CHECKPOINT_VENDOR",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "NODE_RANK",
        "CKPT_LAST_STEP",
        "CKPT_SNAPSHOT_DIR",
        "CKPT_RESUME_ROOT",
        "OUTPUT_DIR",
        "PATH",
        "HOME",
        "VIRTUAL_ENV",
        "PYTHONHOME",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
    }
)
RESERVED_PREFIXES = ("JOB_", "MASTER_", "LD_", "BASH_FUNC_")
# A NUL ends a C string (the runner's argv and environment); a lone surrogate, which JSON's
# "\ud800" escape decodes to, is no Unicode text: no UTF-8 column, response or exec can hold it.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def text_refusal(text: str) -> str | None:
    """Why ``text`` cannot be stored or handed to a run, as a predicate ("contains a NUL
    character"); None when it can."""
    found = UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "contains a NUL character"
    return f"contains a lone surrogate (U+{ord(found.group()):04X}), which is not valid Unicode text"


DNS_LABEL_MAX = 63


def dns_label_problems(name: str) -> list[str]:
    """Every reason ``name`` is not a lowercase DNS label (empty: it is one), naming each wrong
    character and where it is, and the length past 63 without cutting anything."""
    problems: list[str] = []
    if len(name) > DNS_LABEL_MAX:
        problems.append(f"It is {len(name)} characters long; use at most {DNS_LABEL_MAX} characters (nothing was cut).")
    wrong: dict[str, list[int]] = {}
    for position, char in enumerate(name, start=1):
        if not ("a" <= char <= "z" or "0" <= char <= "9" or char == "-"):
            wrong.setdefault(char, []).append(position)
    for char, positions in list(wrong.items())[:10]:
        where = ", ".join(map(str, positions[:5])) + (" …" if len(positions) > 5 else "")
        hint = f" (use “{char.lower()}”)" if char.lower() != char and "a" <= char.lower() <= "z" else ""
        shown = repr(char) if not char.isprintable() or char.isspace() else f"“{char}”"
        problems.append(f"{shown} at position {where} is not allowed{hint}: use lowercase letters, digits and '-'.")
    if name.startswith("-") or name.endswith("-"):
        problems.append("Start and end with a lowercase letter or digit, not '-'.")
    return problems


def reserved_reason(name: str) -> str | None:
    """Why a job may not set ``name`` (None: it may)."""
    if name in RESERVED_ENV or name.startswith(RESERVED_PREFIXES):
        if name.startswith("LD_") or name in {"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PYTHONHOME"} or name.startswith("BASH_FUNC_"):
            return f"{name} is reserved: it changes how the platform starts the run's programs."
        return f"{name} is set by the platform for every run and cannot be overridden."
    return None


EXAMPLE_COMMAND = (
    'PYTHONPATH=$CHECKPOINT_VENDOR HF_DATASETS_OFFLINE="1" \\\npython -m jobs.examples.train_tiny --epochs 3 --output-dir $OUTPUT_DIR --datastates --checkpoint'
)


class CommandError(ValueError):
    pass


def normalize_newlines(text: str) -> str:
    r"""Unix line endings. A browser's textarea sends CRLF, and bash reads ``\`` before a CR as
    an escaped CR, not a line continuation: ``VAR=value \`` would silently be lost."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def normalize_text_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with every string value, and every string in a dict value (env), normalised."""

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return normalize_newlines(value)
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        return value

    return {key: clean(value) for key, value in fields.items()}


def logical_lines(command: str) -> list[str]:
    """The command's lines as the shell reads them: backslash continuations joined, newlines
    inside quotes kept (a multi-line ``python -c "…"``), blanks and comments dropped."""
    joined = re.sub(r"\\\r?\n", " ", command)
    lines: list[str] = []
    current: list[str] = []
    quote = ""
    escaped = False
    for char in joined:
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "\n":
            lines.append("".join(current))
            current = []
            continue
        current.append(char)
    lines.append("".join(current))
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def validate_command(command: str) -> None:
    """Check a Command field: shell lines run by ``bash -c`` inside the job's container (the
    container is the boundary, not a list of allowed programs).

    Each logical line must parse as shell words, and its leading ``VAR=value`` assignments may not
    set a platform variable. Raises CommandError with the reason.
    """
    lines = logical_lines(command)
    if not lines:
        raise CommandError("Enter a command, e.g. `python train.py`.")
    if len(command) > 20_000:
        raise CommandError("The command is longer than 20,000 characters.")
    why = text_refusal(command)
    if why:
        raise CommandError(f"The command {why}.")
    for number, line in enumerate(lines, start=1):
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise CommandError(f"Line {number}: {exc} (check quotes).") from None
        rest = words
        while rest and ASSIGNMENT.match(rest[0]):
            why = reserved_reason(rest[0].split("=", 1)[0])
            if why:
                raise CommandError(f"Line {number}: {why}")
            rest = rest[1:]
        if not rest and number == len(lines):
            raise CommandError(f"Line {number}: only variable assignments; add the program to run.")


@dataclass(frozen=True)
class Assignment:
    """A ``NAME=value`` word at the start of one of the command's lines, where it is in the text
    (``start``/``end``: the word and the blanks after it) and what it means. ``literal``: the
    value is exactly the text (no ``$``, backquote, leading ``~`` or continuation to expand), so
    it may move to the run's environment unchanged. ``then``: what follows the assignments there
    ("" for another word or the line's end, else the shell operator, e.g. ``;`` or ``>``)."""

    name: str
    value: str
    start: int
    end: int
    literal: bool
    then: str


SHELL_OPERATORS = frozenset(";&|<>()")
BLANKS = " \t"


def skip_blanks(text: str, i: int) -> int:
    """The index after blanks and backslash-newline continuations from ``i``."""
    while i < len(text):
        if text[i] in BLANKS:
            i += 1
        elif text.startswith("\\\n", i):
            i += 2
        else:
            break
    return i


def word_end(text: str, i: int) -> int:
    """The end of the shell word starting at ``i``: its quotes and escapes read as bash reads
    them (an unclosed quote runs to the end; ``validate_command`` refuses that command)."""
    while i < len(text) and text[i] not in BLANKS and text[i] != "\n" and text[i] not in SHELL_OPERATORS:
        if text[i] == "\\":
            i += 2
        elif text.startswith("$(", i):
            depth, i = 1, i + 2
            while i < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
        elif text[i] == "`":
            close = text.find("`", i + 1)
            i = len(text) if close < 0 else close + 1
        elif text[i] == "'":
            close = text.find("'", i + 1)
            i = len(text) if close < 0 else close + 1
        elif text[i] == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
        else:
            i += 1
    return min(i, len(text))


def line_end(text: str, i: int) -> tuple[int, bool]:
    """The index after the logical line going on at ``i`` (continuations, quoted newlines and
    comments read as bash reads them), and whether it opens a here-document (whose body lines
    are data, not commands)."""
    heredoc = False
    at_word_start = True
    while i < len(text):
        char = text[i]
        if char == "\n":
            return i + 1, heredoc
        if char == "#" and at_word_start:
            newline = text.find("\n", i)
            return (len(text) if newline < 0 else newline + 1), heredoc
        if char in BLANKS or char in SHELL_OPERATORS:
            heredoc = heredoc or text.startswith("<<", i)
            at_word_start = True
            i += 1
        else:
            i = word_end(text, i)
            at_word_start = False
    return i, heredoc


def assigned_value(raw: str) -> tuple[str, bool]:
    """The value bash assigns for the text after ``NAME=``, and whether that text is literal."""
    literal = not raw.startswith("~") and "\\\n" not in raw
    quote = ""
    escaped = False
    for char in raw:
        if escaped:
            escaped = False
        elif quote == "'":
            quote = "" if char == "'" else quote
        elif char in "$`" or (char == "\\" and quote):
            # Expanded; or an escape inside double quotes, which shlex reads otherwise than bash.
            literal = False
        elif char == "\\":
            escaped = True
        elif char == quote:
            quote = ""
        elif char in "'\"" and not quote:
            quote = char
    try:
        words = shlex.split(raw) if raw else [""]
    except ValueError:
        return raw, False
    return (words[0] if len(words) == 1 else raw), literal and len(words) == 1


def leading_assignments(command: str) -> list[Assignment]:
    """The ``NAME=value`` words each line of ``command`` starts with (the assignments
    ``validate_command`` reads), in order; none inside or after a here-document."""
    found: list[Assignment] = []
    i = 0
    while i < len(command):
        i = skip_blanks(command, i)
        run: list[tuple[str, str, int, int, bool]] = []
        while i < len(command) and command[i] not in SHELL_OPERATORS:
            end = word_end(command, i)
            match = ASSIGNMENT.match(command[i:end])
            if match is None:
                break
            value, literal = assigned_value(command[i + match.end() : end])
            run.append((match.group()[:-1], value, i, skip_blanks(command, end), literal))
            i = run[-1][3]
        then = command[i] if i < len(command) and command[i] in SHELL_OPERATORS else ""
        found += [Assignment(*fields, then=then) for fields in run]
        i, heredoc = line_end(command, i)
        if heredoc:
            break
    return found


def without_assignments(command: str, assignments: list[Assignment]) -> str:
    """``command`` with these assignments (and the blanks after each) taken out."""
    for assignment in sorted(assignments, key=lambda a: a.start, reverse=True):
        command = command[: assignment.start] + command[assignment.end :]
    return command


class EnvRefused(ValueError):
    """Environment variables refused, with every reason (``problems``), not only the first."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(" ".join(problems))
        self.problems = problems


def env_problems(env: dict) -> tuple[dict[str, str], list[str]]:
    """``env`` normalised to ``{NAME: text}``, and every reason a variable is refused."""
    clean: dict[str, str] = {}
    problems: list[str] = []
    for name, value in env.items():
        unstorable = text_refusal(name) if isinstance(name, str) else None
        if unstorable:
            # Not echoed: the error could not be written back either.
            problems.append(f"A variable name {unstorable}.")
            continue
        if not isinstance(name, str) or not ENV_NAME.match(name):
            problems.append(f"'{name}' is not a valid variable name (letters, digits and _, not starting with a digit).")
            continue
        why = reserved_reason(name)
        if why:
            problems.append(why)
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            problems.append(f"The value of {name} must be a string or a number.")
            continue
        text = normalize_newlines(str(value))
        why = text_refusal(text)
        if why:
            problems.append(f"The value of {name} {why}.")
        elif len(text) > 10_000:
            problems.append(f"The value of {name} is longer than 10,000 characters.")
        else:
            clean[name] = text
    if len(env) > 200:
        problems.append("At most 200 environment variables.")
    return clean, problems


def validate_env(env: object) -> dict[str, str]:
    """Normalise a job's environment variables to ``{NAME: value}``; raise EnvRefused (a
    ValueError) with every problem if bad."""
    if env in (None, ""):
        return {}
    if not isinstance(env, dict):
        raise EnvRefused(["Environment variables must be an object of NAME: value pairs."])
    clean, problems = env_problems(env)
    if problems:
        raise EnvRefused(problems)
    return clean


def parse_env_text(text: str) -> dict[str, str]:
    """Parse ``NAME=value`` lines (the form's textarea) into a dict; raise EnvRefused with every
    bad line's reason (each prefixed with its line number)."""
    env: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            problems.append(f"Line {number}: use NAME=value.")
            continue
        name = name.strip()
        _, line_problems = env_problems({name: value.strip()})
        problems += [f"Line {number}: {problem}" for problem in line_problems]
        if name in env:
            problems.append(f"Line {number}: {name} is already set on an earlier line.")
        env[name] = value.strip()
    if problems:
        raise EnvRefused(problems)
    return validate_env(env)


def format_env_text(env: dict[str, str]) -> str:
    return "\n".join(f"{k}={v}" for k, v in env.items())

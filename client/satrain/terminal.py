"""A job's log is untrusted text: what the client prints of it never drives the terminal.

``visible`` writes every control character (C0 but tab and newline, DEL, C1) as a Python-style
``\\xNN`` escape, so an escape sequence in a log line (``ESC[2J`` clearing the screen,
``ESC]0;title BEL`` retitling the window, an ``ESC]8;;url ESC\\`` hyperlink, a carriage return
overwriting what was printed) is shown as the text it is: ``\\x1b[2J``, ``\\x1b]0;title\\x07``,
``\\x1b]8;;url\\x1b\\``, ``\\x0d``. A backslash the line holds is printed as it is, so ``\\x1b``
in the output may also be those four characters in the log. ``satrain jobs logs --raw`` prints
lines as stored.
"""

from __future__ import annotations

CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
KEPT = {0x09, 0x0A}  # tab and newline
ESCAPES: dict[int, str] = {code: f"\\x{code:02x}" for code in CONTROLS if code not in KEPT}


def visible(text: str) -> str:
    """``text`` with every control character but tab and newline as its ``\\xNN`` escape."""
    return text.translate(ESCAPES)

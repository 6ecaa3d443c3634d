"""``satrain.terminal.visible``: no control character of a log line reaches the terminal."""

from __future__ import annotations

import unicodedata

import pytest

pytest.importorskip("satrain", reason="the client is not installed: pip install -e ./client")

from satrain.terminal import visible


@pytest.mark.parametrize(
    "stored, printed",
    [
        ("\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\", "\\x1b]8;;http://evil.example/\\x1b\\click\\x1b]8;;\\x1b\\"),
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),
        ("\x1b[2Jgone?", "\\x1b[2Jgone?"),
        ("over\rwritten", "over\\x0dwritten"),
        ("nul\x00 del\x7f c1\x9b", "nul\\x00 del\\x7f c1\\x9b"),
        ("tab\tand newline\n stay ✓", "tab\tand newline\n stay ✓"),
    ],
)
def test_every_control_character_is_shown_as_its_escape(stored, printed):
    assert visible(stored) == printed


def test_nothing_printed_is_a_control_character():
    every = "".join(map(chr, range(0x100)))
    assert all(unicodedata.category(c) != "Cc" or c in "\t\n" for c in visible(every))

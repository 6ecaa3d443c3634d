"""``logs.terminal.plain_text``: what a page shows of a line printed for a terminal."""

from __future__ import annotations

import pytest

from logs.terminal import plain_text


@pytest.mark.parametrize(
    "stored, shown",
    [
        ("epoch 1:  40%|████      | 4/10 [00:01<00:01]\x1b[A", "epoch 1:  40%|████      | 4/10 [00:01<00:01]"),
        ("\x1b[31mERROR\x1b[0m disk full", "ERROR disk full"),
        ("\x1b[2J\x1b[H\x1b[?25lcleared", "cleared"),
        ("\x1b]0;my title\x07after the title", "after the title"),
        ("see \x1b]8;;http://evil.example/\x1b\\the docs\x1b]8;;\x1b\\ here", "see the docs here"),
        ("\x1b7saved\x1b8 \x1b(Bcharset", "saved charset"),
        ("bell\x07 nul\x00 del\x7f c1\x9b31mred", "bell nul del c1red"),
        ("an unfinished \x1b]0;title", "an unfinished ]0;title"),
        ("tab\tkept", "tab\tkept"),
        ("plain ✓ text", "plain ✓ text"),
        ("", ""),
    ],
)
def test_a_page_shows_the_text_not_the_sequences(stored, shown):
    assert plain_text(stored) == shown

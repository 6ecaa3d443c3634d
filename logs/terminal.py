"""A log line as a page shows it: terminal control sequences taken out, the text they framed kept.

Jobs print for terminals: tqdm moves the cursor up (``ESC[A``) to redraw its bars, loggers colour
their levels (``ESC[31m``), tools set the window title (``ESC]0;title BEL``) or print hyperlinks
(``ESC]8;;url ESC\\ text ESC]8;; ESC\\``). Stored lines keep them (the download and
``satrain jobs logs --raw`` give them back); ``plain_text`` is what a page shows instead of
a box and ``[A``. Pure: no Django, no state.
"""

from __future__ import annotations

import re

# ESC [ (or the 8-bit CSI) parameters, intermediates, a final byte: cursor moves, colours, erases.
CSI = r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
# ESC ] (OSC), ESC P (DCS), ESC X, ESC ^, ESC _ (or their 8-bit forms) up to BEL or the string
# terminator (ESC \ or 8-bit ST): titles, hyperlinks' targets, terminal queries.
STRING = r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
# Any other escape: ESC, intermediates, a final byte (ESC 7, ESC ( B, ESC =); not the openers above.
OTHER_ESCAPE = r"\x1b(?![\[\]PX^_])[\x20-\x2f]*[\x30-\x7e]"
# What is left of the controls, once whole sequences are gone: C0 but tab and newline, DEL, C1.
CONTROL = r"[\x00-\x08\x0b-\x1f\x7f-\x9f]"
SEQUENCES = re.compile("|".join((CSI, STRING, OTHER_ESCAPE, CONTROL)))


def plain_text(text: str) -> str:
    """``text`` without terminal control sequences and control characters (tab and newline stay).

    A whole sequence goes (``ESC[2K``, ``ESC]0;title BEL``); a hyperlink keeps its visible text;
    an unfinished one loses only its control character (``ESC]0;ti`` becomes ``]0;ti``), so no
    text is hidden behind it.
    """
    if text.isprintable():  # most lines: no control character at all
        return text
    return SEQUENCES.sub("", text)

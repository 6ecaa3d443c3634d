"""What every app's REST API shares: a JSON parser that refuses text no column can store, and a
JSON renderer that never fails on such text stored before it was refused.

JSON's ``"\\ud800"`` escape decodes to a lone surrogate: Python holds it, but UTF-8 cannot encode
it, so a row that contains one breaks every response that shows it. The parser refuses it
wherever it is in a body, with a 400 that names the field, before any serializer (or an error
message that echoes the input) sees it.
"""

from __future__ import annotations

import re
from typing import Any

from rest_framework import parsers, renderers
from rest_framework.exceptions import ValidationError

LONE_SURROGATE = re.compile("[\ud800-\udfff]")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


def _label(key: str) -> str:
    """A key as the error shows it: names as they are, anything else (it may be the bad text) not."""
    return key if NAME.match(key) else "(a key)"


def lone_surrogate_at(data: Any, path: tuple[str, ...] = ()) -> tuple[tuple[str, ...], str] | None:
    """Where the first lone surrogate in parsed JSON is: (the path of keys and ``[index]``es, the
    code point as ``U+D800``); None where there is none."""
    if isinstance(data, str):
        found = LONE_SURROGATE.search(data)
        return None if found is None else (path, f"U+{ord(found.group()):04X}")
    if isinstance(data, dict):
        for key, value in data.items():
            label = _label(key) if isinstance(key, str) else str(key)
            if isinstance(key, str) and (in_key := lone_surrogate_at(key, (*path, label))):
                return in_key
            if in_value := lone_surrogate_at(value, (*path, label)):
                return in_value
    elif isinstance(data, list):
        for index, item in enumerate(data):
            if in_item := lone_surrogate_at(item, (*path, f"[{index}]")):
                return in_item
    return None


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, refusing a body that holds a lone surrogate anywhere (keys included)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        found = lone_surrogate_at(data)
        if found is not None:
            path, code_point = found
            where = "".join(part if part.startswith("[") else f".{part}" for part in path).lstrip(".")
            field = path[0] if path and isinstance(data, dict) and NAME.match(path[0]) else "non_field_errors"
            subject = "This field" if len(path) == 1 else (where or "The body")
            raise ValidationError({field: [f"{subject} contains a lone surrogate ({code_point}), which is not valid Unicode text."]})
        return data


class JSONRenderer(renderers.JSONRenderer):
    """DRF's JSON renderer; where a stored text holds a lone surrogate (from before the parser
    refused them), the response escapes it (``\\ud800``, still valid JSON) instead of failing."""

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: dict | None = None) -> bytes:
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            self.ensure_ascii = True  # this instance serves this one response
            return super().render(data, accepted_media_type, renderer_context)

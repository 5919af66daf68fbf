"""Small helpers the reference generators share to write Markdown."""

from __future__ import annotations

import html


def cell(text: str) -> str:
    """Text that fits in one Markdown table cell: one line, pipes escaped, and angle brackets outside
    code spans escaped (a description's `<member>` is text, not an HTML tag)."""
    parts = " ".join(str(text).split()).split("`")
    parts = [part if i % 2 else html.escape(part, quote=False) for i, part in enumerate(parts)]
    return "`".join(parts).replace("|", "\\|")


def fenced(text: str, lang: str = "text") -> str:
    return f"```{lang}\n{text.rstrip()}\n```"

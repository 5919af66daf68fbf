"""Ready-made redaction hooks for ``gateway.harvest.redact.hook`` (``module:function``, text -> text).

Write your own the same way (names from your CRM, internal hostnames): any importable callable that
takes one turn's text and returns it redacted. These run after the config's patterns.
"""

from __future__ import annotations

import re

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
_PHONE = re.compile(r"(?<![\w+])\+?\d[\d ()./-]{7,}\d(?!\w)")


def contact_details(text: str) -> str:
    """E-mail addresses and phone numbers replaced by ``[EMAIL]`` and ``[PHONE]``."""
    return _PHONE.sub("[PHONE]", _EMAIL.sub("[EMAIL]", text))

"""Redaction of a conversation before it is stored anywhere (``gateway.harvest.redact``): the config's
regular expressions, then a Python callable for what they miss.

A hook is named ``module:function`` and called with each turn's text (after the patterns); it returns
the text to keep. If it raises or returns something other than a string, the conversation is not
stored at all (``RedactionFailed``): never stored unredacted. Only a count of redactions leaves here,
never what was replaced.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

from corl.config import RedactConfig
from corl.proto.conversation import Conversation

Hook = Callable[[str], str]


class RedactionFailed(Exception):
    """The redaction hook failed on a conversation: it must not be stored."""


def load_hook(spec: str) -> Hook:
    """The callable ``module:function`` names; ``ValueError`` saying why when it cannot be loaded."""
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"redaction hook {spec!r} cannot be loaded: {type(err).__name__}: {err}") from None
    if not callable(fn):
        raise ValueError(f"redaction hook {spec!r} is not callable")
    return fn  # type: ignore[no-any-return]


class Redactor:
    """``redactor(conv) -> (redacted conversation, redactions)``; built once per process from the config."""

    def __init__(self, cfg: RedactConfig, hook: Hook | None = None) -> None:
        self.patterns = [re.compile(p) for p in cfg.patterns]
        self.replacement = cfg.replacement
        self.hook = hook if hook is not None else (load_hook(cfg.hook) if cfg.hook else None)

    def text(self, text: str) -> tuple[str, int]:
        """One text redacted, and how many spans (patterns) and hook changes (1) that took."""
        count = 0
        for pattern in self.patterns:
            text, n = pattern.subn(self.replacement, text)
            count += n
        if self.hook is not None:
            try:
                out = self.hook(text)
            except Exception as err:  # noqa: BLE001 - the operator's code: any failure means "do not store"
                raise RedactionFailed(f"the redaction hook raised {type(err).__name__}") from None
            if not isinstance(out, str):
                raise RedactionFailed(f"the redaction hook returned {type(out).__name__}, not a string")
            count += out != text
            text = out
        return text, count

    def __call__(self, conv: Conversation) -> tuple[Conversation, int]:
        turns, total = [], 0
        for turn in conv.messages:
            text, n = self.text(turn.content)
            turns.append(turn.model_copy(update={"content": text}))
            total += n
        return (conv.model_copy(update={"messages": turns}) if total else conv), total

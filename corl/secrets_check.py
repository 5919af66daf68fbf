"""Deployment secrets that cannot be guessed: what compose's `secrets-check` service and the chart check.

A deployment refuses to start on a secret that is unset, shorter than ``MIN_LENGTH`` or one of the
placeholders people copy from examples (``change-me...``, ``password``, ``secret``...): the cohort
token, the admin token and the Redis password guard code execution, weight swaps and the training
stream.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MIN_LENGTH = 16
_PLACEHOLDER = re.compile(r"change[-_ ]?me|placeholder|example|your[-_]|^(password|secret|admin|token|redis)\d*$", re.I)


def weak_secret(value: str | None) -> str | None:
    """Why a secret is unfit to deploy with, or None when it is fit."""
    if not value:
        return "unset"
    if _PLACEHOLDER.search(value):
        return "a placeholder"
    if len(value) < MIN_LENGTH:
        return f"shorter than {MIN_LENGTH} characters"
    return None


def weak_secrets(env: Mapping[str, str], names: list[str]) -> list[str]:
    """One line per named secret that is unfit, e.g. 'CORL_ADMIN_TOKEN: a placeholder'."""
    return [f"{name}: {why}" for name in names if (why := weak_secret(env.get(name)))]

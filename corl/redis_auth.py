"""The Redis password a deployment gives its services, kept out of config files and the run record.

Compose and Helm hand every service that talks to Redis the password from a secret: as a file
(``CORL_REDIS_PASSWORD_FILE``, a mounted secret, preferred) or as ``CORL_REDIS_PASSWORD``. Clients
pass it to redis-py beside the URL, so the config (and every copy of it a run writes) never holds it;
a password written in the URL itself (``corl run``'s private Redis) wins.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PASSWORD_ENV = "CORL_REDIS_PASSWORD"
PASSWORD_FILE_ENV = "CORL_REDIS_PASSWORD_FILE"


def redis_password() -> str | None:
    """The deployment's Redis password, or None where it sets none."""
    path = os.environ.get(PASSWORD_FILE_ENV)
    if path:
        try:
            password = Path(path).read_text().strip()
        except OSError as exc:
            raise RuntimeError(f"{PASSWORD_FILE_ENV}={path}: cannot read the Redis password ({exc})") from exc
        if not password:
            raise RuntimeError(f"{PASSWORD_FILE_ENV}={path}: the file is empty")
        return password
    return os.environ.get(PASSWORD_ENV) or None


def redis_auth() -> dict[str, Any]:
    """Keyword arguments for ``Redis.from_url``: the password when the deployment sets one."""
    password = redis_password()
    return {"password": password} if password else {}

"""Container health check: GET $HEALTHCHECK_URL, healthy on a 2xx answer.

One image serves every role, so the URL comes from the environment (model server :8000/healthz,
aggregator :8100/healthz, evaluator :8200/healthz, trainer metrics port). An empty URL means "no
HTTP endpoint" (one-shot jobs) and always reports healthy. Standard library only: it runs before
anything else is known to work.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    url = os.environ.get("HEALTHCHECK_URL", "").strip()
    if not url:
        return 0
    try:
        with urllib.request.urlopen(url, timeout=4) as resp:
            return 0 if 200 <= resp.status < 300 else 1
    except (urllib.error.URLError, OSError) as err:
        sys.stderr.write(f"healthcheck {url}: {err}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""MkDocs hooks: the reference pages are generated from the code at build time, never checked in.

- reference/cli.md: every `corl` command's own `--help`;
- reference/config.md: every field of the cohort config and of the services' settings (pydantic);
- reference/http-*.md: each service's OpenAPI document, built from its FastAPI app without a server;
- reference/metrics.md: every metric of every process's Prometheus registry;
- the marker ``<!-- reward-modes -->`` in a page becomes the table of reward modes (corl.rewards.modes).
"""

from __future__ import annotations

import reference_cli
import reference_config
import reference_http
import reference_metrics
from mkdocs.structure.files import File, Files

REWARD_MODES_MARKER = "<!-- reward-modes -->"


def generated_pages() -> dict[str, str]:
    pages = {
        "reference/cli.md": reference_cli.page(),
        "reference/config.md": reference_config.page(),
        "reference/metrics.md": reference_metrics.page(),
    }
    pages.update({f"reference/{name}": text for name, text in reference_http.pages().items()})
    return pages


def on_files(files: Files, config, **kwargs) -> Files:
    for path, text in generated_pages().items():
        files.append(File.generated(config, path, content=text))
    return files


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if REWARD_MODES_MARKER in markdown:
        from corl.rewards.modes import markdown_table

        markdown = markdown.replace(REWARD_MODES_MARKER, markdown_table())
    return markdown

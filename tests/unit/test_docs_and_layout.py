"""What the README says about the code, and the code's own layout rules, stay true."""

from __future__ import annotations

import re
from pathlib import Path

from corl.rewards.modes import markdown_table

ROOT = Path(__file__).resolve().parents[2]


def test_readme_reward_mode_table_is_the_one_table() -> None:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- reward-modes:start -->\n(.*?)\n<!-- reward-modes:end -->", readme, re.S)
    assert found, "README.md lost its reward-modes markers"
    assert found.group(1) == markdown_table(), "regenerate the README table from corl.rewards.modes.markdown_table()"


def test_no_module_over_400_lines() -> None:
    """Modules stay small enough to read in one sitting (STYLE.md)."""
    too_long = {
        str(p.relative_to(ROOT)): n
        for folder in ("corl", "services", "trainer")
        for p in (ROOT / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not too_long, too_long

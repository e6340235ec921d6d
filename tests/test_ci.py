"""The CI script runs exactly the test command the README gives."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```bash")
    end = lines.index("```", start)
    return [line for line in lines[start + 1 : end] if line and not line.startswith("#")]


def test_readme_starts_with_two_commands_and_ci_runs_the_second() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    assert "zerolayer up" in commands[0]
    assert "pytest" in commands[1]
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci_lines


DEBIAN_PACKAGES = {"prometheus": "prometheus", "promtool": "prometheus", "haproxy": "haproxy"}
"""Binary an e2e test skips without -> the Debian package that ships it."""


def test_ci_installs_the_debian_package_of_each_binary_an_e2e_test_skips_without() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    for path in sorted((ROOT / "tests" / "e2e").glob("test_*.py")):
        for binary in re.findall(r'shutil\.which\("([\w+-]+)"\) is None', path.read_text()):
            package = DEBIAN_PACKAGES[binary]
            assert re.search(rf"command -v {re.escape(binary)}\b", ci), (path.name, binary)
            assert re.search(rf"^\s*debian_install {package} tests/e2e/{path.name}$", ci, re.M), (
                path.name,
                package,
            )

"""The CI script runs exactly the test command the README gives."""

from __future__ import annotations

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

"""The README's CLI promises, walked as a newcomer would: the table names every option the CLI
has (and only those), each command of its "Try the CLI" block runs as written against a
running stack, exiting 0, and so does its "From Python" block."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from typing import Any

import pytest
import typer

from tests.e2e.stack import Stack
from tests.integration.helpers import REPO
from zeropilot.cli import app

README = (REPO / "README.md").read_text()
TRY_BLOCK = re.compile(r"### Try the CLI\n.*?```sh\n(.*?)```", re.DOTALL)
PYTHON_BLOCK = re.compile(r"### From Python\n.*?```python\n(.*?)```", re.DOTALL)
TABLE_ROW = re.compile(
    r"^\| `zeropilot ((?:teams|users|calibration) [a-z]+|[a-z]+)(.*?)` \|", re.MULTILINE
)
OPTION = re.compile(r"(?<![\w-])(--?[a-z][a-z-]*)")


def table_rows() -> dict[str, set[str]]:
    """Each command of the README's CLI table with the options its row names."""
    return {name: set(OPTION.findall(rest)) for name, rest in TABLE_ROW.findall(README)}


def cli_commands() -> dict[str, set[str]]:
    """Each command the CLI really has, with its options (long and short names)."""
    commands: dict[str, set[str]] = {}

    def walk(group: Any, prefix: str) -> None:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):  # a sub-app such as `teams`
                walk(command, f"{prefix}{name} ")
                continue
            names = {o for p in command.params for o in p.opts if o.startswith("-")}
            commands[f"{prefix}{name}"] = names - {"--help"}

    walk(typer.main.get_command(app), "")
    return commands


def test_the_readme_table_lists_every_command_and_option_the_cli_has() -> None:
    table, cli = table_rows(), cli_commands()

    assert sorted(table) == sorted(cli)
    for name, options in cli.items():
        assert table[name] == options, f"README row of `zeropilot {name}`"


def try_commands() -> list[str]:
    block = TRY_BLOCK.search(README)
    assert block, "README has a 'Try the CLI' block"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.slow
def test_every_command_of_the_readme_try_block_runs_as_written(stack: Stack, token: str) -> None:
    stack.start_worker("w1")
    env = {**os.environ, "ZEROPILOT_URL": stack.url, "ZEROPILOT_TOKEN": token}
    env.pop("ZEROPILOT_CLUSTERS__PROFILES_FILE", None)
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
    job = ""
    for line in try_commands():
        words = shlex.split(line.replace("$JOB", job))
        extra = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
        argv = words[len(extra) :]
        assert argv[0] == "zeropilot", line
        result = subprocess.run(
            [sys.executable, "-m", "zeropilot.cli", *argv[1:]],
            env={**env, **extra},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}{stack.logs()}"
        if argv[1] == "submit":  # the job the following lines look at
            job = re.search(r"^job ([0-9a-f]{16}) ", result.stdout, re.MULTILINE).group(1)  # type: ignore[union-attr]


def test_the_readme_python_block_runs_as_written(stack: Stack, token: str) -> None:
    block = PYTHON_BLOCK.search(README)
    assert block, "README has a 'From Python' block"
    env = {**os.environ, "ZEROPILOT_URL": stack.url, "ZEROPILOT_TOKEN": token}

    def run() -> list[list[str]]:
        result = subprocess.run(
            [sys.executable, "-c", block.group(1)],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}{stack.logs()}"
        return [line.split() for line in result.stdout.splitlines()]

    first = run()
    assert [(name, status) for _, name, status, *_ in first] == [
        ("tiny-gpt-sweep-1", "QUEUED"),
        ("tiny-gpt-sweep-2", "QUEUED"),
    ]  # no worker runs here: admitted and waiting for one
    again = run()
    assert [row[0] for row in again] == [row[0] for row in first]  # the keys: the same jobs

"""The command line's help reads as the docs describe it: flags without a type beside them, values by name, and
`--json` the same switch in every command (a file a command writes is `--out`). The one Typer hook the CLI
replaces (cli/main.py `_readable_metavars`) is checked against the installed Typer, so a Typer release that
stops calling it fails here rather than silently bringing `<bool>` back."""

from __future__ import annotations

import inspect

import typer.core
import typer.rich_utils
from typer.testing import CliRunner

from dspark_launch.cli.main import app

COMMANDS = ("start", "stop", "restart", "reload", "status", "logs", "smoke", "plan", "bench", "tune")


def test_typer_still_calls_the_hook_the_cli_replaces():
    assert "display_type_rich" in inspect.getsource(typer.rich_utils)
    assert typer.core.TyperOption.display_type_rich.__module__ == "dspark_launch.cli.main"


def test_no_help_shows_a_type_beside_a_flag():
    runner = CliRunner()
    for command in COMMANDS:
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (command, result.output)
        assert "<bool>" not in result.output and "BOOLEAN" not in result.output, (command, result.output)


def test_json_is_one_switch_everywhere():
    command = typer.main.get_command(app)
    found = {}

    def walk(cmd, path):
        for param in getattr(cmd, "params", []):
            if "--json" in getattr(param, "opts", ()):
                found[path] = param
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(command, "")
    assert len(found) >= 5, sorted(found)
    for path, param in found.items():
        assert param.is_flag, path
    assert len({p.help for p in found.values()}) == 1, {k: p.help for k, p in found.items()}


def test_a_wrapped_docstring_is_one_paragraph_in_the_help():
    """Docstrings wrap at the source's 120 columns; the help joins each paragraph (cli/main.py `_unwrap_docstrings`),
    so a wide terminal shows a command's sentence on one line."""
    from dspark_launch.cli import service_cmd

    assert "\n" in inspect.cleandoc(service_cmd.stop.__doc__)
    command = typer.main.get_command(app)
    for name, sub in command.commands.items():
        assert "\n" not in (sub.help or "").split("\n\n")[0], name
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "300"})
    assert "then Ray on every node; idempotent." in result.output

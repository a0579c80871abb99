"""The `dspark` entry point: the root command and its sub-commands."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dspark_launch import __version__
from dspark_launch.cli import cluster_cmd, config_cmd, model_cmd, service_cmd, tune_cmd


def _readable_metavars() -> None:
    """Typer 0.29 shows a `<bool>` beside every flag and `<str>`/`<int>` beside every value: a flag takes no
    value, so it shows none; a value without its own metavar shows its name (`--gpu` -> `GPU`); an argument shows
    its name once. Typer has no setting for this, so its `display_type_rich` hook (read by typer/rich_utils.py) is
    replaced; tests/test_cli_help.py fails when Typer stops calling it or the help shows `<bool>` again."""
    from typer.core import TyperArgument, TyperOption

    def option_type(self, ctx):
        if self.metavar is not None:
            return self.metavar
        return None if self.is_flag else (self.name or "value").upper()

    def argument_type(self, ctx):
        return None  # its name already stands in the first column

    TyperOption.display_type_rich = option_type
    TyperArgument.display_type_rich = argument_type


_readable_metavars()

app = typer.Typer(
    name="dspark",
    help="Serve DeepSeek-V4-Flash with vLLM over Ray across DGX Spark nodes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(config_cmd.app, name="config")
app.add_typer(cluster_cmd.app, name="cluster")
app.add_typer(model_cmd.app, name="model")


for command in (
    service_cmd.start,
    service_cmd.stop,
    service_cmd.restart,
    service_cmd.reload,
    service_cmd.status,
    service_cmd.logs,
    service_cmd.smoke,
    service_cmd.plan,
):
    app.command()(command)
app.command("systemd-unit")(service_cmd.systemd_unit)
app.command()(tune_cmd.bench)
app.command()(tune_cmd.tune)


def _unwrap_docstrings(typer_app: typer.Typer) -> None:
    """Commands' help comes from their docstrings, wrapped at the source's line length; Typer's rich help keeps a
    docstring's line breaks, so each paragraph is joined into one line and the terminal wraps it."""
    import inspect

    for info in typer_app.registered_commands:
        if info.help is None and info.callback is not None and info.callback.__doc__:
            paragraphs = inspect.cleandoc(info.callback.__doc__).split("\n\n")
            info.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _unwrap_docstrings(group.typer_instance)


_unwrap_docstrings(app)


def _version(value: bool) -> None:
    if value:
        print(f"dspark-launch {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Serve DeepSeek-V4-Flash with vLLM over Ray across DGX Spark nodes."""

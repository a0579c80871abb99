"""The `dspark` entry point: the root command and its sub-commands."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dspark_launch import __version__
from dspark_launch.cli import cluster_cmd, config_cmd

app = typer.Typer(
    name="dspark",
    help="Serve DeepSeek-V4-Flash with vLLM over Ray across DGX Spark nodes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(config_cmd.app, name="config")
app.add_typer(cluster_cmd.app, name="cluster")


@app.command()
def status(
    env_file: config_cmd.EnvFileOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output (schema in docs/cluster.md).")] = False,
) -> None:
    """The cluster at a glance: nodes, Ray, versions, hotfix; exit 1 when degraded."""
    cluster_cmd.status_command(env_file, as_json)


@app.command()
def stop(env_file: config_cmd.EnvFileOption = None) -> None:
    """Stop what the launcher started on every node; idempotent."""
    _, spec = cluster_cmd.load_spec(env_file)
    cluster_cmd.run_down(spec)


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

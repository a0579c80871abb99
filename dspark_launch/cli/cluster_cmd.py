"""`dspark cluster up|down` and `dspark status`: the Ray half of the launcher."""

from __future__ import annotations

import sys
import time

import typer

from dspark_launch.cli.config_cmd import EnvFileOption
from dspark_launch.cli.loading import settings_and_spec
from dspark_launch.cli.output import fail, say, table
from dspark_launch.cli.reporter import ConsoleReporter
from dspark_launch.cli.signals import interruptible
from dspark_launch.errors import EXIT_FAILED, DsparkError

app = typer.Typer(help="Bring the Ray cluster up or down across the nodes.", no_args_is_help=True)


def _print_failure(error: DsparkError) -> None:
    for line in getattr(error, "extra", []):
        say(line, file=sys.stderr)


def run_up(spec, reporter):
    from dspark_launch.cluster.lifecycle import cluster_up

    def interrupted(code: int) -> None:
        say(f"dspark: interrupted; everything this run started was stopped (exit {code}); "
              f"logs in {spec.state_dir / 'logs'}", file=sys.stderr)

    with interruptible(interrupted):
        try:
            return cluster_up(spec, reporter)
        except DsparkError as error:
            _print_failure(error)
            if error.exit_code == EXIT_FAILED:
                say(f"dspark: error: {error}", file=sys.stderr)
                say(f"dspark: rolled back; logs in {spec.state_dir / 'logs'}", file=sys.stderr)
                raise typer.Exit(EXIT_FAILED) from None
            raise fail(error) from None


@app.command()
def up(env_file: EnvFileOption = None) -> None:
    """Start Ray on every node, verify each node, and apply the scheduler hotfix everywhere."""
    _, spec = settings_and_spec(env_file)
    reporter = ConsoleReporter()
    result = run_up(spec, reporter)
    say("version matrix:")
    say("\n".join(result.matrix))
    for name, report in result.state.hotfix.items():
        say(hotfix_line(name, report))
    say(f"cluster up: {len(spec.nodes)} nodes, Ray at {spec.ray_address}")
    hint = dashboard_hint(spec)
    if hint:
        say(hint)


@app.command()
def down(env_file: EnvFileOption = None) -> None:
    """Stop what the launcher started on every node (never a machine-wide `ray stop`)."""
    _, spec = settings_and_spec(env_file)
    run_down(spec)


def run_down(spec) -> None:
    from dspark_launch.cluster.lifecycle import cluster_down

    try:
        unreachable = cluster_down(spec, ConsoleReporter())
    except DsparkError as error:
        raise fail(error) from None
    if unreachable:
        raise typer.Exit(EXIT_FAILED)


def dashboard_hint(spec) -> str | None:
    from dspark_launch.cluster.ray_cluster import dashboard_hint as hint

    return hint(spec)


def hotfix_line(name: str, report) -> str:
    status = report.status
    return f"hotfix {name}: {status.state} (patch {status.patch_version}, vLLM {status.vllm_version})"


def render_status(view) -> str:
    """The cluster table of `status` (a ClusterView or ServiceStatus)."""
    rows = []
    for n in view.nodes:
        versions = n.versions
        rows.append((n.name, n.ip, "yes" if n.reachable else "NO", "alive" if n.ray_alive else "down",
                     n.registered_ip or "-", "-" if n.gpus is None else f"{n.gpus:g}",
                     (versions and versions.vllm) or "-", (versions and versions.ray) or "-", n.hotfix or "-"))
    since = f", up {time.time() - view.started_at:.0f} s" if view.started_at and view.state != "down" else ""
    head = f"cluster: {view.state} (Ray {view.ray_address}{since})"
    text = head + "\n" + table(("NODE", "IP", "REACHABLE", "RAY", "REGISTERED", "GPUS", "VLLM", "RAY VER", "HOTFIX"),
                               rows, indent="  ")
    boxes = [(n.name, n.container, n.container_status, n.image_id or "-") for n in view.nodes if n.container]
    if boxes:
        text += "\n" + table(("NODE", "CONTAINER", "STATE", "IMAGE"), boxes, indent="  ")
    return text

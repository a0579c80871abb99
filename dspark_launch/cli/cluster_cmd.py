"""`dspark cluster up|down` and `dspark status`: the Ray half of the launcher."""

from __future__ import annotations

import sys

import typer

from dspark_launch.cli.loading import settings_and_spec
from dspark_launch.cli.options import EnvFileOption
from dspark_launch.cli.output import fail, say
from dspark_launch.cli.reporter import ConsoleReporter
from dspark_launch.cli.signals import interruptible, stop_interrupted
from dspark_launch.errors import EXIT_FAILED, DsparkError

app = typer.Typer(help="Bring the Ray cluster up or down across the nodes.", no_args_is_help=True)


def _print_failure(error: DsparkError) -> None:
    for line in getattr(error, "extra", []):
        say(line, file=sys.stderr)


def run_up(spec, reporter):
    from dspark_launch.cluster.lifecycle import cluster_up

    def interrupted(code: int) -> None:
        say(
            f"dspark: interrupted; everything this run started was stopped (exit {code}); "
            f"logs in {spec.state_dir / 'logs'}",
            file=sys.stderr,
        )

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

    with interruptible(stop_interrupted):
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
    if report.apply.action == "revert":  # DSPARK_HOTFIX=off (cluster/hotfix_rollout.hotfix_off)
        done = "reverted the patch an earlier start left" if report.apply.changed else "nothing of ours to revert"
        return f"hotfix {name}: OFF (DSPARK_HOTFIX=off): vLLM {status.vllm_version}'s own scheduler ({done})"
    return f"hotfix {name}: {status.state} (patch {status.patch_version}, vLLM {status.vllm_version})"

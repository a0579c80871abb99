"""`dspark start|stop|restart|status|logs|smoke|systemd-unit`: the service day to day."""

from __future__ import annotations

import functools
import shutil
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_launch.cli.cluster_cmd import dashboard_hint, hotfix_line
from dspark_launch.cli.loading import settings_and_spec, settings_or_exit
from dspark_launch.cli.options import EnvFileOption, JsonOption, StrictOption
from dspark_launch.cli.output import emit_json, fail, say
from dspark_launch.cli.reporter import ConsoleReporter
from dspark_launch.cli.signals import interruptible, stop_interrupted
from dspark_launch.config.declared import DECLARED
from dspark_launch.errors import EXIT_BAD_CONFIG, EXIT_FAILED, EXIT_GAVE_UP, ConfigError, DsparkError

HostOption = Annotated[
    Optional[str], typer.Option("--host", metavar="ADDRESS", help="API bind address (beats VLLM_HOST).")
]
PortOption = Annotated[Optional[str], typer.Option("--port", metavar="PORT", help="API port (beats VLLM_PORT).")]


def _report_failure(error: DsparkError, spec) -> None:
    for line in getattr(error, "extra", []):
        say(line, file=sys.stderr)
    say(f"dspark: error: {error}", file=sys.stderr)
    if error.stopped:
        say(
            f"dspark: stopped what this run started ({', '.join(error.stopped)}); logs in {spec.state_dir / 'logs'}",
            file=sys.stderr,
        )
    elif error.exit_code == EXIT_FAILED:
        say("dspark: nothing had been started", file=sys.stderr)


ForceOption = Annotated[
    bool,
    typer.Option(
        "--force", help="Start even when the memory pre-flight says it won't fit (an overrun freezes the host)."
    ),
]


def do_start(settings, spec, force: bool, foreground: bool, verify: bool = False, begin=None) -> None:
    """`begin`: what starts the server (default `serve.start.start`; a serve-only restart passes its own)."""
    from dspark_launch.serve.start import start as start_serving

    begin = begin or start_serving

    reporter = ConsoleReporter()
    running = []  # the started run's server, from the moment `start` returned

    def interrupted(code: int) -> None:
        """Before `start` returned, its own rollback stopped everything. After: a supervisor stops its own
        run (from the very first moment: a signal while it printed the start's report left the run up,
        unsupervised); a detached start leaves the run it completed, as recorded."""
        reporter.close()
        if running and foreground and _stop_own_run(spec, running[0]):
            running.clear()
        if running:
            serving = running[0].url if running[0] is not None else "what a recovery had started"
            say(
                f"dspark: interrupted after the start had completed; {serving} keeps serving; "
                f"`dspark stop` stops it (exit {code})",
                file=sys.stderr,
            )
            return
        say(
            f"dspark: interrupted; everything this run started was stopped (exit {code}); "
            f"logs in {spec.state_dir / 'logs'}",
            file=sys.stderr,
        )

    with interruptible(interrupted):
        try:
            result = begin(settings, spec, reporter, force=force, verify=verify)
        except DsparkError as error:
            reporter.close()
            _report_failure(error, spec)
            raise typer.Exit(error.exit_code) from None
        running.append(result.server)
        reporter.close()
        _report_started(spec, result)
        if foreground:
            _stay_attached(settings, spec, result.server, force, running)


def _report_started(spec, result) -> None:
    server = result.server
    say(f"serving {server.model} as {server.served_name} at {server.url}/v1")
    cap = (
        "none: vLLM's own scheduler, the hotfix is off (DSPARK_HOTFIX=off)"
        if spec.hotfix == "off"
        else f"{server.scheduler_cap} (from DSPARK_MAX_INFLIGHT_PREFILLS)"
    )
    say(f"KV cache: {server.kv_cache_tokens or 'unknown'} tokens; in-flight prefill cap: {cap}")
    answer = result.first_answer
    if answer is not None:
        kind = "chat completion" if result.serve_spec.chat else "completion"
        retried = f", {answer.waited_s:.1f} s after the first request" if answer.attempts > 1 else ""
        print(f"first answer: a one-token {kind} in {answer.latency_s:.1f} s (attempt {answer.attempts}{retried})")
    for name, report in result.hotfix.items():
        say(hotfix_line(name, report))
    hint = dashboard_hint(spec)
    if hint:
        say(hint)
    sys.stdout.flush()


TAKEN_OVER_LINE = (
    "dspark: this run was stopped or replaced by another dspark command (stop, restart); "
    "the supervisor leaves the deployment alone"
)


def _stop_own_run(spec, server, now: bool = False) -> bool:
    """Stop this run (only while the record still holds it; `server` None: a supervisor's run between two servers,
    while the record holds none; `now`: in-flight requests cut, not drained); one line, never a traceback, when it
    cannot."""
    from dspark_launch.serve.recovery import stop_own

    try:
        if stop_own(spec, ConsoleReporter(quiet=True), server.marker if server else None, now):
            return True
        say(TAKEN_OVER_LINE, file=sys.stderr)
    except DsparkError as error:
        say(f"dspark: error: {error}; nothing was stopped by this supervisor", file=sys.stderr)
    return False


def _stay_attached(settings, spec, server, force: bool, running: list) -> None:
    """For a supervisor: the server, its engine and every node's Ray watched, each loss recovered within
    DSPARK_RECOVERY_LIMIT an hour (serve/recovery.py); exit 4 past the limit, 1 with recovery off, both with this
    run stopped; 0 when an operator's command took the run over. SIGTERM/SIGINT: `do_start`'s `interrupted` stops
    this run (only this one: `running[0]` follows the server each recovery starts)."""
    from dspark_launch.serve.recovery import Ended, supervise
    from dspark_launch.serve.running_server import tails

    def watched(now) -> None:
        running[0] = now

    try:
        ended = supervise(
            settings,
            spec,
            server,
            force,
            ConsoleReporter(),
            lambda text: say(f"dspark: supervisor: {text}", file=sys.stderr),
            watched,
        )
    except DsparkError as error:  # the record became unreadable, say: still one line, and this run stopped
        ended = Ended(f"supervision failed: {error}", False, running[0])
    if ended is None:
        say(f"{TAKEN_OVER_LINE}; exit 0 (a unit with Restart=on-failure stays stopped)", file=sys.stderr)
        raise typer.Exit(0)
    last = ended.server
    if last is not None:
        for line in tails(spec, last, state=None):
            say(line, file=sys.stderr)
    where = f"; log {last.log}" if last is not None else ""
    say(f"dspark: error: {ended.cause}{where}; node logs: `dspark logs --node NAME`", file=sys.stderr)
    stopped = _stop_own_run(spec, last, now=ended.stalled)  # a hung engine cannot drain
    running.clear()
    if ended.gave_up:
        if stopped:
            say(
                "dspark: stopped everything this run started; exit 4: the unit does not restart it "
                "(RestartPreventExitStatus=4); `dspark status` shows the recoveries",
                file=sys.stderr,
            )
        raise typer.Exit(EXIT_GAVE_UP)
    if stopped:
        say("dspark: stopped everything this run started; exit 1 so a supervisor restarts it", file=sys.stderr)
    raise typer.Exit(EXIT_FAILED)


def start(
    env_file: EnvFileOption = None,
    host: HostOption = None,
    port: PortOption = None,
    force: ForceOption = False,
    strict: StrictOption = False,
    foreground: Annotated[
        bool, typer.Option("--foreground", help="Stay attached; exit non-zero if the server dies.")
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Check every weight file's sha256 on every node first (default: sizes and the manifest stamp).",
        ),
    ] = False,
) -> None:
    """Check the weights on every node, bring up Ray, apply the hotfix everywhere, serve, wait until the API answers."""
    settings, spec = settings_and_spec(env_file, host, port, strict)
    do_start(settings, spec, force, foreground, verify)


NowOption = Annotated[
    bool,
    typer.Option("--now", help="Abort in-flight requests instead of letting them finish (DSPARK_DRAIN_TIMEOUT_S)."),
]


def stop(
    env_file: EnvFileOption = None,
    now: NowOption = False,
    remove: Annotated[
        bool,
        typer.Option(
            "--remove",
            help="Also remove the node containers (DSPARK_RUNTIME=docker|podman; else they stay for the next start).",
        ),
    ] = False,
) -> None:
    """Stop the server (letting in-flight requests finish, up to DSPARK_DRAIN_TIMEOUT_S), then Ray on every node;
    idempotent."""
    from dspark_launch.serve.stop import stop as stop_everything

    _, spec = settings_and_spec(env_file)
    with interruptible(stop_interrupted):
        try:
            unreachable = stop_everything(spec, ConsoleReporter(), now, remove)
        except DsparkError as error:
            raise fail(error) from None
    if unreachable:
        raise typer.Exit(EXIT_FAILED)


def restart(
    env_file: EnvFileOption = None,
    host: HostOption = None,
    port: PortOption = None,
    force: ForceOption = False,
    strict: StrictOption = False,
    now: NowOption = False,
) -> None:
    """Stop (drained unless --now), then start with the env file as it is now: only `vllm serve` when only serve-level
    settings changed (Ray kept up), else everything."""
    from dspark_launch.cluster.state import load_state
    from dspark_launch.serve.restart import restart_kind_of, restart_serve
    from dspark_launch.serve.stop import stop as stop_everything

    settings, spec = settings_and_spec(env_file, host, port, strict)
    try:
        state = load_state(spec.state_dir)
        kind = restart_kind_of(settings, spec, state)
    except DsparkError as error:
        raise fail(error) from None
    say(kind.line, file=sys.stderr)
    if kind.serve_only:
        marker = state.server.marker
        do_start(settings, spec, force, False, begin=functools.partial(restart_serve, now=now, marker=marker))
        return
    with interruptible(stop_interrupted):
        try:
            stop_everything(spec, ConsoleReporter(), now)
        except DsparkError as error:
            raise fail(error) from None
    do_start(settings, spec, force, False)


def reload(
    env_file: EnvFileOption = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=1.0,
            metavar="SECONDS",
            help="Seconds to wait for the scheduler to show the new values in force.",
        ),
    ] = 30.0,
) -> None:
    # Its help, below, names the settings declared live (config/knobs.py, config/text_settings.py).
    from dspark_launch.serve.reload import reload as reload_live

    settings, spec = settings_and_spec(env_file)
    try:
        result = reload_live(settings, spec, ConsoleReporter(), timeout)
    except DsparkError as error:
        raise fail(error) from None
    for line in result.lines:
        say(line)


reload.__doc__ = (
    f"Apply live settings ({', '.join(DECLARED.live)}) to the running scheduler without a restart; "
    "any other change is refused (exit 2) and needs `restart`."
)


def status(
    env_file: EnvFileOption = None,
    as_json: JsonOption = False,
    deep: Annotated[
        bool,
        typer.Option("--deep", help="Read Ray's node table (registered IPs, GPUs) even while the record answers it."),
    ] = False,
) -> None:
    """Nodes, Ray, versions, hotfix, the server, its metrics, and drift from the env file."""
    from dspark_launch.serve.status import status as service_status

    settings, spec = settings_and_spec(env_file)
    try:
        view = service_status(settings, spec, deep)
    except DsparkError as error:
        raise fail(error) from None
    if as_json:
        emit_json(view.to_data())
    else:
        from dspark_launch.cli.status_view import print_status  # Rich: only for the text view

        print_status(view, settings.env_file_shown)
    if view.state == "degraded":
        raise typer.Exit(EXIT_FAILED)


def logs(
    env_file: EnvFileOption = None,
    node: Annotated[
        Optional[str], typer.Option("--node", metavar="NODE", help="A node's Ray logs (head, worker1, ...).")
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = False,
    tail: Annotated[int, typer.Option("--tail", "-n", metavar="N", help="Lines to show first.")] = 40,
) -> None:
    """The server log (default) or one node's Ray logs."""
    from dspark_launch.agent.protocol import Tail
    from dspark_launch.serve.logfollow import follow as follow_logs
    from dspark_launch.serve.logs import log_files

    _, spec = settings_and_spec(env_file)
    try:
        files = log_files(spec, node)
        for line in files.agent.call(Tail(files.paths, tail)).lines:
            say(line)
        if follow:
            for text in follow_logs(files.agent, list(files.paths), time.sleep):
                say(text, end="")
                sys.stdout.flush()
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    except DsparkError as error:
        raise fail(error) from None


def smoke(
    env_file: EnvFileOption = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, max=256, metavar="N", help="Requests sent at once.")
    ] = 4,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=1, max=4096, metavar="N", help="Tokens each request asks for.")
    ] = 16,
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS", help="Per request.")] = 120.0,
) -> None:
    """N requests at once to the running server: chat completions when the profile serves a chat model, else
    completions; a line each; exit 1 if any fails."""
    from dspark_launch.cluster.state import load_state
    from dspark_launch.serve.serve_spec import api_key
    from dspark_launch.serve.smoke import confirm_server
    from dspark_launch.serve.smoke import smoke as send_requests

    settings, spec = settings_and_spec(env_file)
    try:
        state = load_state(spec.state_dir)
    except DsparkError as error:
        raise fail(error) from None
    if not state or not state.server:
        raise fail(DsparkError("no server started from this state folder; run `dspark start`"))
    failed = 0
    try:
        key = confirm_server(spec, state.server, api_key(settings))
        for reply in send_requests(state.server, key, concurrency, max_tokens, timeout):
            failed += not reply.ok
            say(reply.line)
    except DsparkError as error:  # also a port taken by another process between two requests: nothing sent
        raise fail(error) from None
    say(f"{concurrency - failed} passed, {failed} failed")
    if failed:
        raise typer.Exit(EXIT_FAILED)


def plan(
    env_file: EnvFileOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
    gpu: Annotated[
        Optional[str],
        typer.Option(
            "--gpu",
            metavar="CAP",
            help="Judge the plan as if every node reported this GPU compute capability "
            "(12.1: GB10), by the installed vLLM's own code: to prepare on a laptop or in CI.",
        ),
    ] = None,
) -> None:
    """What `start` would run on each node (argv, environment, profile decisions, memory); starts nothing.

    A pre-flight for scripts: exit 0 when `start` would go ahead, 1 when it would refuse (each reason listed), 2 for a
    bad configuration."""
    from dspark_launch.cli.plan_view import render_plan
    from dspark_launch.config.load import serve_overrides
    from dspark_launch.profiles.gpu import given_target
    from dspark_launch.serve.preview import build_plan

    settings = settings_or_exit(env_file, serve_overrides(host, port))
    forced = None
    if gpu is not None:
        try:
            forced = given_target(gpu)
        except ValueError:
            raise fail(
                ConfigError(
                    f"--gpu {gpu!r} from the command line is not a compute capability; allowed: "
                    f"MAJOR.MINOR such as 12.1 (GB10), 10.0, 9.0"
                )
            ) from None
    try:
        built = build_plan(settings, ConsoleReporter(quiet=as_json), forced)
    except DsparkError as error:
        raise fail(error) from None
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    say(built.to_json() if as_json else render_plan(built, width))
    if not as_json:
        _print_restart_kind(settings)
    if built.platform_refused:
        raise typer.Exit(EXIT_BAD_CONFIG)  # as start: exit 2, one line per refusal among the plan's
    if built.start_would_refuse:
        raise typer.Exit(EXIT_FAILED)


def _print_restart_kind(settings) -> None:
    """What `dspark restart` would do now, when a server is recorded (serve-only or full, and why)."""
    from dspark_launch.cluster.spec import cluster_spec
    from dspark_launch.cluster.state import load_state
    from dspark_launch.serve.restart import restart_kind_of

    try:
        spec = cluster_spec(settings)
        state = load_state(spec.state_dir)
        if state and state.server:
            say(restart_kind_of(settings, spec, state).line)
    except DsparkError:
        pass  # the plan above is what was asked for; status names what is wrong with the deployment


def systemd_unit(
    env_file: EnvFileOption = None,
    user: Annotated[
        Optional[str], typer.Option("--user", metavar="NAME", help="User= of the unit (default: you).")
    ] = None,
) -> None:
    """Print a systemd unit for the head node (`dspark start --foreground`)."""
    import getpass

    from dspark_launch.config.checks import user_name
    from dspark_launch.config.settings import resolve
    from dspark_launch.serve.systemd_unit import unit_text

    chosen = user or getpass.getuser()
    try:
        user_name(chosen)
    except ValueError as exc:
        source = "CLI --user" if user else "the current user"
        raise fail(ConfigError(f"--user={chosen!r} ({source}): allowed: {exc}")) from None
    exe = shutil.which("dspark")
    launcher = [exe] if exe else [sys.executable, "-m", "dspark_launch"]
    chosen_file = env_file or resolve().env_file
    if chosen_file is None:
        raise fail(
            ConfigError(
                "no env file for the unit (no --env-file, DSPARK_ENV_FILE or ./.env.dspark); "
                "allowed: --env-file PATH, or run `dspark config init`"
            )
        )
    env = Path(chosen_file).resolve()
    drain_s = settings_or_exit(str(env)).dspark_drain_timeout_s
    try:
        say(unit_text(launcher, env, chosen, drain_s))
    except ConfigError as exc:
        raise fail(exc) from None

"""What an operator reads: status, plan and progress on an 80-column terminal (Rich's own recorder),
placeholders refused with the lines to edit, help texts, and the README's layout table against the tree."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

from rich.console import Console

from dspark_launch.cli.status_view import human_duration, print_status
from dspark_launch.cluster.lifecycle import NodeView
from dspark_launch.cluster.state import VersionsRecord
from dspark_launch.serve.http import ServerMetrics
from dspark_launch.serve.status import ServerView, ServiceStatus

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def terminal(width: int = 80) -> Console:
    return Console(
        record=True, width=width, force_terminal=True, color_system="standard", highlight=False, file=io.StringIO()
    )


def node(name: str, ip: str, reachable: bool = True, alive: bool = True, reason: str | None = None) -> NodeView:
    return NodeView(
        name=name,
        ip=ip,
        ssh_host=None if name == "head" else ip,
        reachable=reachable,
        ray_alive=alive,
        registered_ip=ip if alive else None,
        gpus=1.0 if alive else None,
        pids=(),
        versions=VersionsRecord(vllm="0.32.0", ray="2.60.0"),
        hotfix="applied",
        unreachable_reason=reason,
    )


def service(state: str, nodes, server: ServerView, started_at: float | None, problems=()) -> ServiceStatus:
    return ServiceStatus(
        state=state,
        ray_address="10.213.0.1:6379",
        config_digest="digest" if started_at else None,
        started_at=started_at,
        checked_at=time.time(),
        problems=tuple(problems),
        nodes=tuple(nodes),
        server=server,
    )


def test_human_durations_use_two_units_at_most():
    assert [human_duration(s) for s in (0, 59.6, 61, 3600, 3 * 3600 + 12 * 60 + 5, 2 * 86400 + 3600 * 4)] == [
        "0 s",
        "1 min",
        "1 min 1 s",
        "1 h",
        "3 h 12 min",
        "2 d 4 h",
    ]


def test_status_with_nothing_deployed_says_so_with_the_env_file_and_each_no_with_its_reason():
    view = service(
        "down",
        [
            node("head", "10.213.0.1", alive=False),
            node(
                "worker1",
                "10.213.0.2",
                reachable=False,
                alive=False,
                reason="ssh: connect to host 10.213.0.2 port 22: No route to host",
            ),
        ],
        ServerView(state="down"),
        None,
    )
    assert not view.deployed
    console = terminal()
    print_status(view, "/etc/dspark/.env.dspark", console)
    text = console.export_text(styles=False, clear=False)
    assert text.splitlines()[0] == "nothing deployed (env file /etc/dspark/.env.dspark): `dspark start` brings it up"
    assert "  head (10.213.0.1): reachable" in text
    assert "worker1 (10.213.0.2): NO: ssh: connect to host 10.213.0.2 port 22: No route to host" in " ".join(
        text.split()
    )
    assert all(len(line) <= 80 for line in text.splitlines())  # wrapped to the terminal, not past it
    assert "REACHABLE" not in text  # no node table for a deployment that does not exist
    assert "\x1b[1;31mNO\x1b[0m" in console.export_text(styles=True)


def test_status_on_80_columns_colours_the_state_words_and_fits():
    started = time.time() - (3 * 3600 + 12 * 60)
    server = ServerView(
        state="up",
        pid=4242,
        url="http://10.213.0.1:8000",
        uptime_s=3 * 3600 + 12 * 60 + 3,
        healthy=True,
        cap=1,
        kv_cache_tokens=262144,
    )
    view = service(
        "degraded",
        [node("head", "10.213.0.1"), node("worker1", "10.213.0.2", reachable=False, alive=False, reason="timed out")],
        server,
        started,
    )
    console = terminal()
    print_status(view, ".env.dspark", console)
    styled = console.export_text(styles=True, clear=False)
    plain = console.export_text(styles=False)
    assert all(len(line) <= 80 for line in plain.splitlines()), plain
    assert plain.startswith("cluster: degraded (Ray 10.213.0.1:6379, up 3 h 12 min)")
    assert "server: up (pid 4242, up 3 h 12 min)" in plain and "up 11523 s" not in plain
    assert "  worker1: unreachable: timed out" in plain
    assert "\x1b[1;31mdegraded\x1b[0m" in styled and "\x1b[1;32mup\x1b[0m" in styled


def test_status_without_a_terminal_is_plain_text_without_escapes():
    view = service(
        "up",
        [node("head", "10.213.0.1"), node("worker1", "10.213.0.2")],
        ServerView(state="up", pid=7, url="http://127.0.0.1:8000", uptime_s=65, cap=2),
        time.time() - 65,
    )
    printed: list[str] = []
    print_status(view, ".env.dspark", Console(file=io.StringIO(), force_terminal=False), printed.append)
    text = "\n".join(printed)
    lines = text.splitlines()
    assert not ANSI.search(text)
    assert lines[0] == "cluster: up (Ray 10.213.0.1:6379, up 1 min 5 s)"
    assert lines[1].split() == ["NODE", "IP", "REACHABLE", "RAY", "REGISTERED", "GPUS", "VLLM", "RAY", "VER", "HOTFIX"]
    assert "server: up (pid 7, up 1 min 5 s) http://127.0.0.1:8000  cap 2" in text


PROMETHEUS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
"""


def test_status_shows_the_servers_metrics_as_fields_and_its_json_keeps_the_gauge_names():
    metrics = ServerMetrics.from_prometheus(PROMETHEUS)
    assert metrics == ServerMetrics(running=3.0, waiting=1.0, kv_cache_usage=0.25) and metrics.in_engine == 4.0
    server = ServerView(state="up", pid=7, url="http://127.0.0.1:8000", uptime_s=65, cap=2, metrics=metrics)
    view = service("up", [node("head", "10.213.0.1")], server, time.time() - 65)
    printed: list[str] = []
    print_status(view, ".env.dspark", Console(file=io.StringIO(), force_terminal=False), printed.append)
    assert "  running 3  waiting 1  KV cache used 25.0%" in printed
    assert view.to_data()["server"]["metrics"] == {
        "vllm:num_requests_running": 3.0,
        "vllm:num_requests_waiting": 1.0,
        "vllm:kv_cache_usage_perc": 0.25,
    }
    quiet = service(
        "up", [node("head", "10.213.0.1")], ServerView(state="up", pid=7, url="http://127.0.0.1:8000"), time.time() - 65
    )
    assert quiet.to_data()["server"]["metrics"] == {} and not ServerMetrics.from_prometheus("").reported
    printed.clear()
    print_status(quiet, ".env.dspark", Console(file=io.StringIO(), force_terminal=False), printed.append)
    assert not any("KV cache used" in line for line in printed)


# ---- placeholders (point 3) ----

from tests.support.launcher_env import run_dspark  # noqa: E402


def test_config_check_after_init_names_every_placeholder_line_and_exits_2(tmp_path):
    assert run_dspark(["config", "init"], cwd=tmp_path).returncode == 0
    proc = run_dspark(["config", "check"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    env = tmp_path / ".env.dspark"
    lines = env.read_text().splitlines()
    where = {
        name: f"{env}:{lines.index(next(l for l in lines if l.startswith(name + '='))) + 1}"
        for name in ("DSPARK_HEAD_IP", "DSPARK_WORKER_HOSTS", "DSPARK_FABRIC_IFNAME")
    }
    error = proc.stderr.strip()
    assert len(error.splitlines()) == 1 and "configuration OK" not in proc.stdout
    assert f"DSPARK_HEAD_IP=192.0.2.1 ({where['DSPARK_HEAD_IP']})" in error
    assert f"DSPARK_WORKER_HOSTS=192.0.2.2 ({where['DSPARK_WORKER_HOSTS']})" in error
    assert f"DSPARK_FABRIC_IFNAME=enp1s0f1np1 ({where['DSPARK_FABRIC_IFNAME']})" in error
    # Any service command refuses the same way: nothing is dialled.
    refused = run_dspark(["logs"], cwd=tmp_path)
    assert (
        refused.returncode == 2
        and "placeholders from the example still set: DSPARK_HEAD_IP=192.0.2.1" in refused.stderr
    )


def _env(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.env"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_every_documentation_range_is_a_placeholder_wherever_it_is_set(tmp_path):
    env = _env(tmp_path, "DSPARK_HEAD_IP=10.1.0.1\nDSPARK_WORKER_HOSTS=admin@198.51.100.7\nDSPARK_FABRIC_IFNAME=fab0\n")
    proc = run_dspark(["config", "check", "--env-file", str(env)])
    assert proc.returncode == 2 and f"DSPARK_WORKER_HOSTS=admin@198.51.100.7 ({env}:2)" in proc.stderr, proc.stderr
    real = _env(tmp_path, "DSPARK_HEAD_IP=10.1.0.1\nDSPARK_WORKER_HOSTS=10.1.0.2\nDSPARK_FABRIC_IFNAME=fab0\n")
    proc = run_dspark(["config", "check", "--env-file", str(real)], env={"DSPARK_WORKER_IPS": "203.0.113.9"})
    assert proc.returncode == 2 and "DSPARK_WORKER_IPS=203.0.113.9 (environment)" in proc.stderr, proc.stderr
    assert run_dspark(["config", "check", "--env-file", str(real)]).returncode == 0
    # The example's interface name alone may be this Spark's real one: not refused without a placeholder address.
    spark = _env(tmp_path, "DSPARK_HEAD_IP=10.1.0.1\nDSPARK_WORKER_HOSTS=10.1.0.2\nDSPARK_FABRIC_IFNAME=enp1s0f1np1\n")
    assert run_dspark(["config", "check", "--env-file", str(spark)]).returncode == 0


def test_the_example_file_itself_is_refused_even_with_real_hosts_written_into_it(tmp_path):
    # The shipped example edited in place: its values are never a deployment's, whatever they hold.
    example = tmp_path / ".env.dspark.example"
    example.write_text("DSPARK_HEAD_IP=10.1.0.1\nDSPARK_WORKER_HOSTS=10.1.0.2\nDSPARK_FABRIC_IFNAME=fab0\n")
    example.chmod(0o600)
    proc = run_dspark(["logs", "--env-file", str(example)])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dspark: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert f"DSPARK_HEAD_IP=10.1.0.1 from {example}:1 is a placeholder from the example file" in errors[0]
    assert "`dspark config init`" in errors[0]


def test_a_setting_not_set_names_dspark_config_init(tmp_path):
    env = _env(tmp_path, "DSPARK_HEAD_IP=\nDSPARK_WORKER_HOSTS=10.1.0.2\nDSPARK_FABRIC_IFNAME=fab0\n")
    proc = run_dspark(["logs", "--env-file", str(env)])
    assert proc.returncode == 2 and "DSPARK_HEAD_IP is not set" in proc.stderr, proc.stderr
    assert "`dspark config init`" in proc.stderr and ".env.dspark.example" not in proc.stderr


def test_a_failed_start_says_what_it_stopped_only_when_it_started_something(monkeypatch, capsys, tmp_path):
    from dspark_launch.cli.service_cmd import _report_failure
    from dspark_launch.errors import DsparkError
    from dspark_launch.serve import start as start_module

    class Spec:
        state_dir = tmp_path

    class Runtime(start_module.HostRuntime):
        def prepare(self, *args):
            pass

    def weights_missing(*args):
        raise DsparkError("model weights not ready on worker1: run `dspark model pull`")

    monkeypatch.setattr(start_module, "checked_serve_spec", weights_missing)
    try:
        start_module.start_locked(None, Spec(), None, False, False, None, Runtime())
    except DsparkError as error:
        caught = error
    assert caught.stopped == ()
    _report_failure(caught, Spec())
    err = capsys.readouterr().err
    assert "nothing had been started" in err and "stopped" not in err.replace("nothing had been started", "")
    caught.stopped = ("vllm serve", "Ray on every node")
    _report_failure(caught, Spec())
    assert (
        f"stopped what this run started (vllm serve, Ray on every node); logs in {tmp_path / 'logs'}"
        in capsys.readouterr().err
    )


# ---- plan (point 5) ----


def _plan(tmp_path, refusals: tuple[str, ...] = ()):
    from dspark_launch.config.profile_resolve import resolve
    from dspark_launch.config.settings import resolve as load_settings
    from dspark_launch.node.fabric import FabricRequest, fabric_env
    from dspark_launch.node.vllm_offer import VllmOffer
    from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
    from dspark_launch.serve.plan_report import NodePlan, Plan, env_entries, not_probed, profile_decisions
    from tests.support.paths import DATA
    from tests.support.sysfs import add_port, ipv4_gid

    settings = load_settings(env_file=str(ROOT / ".env.dspark.example"), environ={})
    resolved = resolve(DEEPSEEK_V4_FLASH, VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text()), settings)
    add_port(tmp_path, "0000:01:00.1", "enp1s0f1np1", "rocep1s0f1", {3: (ipv4_gid("10.1.0.1"), "RoCE v2")})
    fabric = fabric_env(FabricRequest("head", "enp1s0f1np1", "10.1.0.1"), tmp_path)
    head = NodePlan(
        node="head",
        address="10.1.0.1",
        probed=True,
        status="probed",
        commands=(
            ("/venv/bin/python", "-m", "ray.scripts.scripts", "start", "--head"),
            ("/venv/bin/python", "-m", "dspark_launch.node.serve_entry", *resolved.serve_args),
        ),
        env=env_entries(resolved.env, "profile") + env_entries(fabric.env, "fabric (sysfs)"),
        fabric_notes=fabric.notes,
        warnings=("head: MTU 1500 on fabric member enp1s0f1np1, below 9000",),
        memory=None,
        refusals=refusals,
    )
    return Plan(
        profile=resolved.profile,
        vllm_version=resolved.vllm_version,
        env_file=".env.dspark",
        from_example=False,
        decisions=profile_decisions(resolved),
        nodes=(head, not_probed("worker1", "10.1.0.2", "not probed: worker1 (10.1.0.2): unreachable")),
        memory=None,
        warnings=head.warnings + refusals,
        refusals=refusals + ("worker1 (10.1.0.2): not probed: unreachable",),
    )


def test_plan_on_80_columns_starts_with_a_summary_and_wraps_every_line(tmp_path):
    from dspark_launch.cli.plan_view import render_plan

    plan = _plan(tmp_path, ("memory: head: needs 93 GiB of 64 GiB: start refuses this without --force",))
    text = render_plan(plan, 80)
    lines = text.splitlines()
    summary = " ".join(text[: text.index("details:")].split())
    assert summary.startswith(
        "plan for .env.dspark: profile deepseek-v4-flash-0731, vLLM 0.25.0 on the head; "
        "nothing started head (10.1.0.1): ray start (5 args), vllm serve ("
    )
    assert "args); 1 refusal, 1 warning worker1" in summary
    assert "  worker1 (10.1.0.2): not probed: worker1 (10.1.0.2): unreachable" in text
    assert "start would refuse (2 reasons; `dspark plan` exits 1):" in text
    assert text.index("start would refuse") < text.index("details:") < text.index("decisions:")
    # Wrapped to the terminal: only a single word too long for any line (a JSON value) may pass 80 columns.
    assert all(len(line) <= 80 or " " not in line.strip().rstrip(" \\") for line in lines), [
        line for line in lines if len(line) > 80
    ]
    serve = [
        line for line in lines if line.lstrip().startswith("run: /venv/bin/python -m dspark_launch.node.serve_entry")
    ][0]
    first = lines.index(serve)
    joined = " ".join(
        line.strip().rstrip("\\").strip() for line in lines[first : first + 40] if line.startswith("    ")
    ).split(" run: ")[0]
    assert "--kv-cache-dtype fp8" in joined  # a flag and its value stay together on one line
    unwrapped = render_plan(plan, None)
    assert any(len(line) > 80 for line in unwrapped.splitlines())  # piped: one line per fact, for grep


def test_plan_exits_1_when_start_would_refuse_and_0_when_it_would_start(tmp_path, monkeypatch):
    from dataclasses import replace

    from typer.testing import CliRunner

    from dspark_launch.cli.main import app
    from dspark_launch.cli.plan_view import render_plan
    from dspark_launch.serve import preview

    refused = _plan(tmp_path, ("fabric: head (10.1.0.1): no interface fab9 on this node: start refuses this",))
    ready = replace(refused, refusals=(), warnings=(), nodes=(replace(refused.nodes[0], refusals=()),))
    assert "start would go ahead (`dspark plan` exits 0)" in render_plan(ready, 80)
    env = _env(
        tmp_path,
        "DSPARK_HEAD_IP=10.1.0.1\nDSPARK_WORKER_HOSTS=10.1.0.2\nDSPARK_FABRIC_IFNAME=fab9\n"
        f"DSPARK_STATE_DIR={tmp_path / 'state'}\n",
    )
    for plan, code in ((refused, 1), (ready, 0)):
        monkeypatch.setattr(preview, "build_plan", lambda settings, reporter, forced=None, plan=plan: plan)
        result = CliRunner().invoke(app, ["plan", "--env-file", str(env)])
        assert result.exit_code == code, result.output
        as_json = CliRunner().invoke(app, ["plan", "--json", "--env-file", str(env)])
        assert as_json.exit_code == code and '"refusals"' in as_json.output


def test_plan_names_a_missing_fabric_interface_as_missing(tmp_path):
    from dspark_launch.node.fabric import FabricRequest, fabric_env
    from tests.support.sysfs import add_port, ipv4_gid

    add_port(tmp_path, "0000:01:00.1", "enp1s0f0np0", "rocep1s0f0", {3: (ipv4_gid("10.1.0.1"), "RoCE v2")})
    found = fabric_env(FabricRequest("head", "enp1s0f1np1", "10.1.0.1"), tmp_path)
    assert not found.roce
    assert found.missing == "no interface enp1s0f1np1 on this node (DSPARK_FABRIC_IFNAME; its interfaces: enp1s0f0np0)"


# ---- help (point 2) ----


def _commands(group, path=()):
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        yield (*path, name), command
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))


def test_every_help_text_is_unwrapped_every_option_has_help_and_metavars_read_well():
    import inspect

    import typer.main
    from typer.testing import CliRunner

    from dspark_launch.cli.main import app

    root = typer.main.get_command(app)
    seen = 0
    for path, command in _commands(root):
        paragraphs = inspect.cleandoc(command.help or "").split("\n\n")
        assert command.help and all("\n" not in p for p in paragraphs), f"{path}: hard-wrapped help: {command.help!r}"
        for param in command.params:
            assert getattr(param, "help", None) or param.param_type_name == "argument", f"{path}: {param.name}"
        shown = CliRunner().invoke(app, [*path, "--help"], terminal_width=80, env={"COLUMNS": "80"}).output
        assert not re.search(r"<(bool|str|int|float|path)[^>]*>", shown), f"{path}:\n{shown}"
        assert all(len(line) <= 80 for line in shown.splitlines()), f"{path}:\n{shown}"
        seen += 1
    assert seen >= 20
    env_help = CliRunner().invoke(app, ["status", "--help"], terminal_width=200, env={"COLUMNS": "200"}).output
    assert "else none: the built-in defaults and the environment; the example is read only when named" in env_help
    assert "schema in docs/cluster.md" in env_help and "`status --json`" in (ROOT / "docs" / "cluster.md").read_text()


# ---- progress (point 6) ----

VLLM_SHARDS = (
    "(EngineCore pid=4711) INFO 12-02 01:00:00 [default_loader.py:291] Starting to load model\n"
    "(EngineCore pid=4711) Loading safetensors checkpoint shards:   0% Completed | 0/41 [00:00<?, ?it/s]\n"
    "(EngineCore pid=4711) Loading safetensors checkpoint shards:  46% Completed | 19/41 "
    "[00:31<00:38,  1.6it/s]\n"
)


def test_the_weights_loading_phase_reads_vllms_own_shard_count():
    from dspark_launch.serve import logscan

    assert logscan.phase(VLLM_SHARDS) == "loading weights"
    assert logscan.shards_loaded(VLLM_SHARDS) == (19, 41)
    assert logscan.shards_loaded("Starting to load model\n") is None


def test_progress_on_an_80_column_terminal_shows_shards_bytes_and_eta(monkeypatch):
    from dspark_launch.cli import reporter as module

    console = terminal()
    reporter = module.ConsoleReporter(console=console)
    try:
        reporter.waiting("vllm serve: starting", 12, 1800)
        reporter.measured("vllm serve: loading weights", 19, 41, "shards")
        reporter.measured("worker1 (10.213.0.2): copying the weights", 1 << 30, 4 << 30, "bytes")
        shown = Console(record=True, width=80, file=io.StringIO(), force_terminal=True)
        shown.print(reporter._progress.get_renderable())
        bars = shown.export_text()
    finally:
        reporter.close()
    lines = bars.splitlines()
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines), bars
    assert "vllm serve: loading weights" in lines[0] and "19/41 shards" in lines[0]  # replaced "starting"
    assert "1.00/4.00 GiB" in lines[1] and "ETA" in lines[1], lines[1]
    printed = console.export_text()
    assert "vllm serve: starting (12/1800 s)" in printed and "vllm serve: loading weights (19/41 shards)" in printed
    assert reporter._progress is None  # closed: nothing left drawing when the summary prints


def test_without_a_terminal_a_30_minute_start_writes_a_line_per_phase_and_at_most_one_a_minute(monkeypatch, capsys):
    from dspark_launch.cli import reporter as module

    clock = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    reporter = module.ConsoleReporter(console=Console(file=io.StringIO(), force_terminal=False))
    phases = {
        0: "vllm serve: starting",
        60: "vllm serve: loading weights",
        1500: "vllm serve: compiling",
        1700: "vllm serve: API starting",
    }
    current = phases[0]
    for t in range(0, 1800, 5):  # the start polls every 0.5 s; every 5 s is plenty to show the limit
        clock[0] = 1000.0 + t
        current = phases.get(t, current)
        if current.endswith("loading weights"):
            reporter.measured(current, min(41, t // 30), 41, "shards")
        else:
            reporter.waiting(current, t, 1800)
    reporter.phase("sending a one-token chat completion")
    lines = capsys.readouterr().err.splitlines()
    for message in phases.values():
        assert sum(message + " (" in line for line in lines) >= 1, message
    # 30 minutes, 4 phases: at most a line a minute per phase, and one as each begins (was about 360).
    assert 30 <= len(lines) <= 36, "\n".join(lines)
    for message in phases.values():  # within one phase, a minute at least between two lines
        times = [float(re.match(r"\[\s*([\d.]+)s\]", line).group(1)) for line in lines if message + " (" in line]
        assert all(b - a >= 60 for a, b in zip(times, times[1:])), (message, times)


# ---- README (point 1) ----


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_the_readme_layout_table_names_only_paths_that_exist_and_every_package():
    rows = [line for line in _readme_section("Layout").splitlines() if line.startswith("| `")]
    named = []
    for row in rows:
        path_cell, what = row.split(" | ", 1)
        path = path_cell.strip("| `")
        named.append(path.rstrip("/"))
        folder = ROOT / path
        assert folder.exists(), f"README Layout names {path}, which does not exist"
        for name in re.findall(r"`([\w./-]+\.(?:py|sh))`", what):
            # a file a row names lies in that row's folder (or is a path from the root)
            found = (ROOT / name).exists() or (folder.is_dir() and any(folder.rglob(Path(name).name)))
            assert found, f"README Layout: {path} names {name}, which does not exist there"
        for name in re.findall(r"`([\w-]+/)`", what):
            assert (folder / name).is_dir() or (ROOT / name).is_dir(), (
                f"README Layout: {path} names {name}: no such folder"
            )
    packages = sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / "dspark_launch").glob("*/__init__.py"))
    assert packages and [p for p in packages if p not in named] == [], "packages without a Layout row"
    top = sorted(
        p.name
        for p in ROOT.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and p.name not in ("dspark_launch", "tests")
        and not p.name.endswith(".egg-info")
    )
    assert [t for t in top if t not in named] == [], "top-level folders without a Layout row"


def test_the_readme_says_what_the_code_does():
    from dspark_launch.hotfix.contract import PATCH_VERSION
    from dspark_launch.serve.restart_kind import LIVE_LEVEL

    readme = (ROOT / "README.md").read_text()
    sample = readme[readme.index("What a start prints") : readme.index("## Layout")]
    patches = set(re.findall(r"hotfix \w+: applied \(patch (\d+), vLLM", sample))
    assert patches == {str(PATCH_VERSION)}, f"the sample start output shows patch {patches}; the code: {PATCH_VERSION}"
    assert len(re.findall(r"in [\d.]+ s \(attempt", sample)) == 1  # the first answer's latency said once
    reload_row = next(line for line in _readme_section("Commands").splitlines() if line.startswith("| `dspark reload"))
    assert all(name in reload_row for name in LIVE_LEVEL), reload_row
    smoke_row = next(line for line in _readme_section("Commands").splitlines() if line.startswith("| `dspark smoke"))
    assert "else completions" in smoke_row
    # The prerequisites come before the two set-up commands they are needed for.
    assert readme.index("PIP_EXTRA_INDEX_URL") < readme.index("make test   #") and readme.index("root") < readme.index(
        "make test   #"
    )

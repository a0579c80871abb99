"""`dspark bench` and `dspark tune`: the operator's load against the running server, and the live settings
chosen from it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_launch.cli.loading import settings_and_spec
from dspark_launch.cli.options import EnvFileOption
from dspark_launch.cli.output import fail, printable, say
from dspark_launch.cli.reporter import ConsoleReporter
from dspark_launch.cli.signals import interruptible
from dspark_launch.errors import DsparkError
from dspark_launch.tune.points import TARGET_SWEEP

PromptsOption = Annotated[
    Optional[Path],
    typer.Option(
        "--prompts",
        help='The operator\'s own prompts, a JSONL file ({"prompt": ...} or {"messages": [...]}, '
        'optional "max_tokens"): a fourth class, `operator`.',
    ),
]
RequestsOption = Annotated[
    int,
    typer.Option(
        "--requests",
        min=0,
        max=10000,
        help="At most this many requests a run (0: the workload's own count, sized from the profile).",
    ),
]
SecondsOption = Annotated[
    float,
    typer.Option(
        "--seconds",
        min=1.0,
        max=7200.0,
        help="At most this long a run: no request starts later, streams still running are cut.",
    ),
]
ReplyOption = Annotated[
    int,
    typer.Option(
        "--max-reply-tokens",
        min=0,
        max=8192,
        help="Cap every reply at this many tokens (0: as the profile sizes them).",
    ),
]
SeedOption = Annotated[int, typer.Option("--seed", help="The prompts' words and the rounds' order.")]


def _render(headers: list[str], rows: list[list[str]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index == 0 else "right", no_wrap=index == 0)
    for row in rows:
        table.add_row(*[printable(cell) for cell in row])
    Console(file=sys.stdout, width=max(160, Console().width)).print(table)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def bench(
    env_file: EnvFileOption = None,
    prompts: PromptsOption = None,
    requests: RequestsOption = 0,
    seconds: SecondsOption = 300.0,
    max_reply: ReplyOption = 0,
    seed: SeedOption = 0,
    json_out: Annotated[
        Optional[Path],
        typer.Option("--out", metavar="FILE", help="Also write the result here as JSON (schema dspark-bench/1)."),
    ] = None,
) -> None:
    """Stream a workload of request classes (short chats, a long cold document, cached agent turns, and your prompts
    with --prompts) at the running server; per class: first token, inter-token time, decode rate, errors
    (docs/tune.md)."""
    from dspark_launch.tune import bench as b
    from dspark_launch.tune.loadgen import calibrate

    settings, spec = settings_and_spec(env_file)
    reporter = ConsoleReporter()
    runs = []

    def interrupted(code: int) -> None:
        for run in runs:
            run.stop()
        say(f"dspark: bench interrupted (exit {code})", file=sys.stderr)

    with interruptible(interrupted):
        try:
            limits = b.Limits(requests, seconds, max_reply, prompts, seed)
            server, target = b.served(settings, spec)
            workload = b.workload_for(settings, server, limits)
            busy = b.others_served(server, target)
            if busy:
                reporter.warn(f"the server is serving {busy:g} other request(s): they share the steps measured")
            reporter.phase(
                f"bench: {workload.requests} requests in {len(workload.classes)} classes, at most "
                f"{seconds:g} s, against {server.url}"
            )
            ratio = calibrate(target)

            began = time.monotonic()

            def progress(done: int, total: int) -> None:
                reporter.waiting(f"bench: {done}/{total} requests", time.monotonic() - began, seconds)

            stats = b.bench_once(target, workload, ratio, seconds, progress, runs.append)
        except DsparkError as error:
            raise fail(error) from None
    headers = [
        "class",
        "req",
        "ok",
        "err",
        "cut",
        "prompt tok",
        "TTFT mean",
        "TTFT p90",
        "ITL p50",
        "ITL p99",
        "ITL max",
        "tok/s/stream",
        "tok/s",
    ]
    rows = []
    for name, c in [*stats.classes.items(), ("all", stats.all)]:
        rows.append(
            [
                name,
                str(c.requests),
                str(c.ok),
                str(c.errors),
                str(c.cut),
                "-" if c.prompt_tokens_mean is None else f"{c.prompt_tokens_mean:.0f}",
                _ms(c.ttft_mean_s),
                _ms(c.ttft_p90_s),
                _ms(c.itl_p50_s),
                _ms(c.itl_p99_s),
                _ms(c.itl_max_s),
                _rate(c.decode_tok_s_per_stream),
                _rate(c.decode_tok_s),
            ]
        )
    _render(headers, rows, f"dspark bench: {server.served_name} at {server.url} (times in ms), {stats.seconds:.1f} s")
    for klass in workload.classes:
        say(f"  {klass.name}: {klass.what}")
    for error in stats.first_errors:
        say(f"  error: {error}")
    if json_out:
        json_out.write_text(json.dumps(b.bench_data(server, workload, ratio, stats), indent=2) + "\n")
        say(f"wrote {json_out}")
    if stats.all.errors:
        raise typer.Exit(1)


def tune(
    env_file: EnvFileOption = None,
    space: Annotated[
        Optional[str],
        typer.Option(
            "--space",
            help="The candidates. Points CAP:MODE[:AGING[:TARGET_MS]] separated by spaces or commas; default: 6 points; "
            f'"{TARGET_SWEEP}" sweeps gate mode 4\'s target step time (docs/tune.md).',
        ),
    ] = None,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            min=1,
            max=20,
            help="Runs per point, in a shuffled order each "
            "round; the spread across rounds says which differences count.",
        ),
    ] = 2,
    favor: Annotated[
        str, typer.Option("--favor", help="latency | throughput | balanced: what the recommendation optimises.")
    ] = "balanced",
    apply: Annotated[
        bool, typer.Option("--apply", help="Write the recommendation into the env file and reload.")
    ] = False,
    while_serving: Annotated[
        bool,
        typer.Option(
            "--while-serving",
            help="Run even while other clients are served (tune adds load to theirs, and theirs skews the numbers).",
        ),
    ] = False,
    prompts: PromptsOption = None,
    requests: RequestsOption = 0,
    seconds: SecondsOption = 120.0,
    max_reply: ReplyOption = 0,
    seed: SeedOption = 0,
    out: Annotated[
        Optional[Path],
        typer.Option("--out", help="Folder for tune.json and tune.svg (default: STATE_DIR/tune/TIMESTAMP)."),
    ] = None,
) -> None:
    """Measure candidate live settings (in-flight cap, gate mode, aging, target step time) on the running server with
    the same workload, each verified in force from the engine log; print a table, write JSON and an SVG plot, recommend
    one (--apply: into the env file, reloaded). The live values in force before are restored on exit."""
    from dspark_launch.config.load import load_settings
    from dspark_launch.errors import ConfigError
    from dspark_launch.tune import bench as b
    from dspark_launch.tune.points import DEFAULT_SPACE, Point, parse_space
    from dspark_launch.tune.recommend import FAVORS
    from dspark_launch.tune.tune import Options, Tuner, table_rows

    settings, spec = settings_and_spec(env_file)
    try:
        if favor not in FAVORS:
            raise ConfigError(f"--favor={favor!r}: allowed: {' | '.join(FAVORS)}")
        running = Point.of(settings.public_values())
        points = tuple(parse_space(space if space is not None else DEFAULT_SPACE, running.aging, running.target_ms))
    except DsparkError as error:
        raise fail(error) from None
    options = Options(
        points, rounds, favor, b.Limits(requests, seconds, max_reply, prompts, seed), while_serving, apply, out
    )

    def settings_with(values: dict[str, str]):
        return load_settings(env_file, {name: (value, "dspark tune") for name, value in values.items()})

    reporter = ConsoleReporter()
    runs = []
    tuner = Tuner(settings, spec, reporter, options, settings_with, runs.append)

    def interrupted(code: int) -> None:
        restored = tuner.outcome.restored
        say(
            f"dspark: tune interrupted (exit {code}); "
            + (
                f"the live values in force before are back: {restored}"
                if restored
                else "the live values in force before could not be confirmed back; `dspark status` shows them"
            ),
            file=sys.stderr,
        )

    with interruptible(interrupted):
        try:
            outcome = tuner.run()
        except DsparkError as error:
            raise fail(error) from None
    names = list(outcome.data["classes"])
    headers, rows = table_rows(outcome, names)
    _render(
        headers,
        rows,
        f"dspark tune: median over verified rounds (range), times in ms; * = recommended (--favor {favor})",
    )
    for name, klass in outcome.data["classes"].items():
        say(f"  {name}: {klass['what']}")
    rec = outcome.recommendation
    say(f"recommended ({favor}): {rec.point.name} ({', '.join(f'{k}={v}' for k, v in rec.point.values().items())})")
    say(f"  why: {rec.reason}")
    say(f"wrote {outcome.files['json']} and {outcome.files['svg']}")
    if outcome.applied:
        say(f"applied: written into {settings.env_file} and in force on the running scheduler")
    elif outcome.restored:
        say(
            f"restored the live values in force before: {outcome.restored}"
            + ("" if apply else "; --apply writes the recommendation into the env file")
        )

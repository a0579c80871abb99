"""`dspark tune`: each candidate of the live settings put in force with `dspark reload`, warmed up, measured
with the same workload, N rounds in a shuffled order, each round checked against the engine log; then a
recommendation, and (`--apply`) the recommendation written into the env file and reloaded. Whatever happens
(an error, Ctrl-C, SIGTERM), the live values in force before the tune are put back unless `--apply` put
the recommendation in force."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.config.settings import Settings
from dspark_launch.errors import EXIT_ALREADY_RUNNING, DsparkError
from dspark_launch.hotfix import contract
from dspark_launch.report import Reporter
from dspark_launch.serve import http
from dspark_launch.tune import bench
from dspark_launch.tune.enginelog import EngineLog, Evidence
from dspark_launch.tune.loadgen import Run, Target, calibrate, payload
from dspark_launch.tune.plot import svg
from dspark_launch.tune.points import Point
from dspark_launch.tune.recommend import Recommendation, recommend, spread
from dspark_launch.tune.stats import RunStats

SCHEMA = "dspark-tune/1"
TUNED = (contract.ENV_CAP, contract.ENV_GATE_MODE, contract.ENV_AGING)
RELOAD_ALLOWANCE_S = 10.0  # per run, in the announced time: the reload and the warm-up


class Busy(DsparkError):
    """Other clients are being served: measuring would add load to theirs and their load to ours."""

    exit_code = EXIT_ALREADY_RUNNING


@dataclass(frozen=True)
class Options:
    points: tuple[Point, ...]
    rounds: int = 2
    favor: str = "balanced"
    limits: bench.Limits = bench.Limits()
    while_serving: bool = False
    apply: bool = False
    out_dir: Path | None = None


@dataclass
class Measured:
    point: Point
    round: int
    order: int  # its place in the round's shuffled order (1-based)
    stats: RunStats
    evidence: Evidence


@dataclass
class Outcome:
    """What a tune produced; `files` were written, `applied` is set when --apply put the point in force."""

    runs: list[Measured] = field(default_factory=list)
    recommendation: Recommendation | None = None
    files: dict[str, Path] = field(default_factory=dict)
    applied: bool = False
    restored: str = ""
    data: dict = field(default_factory=dict)


def estimate_s(options: Options) -> float:
    """The longest it may take: every run at its time bound plus its reload and warm-up."""
    return len(options.points) * options.rounds * (options.limits.seconds + RELOAD_ALLOWANCE_S)


class Tuner:
    def __init__(
        self,
        settings: Settings,
        spec: ClusterSpec,
        reporter: Reporter,
        options: Options,
        settings_with: Callable[[dict[str, str]], Settings],
        on_run: Callable[[Run], None] = lambda run: None,
    ):
        """`settings_with(values)`: the env file's settings with `values` (live names) on top, as the CLI
        would load them; `on_run` gets each Run before it starts."""
        self.settings, self.spec, self.reporter, self.options = settings, spec, reporter, options
        self.settings_with = settings_with
        self.on_run = on_run
        self.outcome = Outcome()

    def _reload(self, values: dict[str, str]):
        from dspark_launch.report import SilentReporter
        from dspark_launch.serve.reload import reload

        return reload(self.settings_with(values), self.spec, SilentReporter())

    def _refuse_early(self, server, original: dict[str, str]) -> None:
        from dspark_launch.serve.reload import refusal
        from dspark_launch.serve.restart_kind import reload_changes

        settings = self.settings_with(original)
        changes = reload_changes(server.running_settings, settings.public_values())
        if changes.restart:
            raise refusal(changes, settings)
        if self.options.apply:
            from dspark_launch.config.env_write import where_set

            if self.settings.env_file is None:
                raise DsparkError("--apply: no env file to write (no --env-file, DSPARK_ENV_FILE or ./.env.dspark)")
            for name in TUNED:
                where_set(self.settings.env_file, name, self.settings.source_of(name.lower()))

    def _warm_up(self, target: Target) -> None:
        url, body = payload(target, [{"role": "user", "content": "Hello, warm up."}], 4)
        for _ in range(2):
            http.request(url, target.key, body, 120.0)

    def run(self) -> Outcome:
        server, target = bench.served(self.settings, self.spec)
        options = self.options
        if not options.while_serving:
            busy = bench.others_served(server, target)
            if busy:
                raise Busy(
                    f"tune: the server is serving other clients ({busy:g} request(s) running or waiting); "
                    "tune would add load to theirs and measure theirs; --while-serving runs anyway"
                )
        original = {name: server.running_settings[name] for name in TUNED if name in server.running_settings}
        self._refuse_early(server, original)
        workload = bench.workload_for(self.settings, server, options.limits)
        total = len(options.points) * options.rounds
        self.reporter.phase(
            f"tune: {len(options.points)} points x {options.rounds} rounds = {total} runs of {workload.requests} "
            f"requests each (at most {options.limits.seconds:g} s a run, plus reload and warm-up): at most "
            f"{estimate_s(options) / 60:.1f} min"
        )
        from dspark_launch.report import SilentReporter
        from dspark_launch.serve.logfollow import LogReader

        engine = EngineLog(
            LogReader(self.spec.head.agent(SilentReporter()), server.log), Point.of(server.settings).aging
        )
        try:
            tokens_per_word = calibrate(target)
            self._rounds(target, workload, tokens_per_word, engine, total)
            self._finish(server, workload, tokens_per_word, original)
        finally:
            if not self.outcome.applied:
                self._restore(original)
        return self.outcome

    def _rounds(self, target, workload, tokens_per_word, engine, total) -> None:
        options = self.options
        rng = random.Random(options.limits.seed)
        began = time.monotonic()
        done = 0
        for round_no in range(1, options.rounds + 1):
            order = list(options.points)
            rng.shuffle(order)
            for place, point in enumerate(order, start=1):
                done += 1
                self.reporter.phase(f"tune [{done}/{total}] round {round_no}/{options.rounds}: {point.name}")
                self._reload(point.values())
                self._warm_up(target)
                at_start = engine.mark()

                def progress(finished: int, requests: int, started=time.monotonic()) -> None:
                    self.reporter.waiting(
                        f"tune [{done}/{total}] {point.name}: {finished}/{requests} requests",
                        time.monotonic() - started,
                        options.limits.seconds,
                    )

                stats = bench.bench_once(
                    target, workload, tokens_per_word, options.limits.seconds, progress, self.on_run
                )
                evidence = engine.evidence(at_start, point)
                self.outcome.runs.append(Measured(point, round_no, place, stats, evidence))
                left = (time.monotonic() - began) / done * (total - done)
                errors = sum(c.errors for c in stats.classes.values())
                self.reporter.phase(
                    f"tune [{done}/{total}] {point.name}: {stats.seconds:.1f} s, {errors} error(s); "
                    f"{evidence.line(point)}; about {left / 60:.1f} min left"
                )

    def _finish(self, server, workload, tokens_per_word, original: dict[str, str]) -> None:
        options = self.options
        verified: dict[Point, list[RunStats]] = {p: [] for p in options.points}
        for m in self.outcome.runs:
            if m.evidence.holds(m.point):
                verified[m.point].append(m.stats)
        if not any(verified.values()):
            raise DsparkError("tune: no round had its setting in force throughout (engine log); nothing recommended")
        rec = recommend(verified, options.favor)
        self.outcome.recommendation = rec
        self.outcome.data = self._data(server, workload, tokens_per_word, original, verified, rec)
        self.outcome.data["applied"] = False
        self._write_files(verified, rec, workload.names)
        if options.apply:
            self._apply(rec)
            self.outcome.data["applied"] = True
            self.outcome.files["json"].write_text(json.dumps(self.outcome.data, indent=2) + "\n")

    def _data(self, server, workload, tokens_per_word, original, verified, rec) -> dict:
        points = []
        for point in self.options.points:
            runs = [m for m in self.outcome.runs if m.point == point]
            good = verified[point]
            summary = {}
            for name in workload.names:
                summary[name] = {
                    metric: _spread_data([getattr(r.classes[name], metric) for r in good])
                    for metric in (
                        "ttft_mean_s",
                        "ttft_p90_s",
                        "itl_p50_s",
                        "itl_p99_s",
                        "itl_max_s",
                        "decode_tok_s_per_stream",
                        "decode_tok_s",
                        "errors",
                    )
                }
            summary["all"] = {
                metric: _spread_data([getattr(r.all, metric) for r in good])
                for metric in ("itl_p99_s", "decode_tok_s", "errors")
            }
            points.append(
                {
                    "point": point.key,
                    "name": point.name,
                    "values": point.values(),
                    "verified_rounds": len(good),
                    "rounds": [
                        {
                            "round": m.round,
                            "order": m.order,
                            "engine_log": m.evidence.to_data(point),
                            **m.stats.to_data(),
                        }
                        for m in runs
                    ],
                    "summary": summary,
                }
            )
        return {
            "schema": SCHEMA,
            "server": {"url": server.url, "model": server.served_name},
            "profile": vars(workload.profile),
            "tokens_per_word": round(tokens_per_word, 3),
            "classes": {
                c.name: {"lanes": c.lanes, "requests": len(c.requests), "what": c.what} for c in workload.classes
            },
            "rounds": self.options.rounds,
            "seed": self.options.limits.seed,
            "seconds_per_run": self.options.limits.seconds,
            "original": original,
            "points": points,
            "recommendation": rec.to_data(),
        }

    def _write_files(self, verified, rec, names) -> None:
        out = self.options.out_dir or (self.spec.state_dir / "tune" / time.strftime("%Y%m%d-%H%M%S"))
        out.mkdir(parents=True, exist_ok=True, mode=0o700)
        itl = {p: spread([r.all.itl_p99_s for r in runs]) for p, runs in verified.items()}
        ttft = {
            name: {p: spread([r.classes[name].ttft_mean_s for r in runs]) for p, runs in verified.items()}
            for name in names
        }
        title = f"dspark tune: {self.options.rounds} round(s); whiskers = range over rounds; --favor {rec.favor}"
        (out / "tune.svg").write_text(svg(list(self.options.points), itl, ttft, rec.point, title))
        (out / "tune.json").write_text(json.dumps(self.outcome.data, indent=2) + "\n")
        self.outcome.files = {"json": out / "tune.json", "svg": out / "tune.svg"}

    def _apply(self, rec: Recommendation) -> None:
        from dspark_launch.config.env_write import set_values, where_set

        path = self.settings.env_file
        changes = {
            name: (value, where_set(path, name, self.settings.source_of(name.lower())))
            for name, value in rec.point.values().items()
        }
        # the line numbers are those read when tune began: written only if the file is still what was read then
        set_values(path, changes, read_sha256=self.settings.env_file_sha256, note="set by dspark tune --apply")
        self.reporter.phase(f"tune: wrote {rec.point.name} into {path}; reloading")
        self._reload({})  # the env file as it is now
        self.outcome.applied = True

    def _restore(self, original: dict[str, str]) -> None:
        try:
            self._reload(original)
            self.outcome.restored = ", ".join(f"{k}={v}" for k, v in original.items())
            self.reporter.phase(f"tune: restored the live values in force before: {self.outcome.restored}")
        except DsparkError as error:
            self.outcome.restored = ""
            self.reporter.warn(
                f"tune: could not restore the live values in force before "
                f"({', '.join(f'{k}={v}' for k, v in original.items())}): {error}; "
                "`dspark reload` puts the env file's values back"
            )
            raise


def _spread_data(values: list) -> dict | None:
    s = spread([v for v in values if v is not None])
    return None if s is None else {"median": s.mid, "min": s.low, "max": s.high}


def table_rows(outcome: Outcome, names: list[str]) -> tuple[list[str], list[list[str]]]:
    """Rows for the table the CLI prints: a point a row, each class's mean first token, p99 ITL and decode rate
    of all streams (median over verified rounds, range in brackets), errors."""
    headers = ["point", "rounds", *[f"TTFT {n}" for n in names], "p99 ITL", "tok/s", "errors"]
    rows = []
    for entry in outcome.data.get("points", []):
        summary = entry["summary"]

        def cell(block: dict | None, ms: bool = True) -> str:
            if not block:
                return "-"
            f = (lambda v: f"{v * 1000:.0f}") if ms else (lambda v: f"{v:.1f}")
            mid = f(block["median"])
            return mid if block["min"] == block["max"] else f"{mid} ({f(block['min'])}-{f(block['max'])})"

        errors = sum(int((summary[n]["errors"] or {}).get("max", 0)) for n in names)
        mark = " *" if outcome.recommendation and entry["point"] == outcome.recommendation.point.key else ""
        rows.append(
            [
                entry["name"] + mark,
                f"{entry['verified_rounds']}/{len(entry['rounds'])}",
                *[cell(summary[n]["ttft_mean_s"]) for n in names],
                cell(summary["all"]["itl_p99_s"]),
                cell(summary["all"]["decode_tok_s"], ms=False),
                str(errors),
            ]
        )
    return headers, rows

"""`dspark model pull|verify|status`: the weights on every node (one line per node, or JSON)."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from typing import Annotated

import typer

from dspark_launch.cli.loading import settings_and_spec
from dspark_launch.cli.options import EnvFileOption, JsonOption
from dspark_launch.cli.output import emit_json, fail, say
from dspark_launch.cli.reporter import ConsoleReporter
from dspark_launch.cli.signals import interruptible
from dspark_launch.errors import EXIT_FAILED, DsparkError

app = typer.Typer(help="Model weights on every node: pull once, copy over the fabric, verify.", no_args_is_help=True)
GIB = 1 << 30


def _wanted(env_file):
    from dspark_launch.model.onnodes import require_mounted, wanted_model

    settings, spec = settings_and_spec(env_file)
    try:
        require_mounted(settings, spec)
    except DsparkError as error:
        raise fail(error) from None
    return wanted_model(settings), spec


def _report_line(node: str, report) -> str:
    if report.ok:
        how = f"sha256 of {report.bytes_checked / GIB:.2f} GiB" if report.full else "sizes and manifest stamp"
        return f"{node}: ok ({report.files_checked} files; {how})"
    first = report.problems[0].describe()
    more = f" and {len(report.problems) - 1} more" if len(report.problems) > 1 else ""
    return f"{node}: {first}{more}"


def _problem_rows(reports) -> list[dict]:
    return [
        {"node": node, "path": p.path, "kind": p.kind, "expected_size": p.expected_size, "actual_size": p.actual_size}
        for node, report in reports
        for p in report.problems
    ]


def _render_checks(wanted, reports, as_json: bool) -> None:
    problems = _problem_rows(reports)
    if as_json:
        emit_json(
            {
                "model": wanted.name,
                "revision": wanted.revision,
                "ok": not problems,
                "nodes": [
                    {
                        "node": node,
                        "ok": r.ok,
                        "full": r.full,
                        "files_checked": r.files_checked,
                        "bytes_checked": r.bytes_checked,
                        "folder": r.folder,
                    }
                    for node, r in reports
                ],
                "problems": problems,
            }
        )
    else:
        for node, report in reports:
            say(_report_line(node, report))
        for row in problems:
            say(f"  {row['node']}: {row['path']}: {row['kind']}")
    if problems:
        if not as_json:
            say("dspark: error: model weights not ready; run `dspark model pull`", file=sys.stderr)
        raise typer.Exit(EXIT_FAILED)


def _check(env_file, as_json: bool, full: bool) -> None:
    from dspark_launch.model.onnodes import check

    wanted, spec = _wanted(env_file)
    try:
        reports = check(wanted, spec, full, None if as_json else ConsoleReporter())
    except DsparkError as error:
        raise fail(error) from None
    _render_checks(wanted, reports, as_json)


@app.command()
def pull(
    env_file: EnvFileOption = None,
    as_json: JsonOption = False,
    verify: Annotated[
        bool, typer.Option("--verify", help="Hash every file on every node, even those unchanged since the last pull.")
    ] = False,
) -> None:
    """Pull the model once on the head (the profile's pinned revision), copy it to every worker, verify there.

    Free disk is checked on every node before the first byte; a rerun fetches only what is missing or bad, hashes only
    files changed since (size, mtime, inode) and verifies on a worker only what was sent."""
    from dspark_launch.model import onnodes

    wanted, spec = _wanted(env_file)
    reporter = ConsoleReporter(quiet=as_json)
    what = wanted.name + (f"@{wanted.revision}" if wanted.revision else "")
    reporter.phase(
        f"model {what}: checking free disk on {len(spec.nodes)} node(s), then "
        + ("placing the local folder" if wanted.local else f"pulling into {wanted.source.cache_dir}")
    )
    t0 = time.monotonic()
    with interruptible(
        lambda code: say(
            f"dspark: interrupted (exit {code}); run `dspark model pull` again to resume: complete files are kept",
            file=sys.stderr,
        )
    ):
        try:
            placement = onnodes.pull(
                wanted, spec, reporter, tqdm_class=_quiet_tqdm() if as_json else reporter_tqdm(reporter), verify=verify
            )
        except DsparkError as error:
            reporter.close()
            raise fail(error) from None
    reporter.close()
    seconds = time.monotonic() - t0
    if as_json:
        emit_json(
            {
                "model": wanted.name,
                "revision": placement.manifest.revision,
                "folder": placement.location.folder,
                "stamp": placement.manifest.stamp,
                "bytes": placement.manifest.total_size,
                "seconds": seconds,
                "hashed_bytes": placement.hashed_bytes,
                "disk": [asdict(d) for d in placement.disk],
                "refetched": list(placement.refetched),
                "workers": [asdict(w) for w in placement.workers],
            }
        )
        return
    say(
        f"head: {placement.manifest.revision[:12]} in {placement.location.folder}: "
        f"{len(placement.manifest.files)} files, {placement.manifest.total_size / GIB:.2f} GiB verified "
        f"({placement.hashed_bytes / GIB:.2f} GiB hashed now)"
        + (f" ({len(placement.refetched)} fetched again)" if placement.refetched else "")
    )
    for sync in placement.workers:
        sent = sync.copy.bytes_sent + (sync.repair.bytes_sent if sync.repair else 0)
        rate = sync.copy.bytes_sent / sync.copy.seconds / 1e6 if sync.copy.seconds else 0
        say(
            f"{sync.node}: copied {sent / GIB:.2f} GiB in {sync.copy.seconds:.1f} s ({rate:.0f} MB/s, "
            f"{sync.copy.streams} stream(s)), {sync.report.files_checked} files checked, "
            f"{sync.report.bytes_checked / GIB:.2f} GiB hashed there"
            + (f", {len(sync.repair.files_sent)} repaired" if sync.repair else "")
        )
    say(f"model ready on {1 + len(placement.workers)} node(s) in {seconds:.1f} s")


def reporter_tqdm(reporter: ConsoleReporter):
    """A tqdm class for huggingface_hub that draws nothing itself: the bytes written go to `reporter` (a Rich
    progress bar with rate and ETA on a terminal, a line a minute without one)."""
    import io

    from tqdm.std import tqdm

    class ToReporter(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            super().__init__(*args, **{**kwargs, "file": io.StringIO(), "disable": False})

        def update(self, n=1):
            shown = super().update(n)
            if self.unit == "B" and self.total and not str(self.desc).startswith("Downloading bytes"):
                reporter.measured("head: downloading the weights", self.n, self.total, "bytes")
            return shown

    return ToReporter


def _quiet_tqdm():
    from functools import partial

    from tqdm.auto import tqdm

    return partial(tqdm, disable=True)


@app.command()
def verify(env_file: EnvFileOption = None, as_json: JsonOption = False) -> None:
    """Every weight file on every node against the manifest (size and sha256); exit 1 naming node, file, kind."""
    _check(env_file, as_json, True)


@app.command()
def status(env_file: EnvFileOption = None, as_json: JsonOption = False) -> None:
    """The fast check on every node (manifest stamp and sizes: what `dspark start` runs by default)."""
    _check(env_file, as_json, False)

"""The options several commands share, declared once (each command's help shows the same words)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

EnvFileOption = Annotated[
    Optional[str],
    typer.Option(
        "--env-file",
        metavar="PATH",
        show_default=False,
        help="Env file to read (default: $DSPARK_ENV_FILE, else ./.env.dspark, else none: the built-in "
        "defaults and the environment; the example is read only when named).",
    ),
]
#: `--json` is always this switch: the command's answer as JSON on stdout (a file a command writes is `--out`).
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print the answer as JSON (status: schema in docs/cluster.md; "
        "plan: schema dspark-plan/1 in docs/operations.md).",
    ),
]
StrictOption = Annotated[bool, typer.Option("--strict", help="Treat configuration warnings as errors.")]

"""CLI: python -m tests.support.testbed [--state-dir D] [--nodes N] [--venv V] {up,down,status,exec NODE -- CMD...,env}"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Optional, Sequence

from tests.support.testbed.base import DEFAULT_PREFIX, DEFAULT_STATE_DIR, TestbedError
from tests.support.testbed.testbed import Testbed
from tests.support.testbed.testbed import __doc__ as TESTBED_DOC


def _stderr(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", default=argparse.SUPPRESS, help=f"state folder (default {DEFAULT_STATE_DIR})")
    common.add_argument("--nodes", type=int, default=argparse.SUPPRESS, help="node count for up (default 2)")
    common.add_argument("--venv", default=argparse.SUPPRESS, help="venv overlaid on every node")
    common.add_argument("--prefix", default=argparse.SUPPRESS, help=f"netns name prefix (default {DEFAULT_PREFIX})")
    ap = argparse.ArgumentParser(
        prog="python -m tests.support.testbed", description=TESTBED_DOC.split("\n\n")[0], parents=[common]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", parents=[common], help="build the nodes (idempotent)")
    p = sub.add_parser("down", parents=[common], help="kill everything in the nodes and remove them")
    p.add_argument("--keep-state", action="store_true", help="keep the state folder (logs)")
    sub.add_parser("status", parents=[common], help="JSON status")
    p = sub.add_parser("env", parents=[common], help="print DSPARK_TESTBED_* variables (sh syntax)")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("exec", parents=[common], help="run a command inside a node: exec NODE -- CMD...")
    p.add_argument("node")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    state_dir = getattr(args, "state_dir", None) or os.environ.get("DSPARK_TESTBED_STATE_DIR", DEFAULT_STATE_DIR)
    tb = Testbed(
        state_dir=state_dir,
        nodes=getattr(args, "nodes", 2),
        venv=getattr(args, "venv", None),
        prefix=getattr(args, "prefix", DEFAULT_PREFIX),
        log=_stderr,
    )
    try:
        if args.cmd == "up":
            tb.up()
            print(json.dumps(tb.status(), indent=2))
        elif args.cmd == "down":
            tb.down(keep_state=args.keep_state)
        elif args.cmd == "status":
            print(json.dumps(tb.status(), indent=2))
            return 0 if tb.is_up() else 1
        elif args.cmd == "env":
            env = tb.env()
            if args.json:
                print(json.dumps(env, indent=2))
            else:
                for k, v in env.items():
                    print(f"export {k}={shlex.quote(v)}")
        elif args.cmd == "exec":
            cmd = list(args.command)
            if cmd[:1] == ["--"]:
                cmd = cmd[1:]
            if not cmd:
                ap.error("exec NODE -- CMD...: no command given")
            full = tb._node_argv(args.node, cmd, None)
            os.execvp(full[0], full)
    except TestbedError as exc:
        _stderr(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

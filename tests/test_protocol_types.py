"""The agent protocol's types hold: each request names its answer type once for the type checker
(`Request[Answer]`), and that is the answer its registered operation decodes; mypy sees through
`NodeAgent.call` to that type and refuses a state or outcome outside its Literal."""

from __future__ import annotations

import sys
import typing

from mypy import api as mypy_api

from dspark_launch.agent import protocol as p
from tests.support.paths import REPO


def _declared_answer(request: type) -> type:
    (base,) = [b for b in request.__orig_bases__ if typing.get_origin(b) is p.Request]
    (answer,) = typing.get_args(base)
    return answer if isinstance(answer, type) else vars(sys.modules[request.__module__])[answer.__forward_arg__]


def test_every_request_declares_the_answer_its_operation_decodes():
    assert p.OPERATIONS, "no operations registered"
    for operation in p.OPERATIONS.values():
        assert issubclass(operation.request, p.Request), operation.request
        assert _declared_answer(operation.request) is operation.answer, operation.name


PROGRAM = """
from dspark_launch.agent import protocol as p
from dspark_launch.agent.client import NodeAgent
from dspark_launch.serve.http import Reply
from dspark_launch.serve.readiness import FirstAnswer
from dspark_launch.serve.status import ServerView

def use(agent: NodeAgent) -> None:
    reveal_type(agent.call(p.Probe()))
    reveal_type(agent.call(p.ModelFastCheck(folder="/m", stamp="")))
    agent.call(p.Hello()).no_such_field
    ServerView("sleeping")
    FirstAnswer("maybe", 1, Reply(0, ""), 0.0, 0.0)
    p.Progress("shout", "hi")
"""


def test_mypy_sees_each_answer_type_and_refuses_a_state_outside_its_literal(tmp_path, monkeypatch):
    program = tmp_path / "uses_the_protocol.py"
    program.write_text(PROGRAM)
    monkeypatch.chdir(REPO)  # finds dspark_launch as `make test`'s mypy does (its cache too)
    out, err, _ = mypy_api.run(["--no-error-summary", "--hide-error-context", str(program)])
    lines = out.splitlines()
    assert any('Revealed type is "dspark_launch.agent.messages.processes.ProbeAnswer"' in line for line in lines), (
        out + err
    )
    assert any('Revealed type is "dspark_launch.node.values.VerifyReport"' in line for line in lines), out + err
    assert any('"HelloAnswer" has no attribute "no_such_field"' in line for line in lines), out
    for bad in ("Literal['sleeping']", "Literal['maybe']", "Literal['shout']"):
        assert any(bad in line and "[arg-type]" in line for line in lines), (bad, out)

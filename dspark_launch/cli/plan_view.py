"""`dspark plan` as text: a short summary first (per node: what would run, refusals, warnings), then the details,
every line wrapped to the terminal's width."""

from __future__ import annotations

import shlex
import textwrap

from dspark_launch.serve.plan_report import Plan

GIB = 1 << 30


def _wrapped(text: str, width: int | None, indent: str, more: str = "    ") -> list[str]:
    """Prose wrapped at `width` (None: not wrapped), continuation lines indented further."""
    if width is None:
        return [indent + text]
    return textwrap.wrap(
        text, width=max(width, 40), initial_indent=indent, subsequent_indent=indent + more, break_on_hyphens=False
    ) or [indent]


def _words(argv: tuple[str, ...]) -> list[str]:
    """Shell words, an option kept with its value (`--max-model-len 65536`) unless the value is long (JSON)."""
    words: list[str] = []
    for arg in argv:
        quoted = shlex.quote(arg)
        if (
            words
            and words[-1].startswith("-")
            and " " not in words[-1]
            and not arg.startswith("-")
            and len(quoted) <= 40
        ):
            words[-1] += " " + quoted
        else:
            words.append(quoted)
    return words


def _command(argv: tuple[str, ...], width: int | None, indent: str) -> list[str]:
    """A command line wrapped between its words (None: one line), each line but the last ending in ` \\`: still
    pasteable into a shell. A word longer than the line (a JSON value) stays whole."""
    if width is None:
        return [f"{indent}run: {shlex.join(argv)}"]
    lines, current = [], indent + "run:"
    for word in _words(argv):
        if len(current) + 1 + len(word) + 2 > width and current != indent + "run:":
            lines.append(current + " \\")
            current = indent + "      " + word
        else:
            current += " " + word
    return [*lines, current]


# The modules `start` runs with the node's Python, by the name an operator knows them by.
PROGRAMS = {"ray.scripts.scripts": "ray", "dspark_launch.node.serve_entry": "vllm serve"}


def _program(argv: tuple[str, ...]) -> str:
    """`ray start`, `vllm serve`: the program an argv runs (`python -m MODULE` by the module) and its sub-command."""
    words = list(argv)
    if len(words) > 2 and words[1] == "-m":
        words = [PROGRAMS.get(words[2], words[2]), *words[3:]]
    name = words[0].rsplit("/", 1)[-1] if words else "?"
    return f"{name} {words[1]}" if len(words) > 1 and not words[1].startswith("-") and " " not in name else name


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def summary_lines(plan: Plan) -> list[str]:
    """Per node one line: its commands (name and argv length), refusals, warnings; then start's verdict."""
    lines = []
    for node in plan.nodes:
        if not node.probed:
            lines.append(f"  {node.node} ({node.address}): {node.status}")
            continue
        runs = ", ".join(f"{_program(argv)} ({len(argv)} args)" for argv in node.commands)
        lines.append(
            f"  {node.node} ({node.address}): {runs}; {_count(len(node.refusals), 'refusal')}, "
            f"{_count(len(node.warnings), 'warning')}"
        )
    if plan.refusals:
        lines.append(f"start would refuse ({_count(len(plan.refusals), 'reason')}; `dspark plan` exits 1):")
        lines += [f"  - {r}" for r in plan.refusals]
    else:
        lines.append("start would go ahead (`dspark plan` exits 0)")
    return lines


def render_plan(plan: Plan, width: int | None = None) -> str:
    """`width`: the terminal's (None, for a pipe: lines unwrapped, one per fact)."""
    head = (
        f"plan for {plan.env_file}{' (the example file)' if plan.from_example else ''}: profile {plan.profile}, "
        f"vLLM {plan.vllm_version} on the head; nothing started"
    )
    lines = _wrapped(head, width, "")
    judged = [f"judged for: {plan.judged_for}"] if plan.judged_for else []
    judged += [f"CUDA graphs vLLM will run: {plan.cuda_graph_mode}"] if plan.cuda_graph_mode else []
    judged += [plan.vllm_policy] if plan.vllm_policy else []
    for fact in judged:
        lines += _wrapped(fact, width, "")
    for index, fact in enumerate(plan.hotfix):  # the setting, then each probed node's check
        lines += _wrapped(f"check: {fact}" if index else fact, width, "  " if index else "")
    for line in summary_lines(plan):
        indent = line[: len(line) - len(line.lstrip())]
        lines += _wrapped(line.strip(), width, indent)
    lines.append("")
    lines.append("details:")
    lines.append("  decisions:")
    for d in plan.decisions or ():
        lines += _wrapped(d.line, width, "    ")
    if not plan.decisions:
        lines.append("    (none: DSPARK_PROFILE=none, the settings' flags only)")
    for node in plan.nodes:
        lines += _wrapped(f"{node.node} ({node.address}): {node.status}", width, "  ")
        for argv in node.commands:
            lines += _command(argv, width, "    ")
        origin = ""
        for entry in node.env:
            if entry.origin != origin:
                origin = entry.origin
                lines.append(f"    env ({origin}):")
            lines += _wrapped(f"{entry.name}={entry.value}" + ("  (secret)" if entry.secret else ""), width, "      ")
        for note in node.fabric_notes:
            lines += _wrapped(f"fabric: {note}", width, "    ")
        if node.memory is not None:
            lines += _wrapped(f"memory: {node.memory.line}", width, "    ")
            if node.memory.free_line:
                lines += _wrapped(f"free memory: {node.memory.free_line}", width, "    ")
    if plan.memory is not None:
        lines += _wrapped(f"memory estimate: {plan.memory.basis}", width, "  ")
        for note in plan.memory.notes:
            lines += _wrapped(f"note: {note}", width, "    ")
    for warning in plan.warnings:
        lines += _wrapped(f"warning: {warning}", width, "")
    return "\n".join(lines)

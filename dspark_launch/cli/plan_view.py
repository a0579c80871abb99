"""`dspark plan` as text: decisions, then per node what would run and with which environment."""

from __future__ import annotations

import shlex

from dspark_launch.serve.plan_report import Plan

GIB = 1 << 30


def render_plan(plan: Plan) -> str:
    lines = [f"plan for {plan.env_file}{' (the example file)' if plan.from_example else ''}: profile {plan.profile}, "
             f"vLLM {plan.vllm_version} on the head; nothing started",
             *([f"judged for: {plan.judged_for}"] if plan.judged_for else []),
             *([f"CUDA graphs vLLM will run: {plan.cuda_graph_mode}"] if plan.cuda_graph_mode else []),
             "decisions:"]
    lines += [f"  {d.line}" for d in plan.decisions] or ["  (none: DSPARK_PROFILE=none, the settings' flags only)"]
    for node in plan.nodes:
        lines.append(f"{node.node} ({node.address}): {node.status}")
        lines += [f"  run: {shlex.join(argv)}" for argv in node.commands]
        origin = ""
        for entry in node.env:
            if entry.origin != origin:
                origin = entry.origin
                lines.append(f"  env ({origin}):")
            lines.append(f"    {entry.name}={entry.value}" + ("  (secret)" if entry.secret else ""))
        lines += [f"  fabric: {note}" for note in node.fabric_notes]
        if node.memory is not None:
            lines.append(f"  memory: {node.memory.line}")
            if node.memory.free_line:
                lines.append(f"  free memory: {node.memory.free_line}")
    if plan.memory is not None:
        lines.append(f"memory estimate: {plan.memory.basis}")
        lines += [f"  note: {note}" for note in plan.memory.notes]
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)

"""One table of live settings (`hotfix.contract.LIVE_SETTINGS`): every copy the launcher and the patched
scheduler use is derived from it, and each is checked against it here: the knob declarations (and so the bash
registry and the example file), the injected parser's accepted range, the server's start environment, what
`reload` expects in force, and the live log line both ways."""

from __future__ import annotations

import dataclasses

import pytest

from dspark_launch.config.knobs import NumericKnobs, declared_knobs
from dspark_launch.config.levels import NATURE
from dspark_launch.hotfix import contract, injected
from dspark_launch.serve.reload import InForce
from tests.support.live_rows import live_row

SETTINGS = pytest.mark.parametrize("setting", contract.LIVE_SETTINGS, ids=[s.name for s in contract.LIVE_SETTINGS])


def _text(value) -> str:
    return str(int(value)) if isinstance(value, bool) else repr(value)


@SETTINGS
def test_the_knob_declaration_is_the_tables_row(setting):
    """A knob written by hand beside the table (the aging bound once widened to 100 in the launcher while the
    scheduler kept 64 and fell back to 2.0) fails here."""
    knob = next(k for k in declared_knobs() if k.name == setting.name)
    field = next(f for f in dataclasses.fields(NumericKnobs) if f.name == setting.name.lower())
    assert field.metadata[NATURE].level == "live"
    rule = field.metadata["knob"]
    assert (field.default, rule.minimum, rule.maximum) == (setting.default, setting.minimum, setting.maximum)
    assert knob.type == ("float" if setting.kind == "decimal" else "int")


@SETTINGS
def test_the_patched_scheduler_accepts_exactly_what_the_launcher_accepts(setting):
    """The launcher validates a knob against its declared bounds; the injected parser must take every value
    inside them as it is and none outside (a count clamps above its maximum, as the soft knob does)."""
    row = live_row(setting.name)
    parse = injected._dspark_hotfix_parse
    knob = next(k for k in declared_knobs() if k.name == setting.name)
    if setting.kind == "switch":
        assert parse(row, "1") == (True, False) and parse(row, "0") == (False, False)
        return
    low, high = float(knob.minimum), float(knob.maximum)
    step = 1 if setting.kind in ("count", "choice") else 0.5
    for inside in (low, high):
        raw = str(int(inside)) if step == 1 else f"{inside:g}"
        assert parse(row, raw) == (type(setting.default)(inside), False), raw
    above = str(int(high + step)) if step == 1 else f"{high + step:g}"
    if setting.kind == "count":
        assert parse(row, above) == (setting.maximum, False) and knob.range_policy == "soft"
    else:
        assert parse(row, above) == (setting.default, True)
        below = str(int(low - step)) if step == 1 else f"{low - step:g}"
        assert parse(row, below)[1] or low - step < 0 and setting.kind == "decimal"


def test_the_start_environment_and_reloads_expectation_come_from_the_table(monkeypatch):
    from dspark_launch.serve.serve_spec import live_environment

    settings = type("S", (), {s.name.lower(): s.default for s in contract.LIVE_SETTINGS})()
    env = live_environment(settings)
    assert set(env) == set(contract.LIVE_NAMES)
    expected = InForce.of(env)
    assert expected.values == {s.key: s.default for s in contract.LIVE_SETTINGS}


def test_the_live_line_round_trips_every_setting():
    values = {"cap": 2, "gate_mode": 1, "aging": 0.5, "diagnostics": True, "target_ms": 180.5, "admission_closed": True}
    assert set(values) == {s.key for s in contract.LIVE_SETTINGS}
    line = contract.parse_live_lines(contract.live_line(7, "cap 1 -> 2", values, 2560))[0]
    assert (line.patch_version, line.changes, line.values, line.step_bound) == (7, "cap 1 -> 2", values, 2560)
    assert (line.cap, line.gate_mode, line.aging, line.diagnostics) == (2, 1, 0.5, True)

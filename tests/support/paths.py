"""Where things are in the checkout."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REGISTRY_SH = REPO / "dspark-numeric-knobs.sh"
DATA = REPO / "tests" / "data"

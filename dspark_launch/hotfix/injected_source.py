"""The text of the injected helpers (`injected.py` below its body marker).

The standalone patch script replaces this module by the same text as a
literal (`tools.hotfix_bundle`), so the script needs no sibling file.
"""

from __future__ import annotations

import pathlib

BODY_MARKER = "# ---- INJECTED BODY (everything below goes into scheduler.py) ----\n"


def injected_body() -> str:
    text = pathlib.Path(__file__).with_name("injected.py").read_text(encoding="utf-8")
    return text.split(BODY_MARKER, 1)[1].strip("\n") + "\n"

"""The level and flag tables of the settings this launcher declares (config/levels.py derives them)."""

from __future__ import annotations

from dspark_launch.config.knobs import NumericKnobs
from dspark_launch.config.levels import Levels, declared_settings
from dspark_launch.config.text_settings import TextSettings

# In the order `Settings` holds them: the text settings, then the numeric knobs.
DECLARED: Levels = Levels.of(declared_settings(TextSettings, NumericKnobs))

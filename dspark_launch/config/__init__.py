"""Configuration: the knob registry, env files, validation and the frozen settings."""

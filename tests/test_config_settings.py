"""Resolving settings: precedence, env-file parsing, provenance, warnings and errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dspark_launch.config.checks import hidden_character
from dspark_launch.config.registry import load_registry
from dspark_launch.config.settings import resolve
from dspark_launch.errors import ConfigError


def write(tmp_path, text: str | bytes, name=".env.dspark"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    path.chmod(0o600)
    return path


def test_precedence_cli_environment_file_default(tmp_path, clean_environ):
    path = write(tmp_path, "VLLM_PORT=9000\nMAX_NUM_SEQS=8\nRAY_PORT=7000\n")
    environ = {**clean_environ, "VLLM_PORT": "9100", "MAX_NUM_SEQS": "8"}
    s = resolve(env_file=str(path), environ=environ, cli={"VLLM_PORT": ("9200", "--port")})
    assert (str(s.vllm_port), s.entries["VLLM_PORT"].source) == ("9200", "CLI --port")
    assert str(s.max_num_seqs) == "8" and s.entries["MAX_NUM_SEQS"].source == "environment"
    assert str(s.ray_port) == "7000" and s.entries["RAY_PORT"].source == f"{path}:3"
    assert str(s.max_num_batched_tokens) == "8192" and s.entries["MAX_NUM_BATCHED_TOKENS"].source == "default"


def test_environment_overriding_the_file_warns_once(tmp_path, clean_environ):
    path = write(tmp_path, "VLLM_PORT=9000\nMAX_NUM_SEQS=8\n")
    s = resolve(env_file=str(path), environ={**clean_environ, "VLLM_PORT": "9100", "MAX_NUM_SEQS": "008"})
    overrides = [w for w in s.warnings if "overrides" in w]
    assert overrides == [f"VLLM_PORT from the environment overrides {path}:1 (9000 -> 9100)"]


def test_bom_crlf_quotes_and_export(tmp_path, clean_environ):
    path = write(
        tmp_path,
        b'\xef\xbb\xbfexport VLLM_PORT=9001\r\nMAX_NUM_SEQS="7"\r\n'
        b"DSPARK_SERVED_MODEL_NAME='tiny'\r\n# comment\r\nDSPARK_MAX_INFLIGHT_PREFILLS= 2 \r\n",
    )
    s = resolve(env_file=str(path), environ=clean_environ)
    assert (str(s.vllm_port), str(s.max_num_seqs), s.dspark_served_model_name) == ("9001", "7", "tiny")
    assert str(s.dspark_max_inflight_prefills) == "2"
    assert s.entries["DSPARK_MAX_INFLIGHT_PREFILLS"].source == f"{path}:5"


def test_env_file_is_never_executed(tmp_path, clean_environ):
    marker = tmp_path / "pwned"
    path = write(tmp_path, f"DSPARK_MODEL=$(touch {marker})\nVLLM_EXTRA_ARGS=--chat-template `touch {marker}`\n")
    s = resolve(env_file=str(path), environ=clean_environ)
    assert not marker.exists()
    assert s.dspark_model == f"$(touch {marker})"


def test_error_names_variable_value_file_line_and_allowed(tmp_path, clean_environ):
    path = write(tmp_path, "# knobs\nMAX_NUM_SEQS=8\nDSPARK_MAX_INFLIGHT_PREFILLS=2.0\n")
    with pytest.raises(ConfigError) as err:
        resolve(env_file=str(path), environ=clean_environ)
    message = str(err.value)
    assert "\n" not in message
    assert "DSPARK_MAX_INFLIGHT_PREFILLS=2.0" in message and f"{path}:3" in message and "1..3" in message
    assert err.value.exit_code == 2


def test_cap_clamped_and_defaulted_with_notes(tmp_path, clean_environ):
    s = resolve(env_file=str(write(tmp_path, "DSPARK_MAX_INFLIGHT_PREFILLS=64\n")), environ=clean_environ)
    assert str(s.dspark_max_inflight_prefills) == "3"
    assert "clamped" in s.entries["DSPARK_MAX_INFLIGHT_PREFILLS"].notes
    assert any("caps it at 3" in w for w in s.warnings)
    s = resolve(env_file=str(write(tmp_path, "DSPARK_MAX_INFLIGHT_PREFILLS=-1\n")), environ=clean_environ)
    assert str(s.dspark_max_inflight_prefills) == "1"
    assert any("using the default 1" in w for w in s.warnings)


def test_alias_in_file_and_conflict(tmp_path, clean_environ):
    s = resolve(env_file=str(write(tmp_path, "DSPARKMAXINFLIGHTPREFILLS=2\n")), environ=clean_environ)
    assert str(s.dspark_max_inflight_prefills) == "2"
    assert "alias DSPARKMAXINFLIGHTPREFILLS used" in s.entries["DSPARK_MAX_INFLIGHT_PREFILLS"].notes
    assert any("spell it DSPARK_MAX_INFLIGHT_PREFILLS" in w for w in s.warnings)
    path = write(tmp_path, "DSPARKMAXINFLIGHTPREFILLS=2\nDSPARK_MAX_INFLIGHT_PREFILLS=3\n")
    with pytest.raises(ConfigError, match="disagree; set only DSPARK_MAX_INFLIGHT_PREFILLS"):
        resolve(env_file=str(path), environ=clean_environ)


def test_unknown_keys_get_did_you_mean(tmp_path, clean_environ):
    path = write(tmp_path, "DSPARK_MAX_INFLIGHT_PREFILL=2\nMAX_NUM_SEQ=4\nUNRELATED=1\n")
    s = resolve(env_file=str(path), environ={**clean_environ, "DSPARK_HEADIP": "1.2.3.4"})
    text = "\n".join(s.warnings)
    assert "DSPARK_MAX_INFLIGHT_PREFILL" in text and "did you mean DSPARK_MAX_INFLIGHT_PREFILLS?" in text
    assert "did you mean MAX_NUM_SEQS?" in text
    assert "did you mean DSPARK_HEAD_IP?" in text
    assert "UNRELATED" not in text


def test_secrets_never_shown(tmp_path, clean_environ):
    path = write(tmp_path, "VLLM_API_KEY=sk-very-secret\n")
    s = resolve(env_file=str(path), environ=clean_environ)
    assert s.entries["VLLM_API_KEY"].shown == "set" and s.entries["DSPARK_API_KEYS"].shown == "unset"
    assert "sk-very-secret" not in repr(s.public_values()) and "sk-very-secret" not in "".join(s.warnings)
    bad = write(tmp_path, "VLLM_API_KEY=sk-hidden\\value\n")
    with pytest.raises(ConfigError) as err:
        resolve(env_file=str(bad), environ=clean_environ)
    assert "sk-hidden" not in str(err.value) and "<redacted>" in str(err.value)


def test_secret_file_readable_by_others_warns(tmp_path, clean_environ):
    path = write(tmp_path, "VLLM_API_KEY=sk-x\n")
    assert not any("chmod 600" in w for w in resolve(env_file=str(path), environ=clean_environ).warnings)
    path.chmod(0o644)
    assert any(f"chmod 600 {path}" in w for w in resolve(env_file=str(path), environ=clean_environ).warnings)


def test_cross_knob_checks(tmp_path, clean_environ):
    s = resolve(env_file=str(write(tmp_path, "LONG_PREFILL_TOKEN_THRESHOLD=0\n")), environ=clean_environ)
    assert any("starve decode" in w for w in s.warnings)
    s = resolve(env_file=str(write(tmp_path, "LONG_PREFILL_TOKEN_THRESHOLD=9000\n")), environ=clean_environ)
    assert any("starve decode" in w for w in s.warnings)
    s = resolve(env_file=str(write(tmp_path, "LONG_PREFILL_TOKEN_THRESHOLD=1024\n")), environ=clean_environ)
    assert not any("starve decode" in w for w in s.warnings)
    for text, fragment in (
        ("VLLM_PORT=7000\nRAY_PORT=7000\n", "collides with RAY_PORT"),
        ("MAX_NUM_SEQS=64\nMAX_NUM_BATCHED_TOKENS=32\n", "below MAX_NUM_SEQS"),
        ("VLLM_API_KEY=a\nDSPARK_API_KEYS=b c\n", "both set"),
        ("DSPARK_WORKER_HOSTS=a b\nDSPARK_WORKER_IPS=10.0.0.2\n", "one fabric IP per worker"),
    ):
        with pytest.raises(ConfigError, match=fragment):
            resolve(env_file=str(write(tmp_path, text)), environ=clean_environ)


def test_env_file_choice(tmp_path, clean_environ):
    explicit = write(tmp_path, "VLLM_PORT=9001\n", "a.env")
    other = write(tmp_path, "VLLM_PORT=9002\n", "b.env")
    write(tmp_path, "VLLM_PORT=9003\n")
    environ = {**clean_environ, "DSPARK_ENV_FILE": str(other)}
    assert resolve(env_file=str(explicit), environ=environ, cwd=tmp_path).vllm_port == 9001
    assert resolve(environ=environ, cwd=tmp_path).vllm_port == 9002
    s = resolve(environ=clean_environ, cwd=tmp_path)
    assert str(s.vllm_port) == "9003" and not s.from_example
    empty = tmp_path / "empty"
    empty.mkdir()
    write(empty, "VLLM_PORT=9004\n", ".env.dspark.example")  # a template, never read from the working directory
    s = resolve(environ=clean_environ, cwd=empty)
    assert s.env_file is None and not s.from_example and str(s.vllm_port) == "8888"
    assert any(w.startswith("no env file") and "built-in defaults" in w for w in s.warnings)
    with pytest.raises(ConfigError, match="no such file"):
        resolve(env_file=str(tmp_path / "missing"), environ=clean_environ)


_LINE = st.one_of(
    st.tuples(
        st.sampled_from(
            [k.name for k in load_registry().knobs]
            + [
                "DSPARKMAXINFLIGHTPREFILLS",
                "VLLM_HOST",
                "RAY_AUTH_MODE",
                "VLLM_API_KEY",
                "DSPARK_WORKER_IPS",
                "DSPARK_NOPE",
                "DSPARK_API_KEYS",
                "RAY_AUTH_TOKEN",
                "DSPARK_MODEL",
                "DSPARK_SSH_USER",
                "DSPARK_SSH_OPTIONS",
                "VLLM_EXTRA_ARGS",
                "DSPARK_FORWARD_ENV",
                "DSPARK_TRUSTED_NETWORK",
            ]
        ),
        st.text(alphabet=" \t+-.0123456789abx\u0663'\"\\$#=\x00\x1b\u00a0\u00e9\u2003\u2028", max_size=10),
    ).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.text(max_size=20),
)


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_LINE, max_size=8), crlf=st.booleans(), bom=st.booleans())
def test_random_env_files_give_settings_or_a_clean_config_error(tmp_path, clean_environ, lines, crlf, bom):
    text = ("\r\n" if crlf else "\n").join(lines)
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8", "surrogatepass")
    path = tmp_path / "random.env"
    path.write_bytes(data)
    try:
        s = resolve(env_file=str(path), environ=clean_environ)
    except ConfigError as error:
        assert "\n" not in str(error) and str(error)
        return
    cap = int(str(s.dspark_max_inflight_prefills))
    assert 1 <= cap <= 3


# Values `config check` once accepted that failed later with a traceback (issue 14, point 9).
BAD_TEXT_VALUES = [
    ("DSPARK_MODEL", "/models/a\x00b"),
    ("DSPARK_MODEL", "deepseek\x1b[31m"),
    ("DSPARK_MODEL", "a\u2028b"),
    ("DSPARK_MODEL", "--host=0.0.0.0"),
    ("DSPARK_STATE_DIR", "/srv/state\x00"),
    ("DSPARK_STATE_DIR", "/srv/a\nb"),
    ("DSPARK_SSH_KEY", "/k\x7f"),
    ("DSPARK_SSH_KEY", "/k\tx"),
    ("DSPARK_WORKER_PYTHON", "/usr/bin/python3\r\nid"),
    ("DSPARK_SSH_USER", "ro\x00ot"),
    ("DSPARK_SSH_USER", "-oProxyCommand=id"),
    ("DSPARK_SSH_USER", "r\u00f6ot"),
    ("DSPARK_WORKER_HOSTS", "host\x00b"),
    ("DSPARK_HEAD_IP", "10.0.0.1\x00"),
    ("DSPARK_MODEL_REVISION", "main\x00"),
    ("DSPARK_MODEL_REVISION", "-x"),
    ("DSPARK_SERVED_MODEL_NAME", "-tiny"),
    ("DSPARK_SERVED_MODEL_NAME", "ti\u200bny"),
    ("VLLM_API_KEY", "sk-\u00e9t\u00e9"),
    ("VLLM_API_KEY", "sk-\u20ac"),
    ("VLLM_API_KEY", "sk\x00x"),
    ("VLLM_API_KEY", "sk\u200bx"),
    ("VLLM_API_KEY", "sk\u00a0x"),
    ("DSPARK_API_KEYS", "sk-aaaa\u00a0sk-bbbb"),
    ("DSPARK_API_KEYS", "sk-aaaa\u3000sk-bbbb"),
    ("DSPARK_API_KEYS", "sk-aaaa\u2003sk-bbbb"),
    ("DSPARK_API_KEYS", "sk-a\x0bsk-b"),
    ("DSPARK_API_KEYS", "sk-\u00e9 sk-b"),
    ("RAY_AUTH_TOKEN", "x"),
    ("RAY_AUTH_TOKEN", "0123456789abcdef0123456789abcde"),
    ("RAY_AUTH_TOKEN", "t" * 31 + "\u00e9"),
    ("RAY_AUTH_TOKEN", "t" * 20 + " " + "t" * 20),
    ("RAY_AUTH_TOKEN", "t" * 40 + "\x00"),
    ("DSPARK_SSH_OPTIONS", "-o UserKnownHostsFile=/kh\x00"),
    ("VLLM_EXTRA_ARGS", "--enforce-eager\x00"),
    ("DSPARK_FORWARD_ENV", "NCCL_DEBUG\x00"),
    ("NCCL_IB_HCA", "rocep1s0f1\x1b"),
]


@pytest.mark.parametrize("name,value", BAD_TEXT_VALUES, ids=repr)
def test_bad_text_values_are_one_clean_line(tmp_path, clean_environ, name, value):
    for environ, env_file in (
        ({**clean_environ, name: value}, "/dev/null"),
        (clean_environ, str(write(tmp_path, f'{name}="{value}"\n'.encode("utf-8")))),
    ):
        if "\x00" in value and environ is not clean_environ:
            continue  # an environment cannot hold NUL; the env file can
        with pytest.raises(ConfigError) as err:
            resolve(env_file=env_file, environ=environ)
        message = str(err.value)
        assert err.value.exit_code == 2 and message.isprintable() and name in message and "allowed:" in message
        if name in ("VLLM_API_KEY", "DSPARK_API_KEYS", "RAY_AUTH_TOKEN"):
            assert "<redacted>" in message and (len(value) < 4 or value.strip() not in message)


def test_accepted_keys_fit_an_http_header_and_split_only_on_ascii_whitespace(clean_environ):
    s = resolve(env_file="/dev/null", environ={**clean_environ, "DSPARK_API_KEYS": " sk-a\tsk-b  sk-c "})
    assert s.dspark_api_keys == "sk-a sk-b sk-c"
    token = "A1b2" * 8
    assert resolve(env_file="/dev/null", environ={**clean_environ, "RAY_AUTH_TOKEN": token}).ray_auth_token == token


def test_env_file_that_is_not_a_regular_file(tmp_path, clean_environ):
    s = resolve(env_file="/dev/null", environ=clean_environ)
    assert s.env_file == Path("/dev/null") and not s.from_example and str(s.vllm_port) == "8888"
    with pytest.raises(ConfigError, match="a directory, not a regular file"):
        resolve(env_file=str(tmp_path), environ=clean_environ)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="a FIFO, not a regular file"):
        resolve(env_file=str(fifo), environ=clean_environ)
    with pytest.raises(ConfigError, match="DSPARK_ENV_FILE=.*a directory"):
        resolve(environ={**clean_environ, "DSPARK_ENV_FILE": str(tmp_path)})


_TEXT_NAMES = [
    "DSPARK_MODEL",
    "DSPARK_STATE_DIR",
    "DSPARK_SSH_USER",
    "DSPARK_SSH_KEY",
    "VLLM_API_KEY",
    "DSPARK_API_KEYS",
    "RAY_AUTH_TOKEN",
    "DSPARK_SSH_OPTIONS",
    "VLLM_EXTRA_ARGS",
    "DSPARK_FORWARD_ENV",
    "VLLM_HOST",
    "DSPARK_WORKER_HOSTS",
    "DSPARK_SERVED_MODEL_NAME",
]
_ODD_TEXT = st.lists(
    st.sampled_from(
        list("ab-=/ .\t\x00\x01\x1b\x7f\x85\u00a0\u00e9\u2003\u2028\u200b\u3000\u20ac")
        + ["-A", "--host", "-oProxyCommand=x", "LD_PRELOAD", "0.0.0.0", "x" * 32]
    ),
    max_size=12,
).map("".join)


@hsettings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(_TEXT_NAMES), value=_ODD_TEXT)
def test_random_text_values_give_usable_settings_or_a_clean_config_error(clean_environ, name, value):
    environ = {**clean_environ, name: value.replace("\x00", "")}
    try:
        s = resolve(env_file="/dev/null", environ=environ)
    except ConfigError as error:
        assert str(error).isprintable() and "allowed:" in str(error)
        return
    for key in [s.vllm_api_key, *s.dspark_api_keys.split(), s.ray_auth_token]:
        f"Bearer {key}".encode("ascii")
    for entry in s.entries.values():
        assert hidden_character(entry.value) is None, entry

"""Settings that would weaken the cluster are exit 2 at `config check`.

ssh options outside the allowlist (point 3), secret and loader names in DSPARK_FORWARD_ENV
(point 4), launcher-owned flags in VLLM_EXTRA_ARGS and an API opened without a key (point 5).
The ssh checks run the real ssh (`ssh -G` prints the options it would use, connecting nowhere)
and the flag checks vLLM's real parser, so the tables are checked against what those programs do.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dspark_launch.cluster.spec import cluster_spec
from dspark_launch.config.serve_flags import LAUNCHER_FLAGS, SECRET_FLAGS, check_extra_args
from dspark_launch.config.settings import resolve
from dspark_launch.errors import ConfigError
from tests.support.launcher_env import run_dspark
from tests.support.vllm_parser import PARSER_PREAMBLE

CLUSTER = {"DSPARK_HEAD_IP": "10.213.9.1", "DSPARK_WORKER_HOSTS": "root@10.213.9.2", "DSPARK_FABRIC_IFNAME": "lo"}


def settings_with(clean_environ, **values):
    return resolve(env_file="/dev/null", environ={**clean_environ, **values})


def refusal(clean_environ, **values) -> str:
    with pytest.raises(ConfigError) as err:
        settings_with(clean_environ, **values)
    message = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in message and "allowed:" in message
    return message


# --------------------------------------------------------------------------- point 3: ssh options

ALLOWED_SSH = {
    "-o UserKnownHostsFile=/srv/kh": ("-o", "UserKnownHostsFile=/srv/kh"),
    "-oUserKnownHostsFile=/srv/kh": ("-o", "UserKnownHostsFile=/srv/kh"),
    "-i /k2": ("-o", "IdentityFile=/k2"),
    "-i/k2 -J ops@jump:2222": ("-o", "IdentityFile=/k2", "-o", "ProxyJump=ops@jump:2222"),
    "-o 'ProxyJump a,b' -o serveraliveinterval=15": ("-o", "ProxyJump=a,b", "-o", "ServerAliveInterval=15"),
    "-o CertificateFile=~/.ssh/id-cert.pub -o ConnectionAttempts=3 -o ServerAliveCountMax=2": (
        "-o",
        "CertificateFile=~/.ssh/id-cert.pub",
        "-o",
        "ConnectionAttempts=3",
        "-o",
        "ServerAliveCountMax=2",
    ),
}
REFUSED_SSH = {
    "-A": "agent",
    "-Ai /k": "agent",
    "-o ForwardAgent=yes": "agent",
    "-oProxyCommand=nc %h %p": "local command",
    "-o 'ProxyCommand sh -c id'": "local command",
    "-oLocalCommand=id": "local command",
    "-o PermitLocalCommand=yes": "LocalCommand",
    "-o KnownHostsCommand=/bin/id": "local command",
    "-F /tmp/cfg": "another ssh config",
    "-o StrictHostKeyChecking=no": "DSPARK_SSH_HOST_KEY_CHECK",
    "-p 2222": "SSH_PORT",
    "-o Port=2222": "SSH_PORT",
    "-o ConnectTimeout=3": "SSH_CONNECT_TIMEOUT_S",
    "-l admin": "DSPARK_SSH_USER",
    "-o User=admin": "DSPARK_SSH_USER",
    "-o UserKnownHostsFile=/dev/null": "trusts any host key",
    "-o UserKnownHostsFile=none": "trusts any host key",
    "-L 8000:127.0.0.1:8000": "not an allowed",
    "-R 9:a:9": "not an allowed",
    "-D 1080": "not an allowed",
    "-W host:22": "not an allowed",
    "-o ClearAllForwardings=no": "not an allowed",
    "-o": "no value",
    "-o IdentityFile='/a b'": "without spaces",
    "-J -oProxyCommand=x": "[user@]host",
    "worker1": "not an allowed",
    "-o ServerAliveInterval=1e3": "whole number",
    "--": "not an allowed",
}


@pytest.mark.parametrize("value", sorted(ALLOWED_SSH), ids=repr)
def test_allowed_ssh_options_become_keyword_value_pairs(clean_environ, value):
    assert settings_with(clean_environ, DSPARK_SSH_OPTIONS=value).dspark_ssh_options == ALLOWED_SSH[value]


@pytest.mark.parametrize("value", sorted(REFUSED_SSH), ids=repr)
def test_refused_ssh_options(clean_environ, value):
    message = refusal(clean_environ, DSPARK_SSH_OPTIONS=value)
    assert message.startswith("DSPARK_SSH_OPTIONS from environment ") and REFUSED_SSH[value] in message


def _effective_ssh_config(argv: list[str]) -> dict[str, str]:
    """What the real ssh would use for `argv` (`ssh -G`: prints the options, connects nowhere)."""
    proc = subprocess.run([argv[0], "-G", "-F", "none", *argv[1:]], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


def test_ssh_sees_the_checked_options_and_the_launchers_own_first(clean_environ):
    """The worker's ssh argv (built by the cluster layer from the settings) as the real ssh reads it."""
    settings = settings_with(
        clean_environ,
        **CLUSTER,
        SSH_PORT="2200",
        SSH_CONNECT_TIMEOUT_S="7",
        DSPARK_SSH_OPTIONS="-i /k2 -J ops@jump:2222 -o UserKnownHostsFile=/srv/kh",
    )
    config = _effective_ssh_config(cluster_spec(settings).workers[0].transport.argv())
    assert (config["port"], config["connecttimeout"], config["forwardagent"]) == ("2200", "7", "no")
    assert (config["identityfile"], config["proxyjump"], config["userknownhostsfile"]) == (
        "/k2",
        "ops@jump:2222",
        "/srv/kh",
    )


def test_refused_ssh_options_would_take_effect_in_ssh():
    """Why they are refused: ssh honours them (agent forwarding on, a later port ignored or winning)."""
    config = _effective_ssh_config(
        [
            "ssh",
            "-o",
            "ForwardAgent=no",
            "-A",
            "-o",
            "ConnectTimeout=7",
            "-o",
            "ConnectTimeout=3",
            "-o",
            "ProxyCommand=nc %h %p",
            "--",
            "h",
        ]
    )
    assert (config["forwardagent"], config["connecttimeout"], config["proxycommand"]) == ("yes", "7", "nc %h %p")


# --------------------------------------------------------------------------- point 4: DSPARK_FORWARD_ENV

REFUSED_NAMES = (
    "VLLM_API_KEY",
    "DSPARK_API_KEYS",
    "RAY_AUTH_TOKEN",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "OPENAI_API_KEY",
    "my_password",
    "DB_PASSWD",
    "GITHUB_PAT_SECRET",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AZURE_CLIENT_ID",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "SSH_AUTH_SOCK",
    "KRB5CCNAME",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "DYLD_INSERT_LIBRARIES",
    "GLIBC_TUNABLES",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "PYTHONWARNINGS",
    "PYTHONBREAKPOINT",
    "BASH_ENV",
    "ENV",
    "PATH",
    "BASH_FUNC_x%%",
    "PS4",
    "NODE_OPTIONS",
    "PERL5OPT",
    "RAY_RUNTIME_ENV_HOOK",
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "VLLM_HOST_IP",
    "HF_HOME",
    "HF_HUB_CACHE",
    "VLLM_CACHE_ROOT",
    "TRITON_CACHE_DIR",
    "NCCL_NET_PLUGIN",
    "NCCL_IB_HCA",
)
ALLOWED_NAMES = (
    "NCCL_DEBUG",
    "CUDA_VISIBLE_DEVICES",
    "MALLOC_ARENA_MAX",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_RPC_BASE_PATH",
    "DSPARK_TEST_RAY_CPU_PLATFORM",
    "TZ",
)


@pytest.mark.parametrize("name", REFUSED_NAMES)
def test_forward_env_refuses_secrets_and_loader_names(clean_environ, name):
    if not name.replace("_", "").isalnum():
        message = refusal(clean_environ, DSPARK_FORWARD_ENV=name)  # not even a variable name
        assert "environment variable names" in message
        return
    message = refusal(clean_environ, DSPARK_FORWARD_ENV=f"NCCL_DEBUG {name}")
    assert f"names {name}:" in message


def test_forward_env_keeps_harmless_names(clean_environ):
    settings = settings_with(clean_environ, DSPARK_FORWARD_ENV=",".join(ALLOWED_NAMES))
    assert settings.dspark_forward_env.split() == list(ALLOWED_NAMES)


# --------------------------------------------------------------------------- point 5: VLLM_EXTRA_ARGS


def _spellings_of(flag) -> list[list[str]]:
    """Every way vLLM's parser reaches `flag`: both value forms, underscores, a prefix, short forms."""
    forms = []
    for spelling in flag.spellings:
        forms += [[spelling, "1"], [f"{spelling}=1"]]
        if spelling.startswith("--"):
            forms += [[spelling.replace("-", "_").replace("__", "--", 1), "1"], [spelling[:-1], "1"]]
        elif len(spelling) == 2:
            forms.append([f"{spelling}1"])
        else:
            forms.append([spelling[:2], "1"])
    return forms


OWNED_FORMS = [(flag, words) for flag in LAUNCHER_FLAGS for words in _spellings_of(flag)]


@pytest.mark.parametrize("flag,words", OWNED_FORMS, ids=[" ".join(w) for _, w in OWNED_FORMS])
def test_launcher_flags_in_extra_args_are_refused_naming_the_setting(clean_environ, flag, words):
    message = refusal(clean_environ, VLLM_EXTRA_ARGS=" ".join(["--enforce-eager", *words]))
    assert "which the launcher sets" in message
    assert (f"set {flag.setting} instead" in message) if flag.setting else (flag.why in message)


def test_api_key_value_in_extra_args_is_never_shown(tmp_path, clean_environ):
    for value in ("--api-key sk-LEAKED-123", "--api_key=sk-LEAKED-123", "--api sk-LEAKED-123"):
        message = refusal(clean_environ, VLLM_EXTRA_ARGS=value)
        assert "sk-LEAKED" not in message and "VLLM_API_KEY or DSPARK_API_KEYS" in message
    for value in ("--api-key 'sk-LEAKED-123", "--enforce-eager --api-key sk-LEAKED-123\x1b"):
        assert "sk-LEAKED" not in refusal(clean_environ, VLLM_EXTRA_ARGS=value)  # unbalanced quote, control char
    proc = run_dspark(["config", "check", "--env-file", "/dev/null"], env={"VLLM_EXTRA_ARGS": "--api-key=sk-LEAKED-1"})
    assert proc.returncode == 2 and "sk-LEAKED" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    overridden = tmp_path / "x.env"
    overridden.write_text("VLLM_EXTRA_ARGS=--api-key sk-LEAKED-2\n")
    overridden.chmod(0o600)
    proc = run_dspark(["config", "check", "--env-file", str(overridden)], env={"VLLM_EXTRA_ARGS": "--enforce-eager"})
    assert proc.returncode == 0 and "overrides" in proc.stderr and "sk-LEAKED" not in proc.stdout + proc.stderr


def test_positional_model_and_harmless_flags(clean_environ):
    assert "positional" in refusal(clean_environ, VLLM_EXTRA_ARGS="other/model --enforce-eager")
    harmless = "--enforce-eager --trust-remote-code --tokenizer-mode auto -q fp8 --max-num-partial-prefills 2"
    assert settings_with(clean_environ, VLLM_EXTRA_ARGS=harmless).entries["VLLM_EXTRA_ARGS"].value == harmless


# The table's spellings of another release than the installed 0.32: 0.33 lists a switch's negative as
# --disable-X (--no-enable-X up to 0.32, still parsed by 0.33); 0.34 turns the access log back on with
# --enable-uvicorn-access-log (tests/test_forged_log_lines.py asks 0.34's parser).
OTHER_RELEASE_SPELLINGS = {"--disable-prefix-caching", "--disable-chunked-prefill", "--enable-uvicorn-access-log"}

_PARSE = (
    PARSER_PREAMBLE
    + r"""
dests = {o: a.dest for a in parser._actions for o in a.option_strings}
base = vars(parser.parse_args(["m"]))
out = []
for words in json.loads(sys.stdin.read()):
    try:
        got = vars(parser.parse_args(["m", *words]))
        out.append(sorted(k for k in got if got[k] != base.get(k)))
    except BaseException:
        out.append(None)
print("RESULT " + json.dumps({"changed": out, "dests": dests}))
"""
)


def test_the_table_covers_what_vllms_parser_reads():
    """vLLM's own parser: every refused form changes the flag it names (or is refused by vLLM too),
    and the harmless flags change no launcher-owned destination."""
    harmless = [
        ["--enforce-eager"],
        ["--trust-remote-code"],
        ["-q", "fp8"],
        ["-dp", "1"],
        ["--tokenizer-mode", "auto"],
        ["--enable-log-requests"],
    ]
    words = [w for _, w in OWNED_FORMS] + harmless
    proc = subprocess.run(
        [sys.executable, "-c", _PARSE], input=json.dumps(words), capture_output=True, text=True, timeout=300
    )
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[7:])
    dests = result["dests"]
    owned_dests = {dests[s] for flag in LAUNCHER_FLAGS + SECRET_FLAGS for s in flag.spellings if s in dests}
    unknown = {s for flag in LAUNCHER_FLAGS for s in flag.spellings} - set(dests)
    assert unknown <= OTHER_RELEASE_SPELLINGS, f"table flags vLLM does not know: {sorted(unknown)}"
    reached = 0
    for (flag, form), changed in zip(OWNED_FORMS, result["changed"]):
        if changed is not None and changed:
            assert set(changed) & {dests[s] for s in flag.spellings if s in dests}, (form, changed)
            reached += 1
    print(f"vLLM acted on {reached} of {len(OWNED_FORMS)} refused forms")
    assert reached >= len(LAUNCHER_FLAGS)
    for form, changed in zip(harmless, result["changed"][len(OWNED_FORMS) :]):
        assert changed is not None and not set(changed) & owned_dests, (form, changed)
    # Every option vLLM knows, spelled exactly: refused if and only if it sets a launcher-owned destination.
    for option, dest in dests.items():
        refused = _is_refused([option, "1"] if option != "-h" else ["--enforce-eager", option])
        assert refused == (dest in owned_dests), (option, dest)


def _is_refused(words: list[str]) -> bool:
    try:
        check_extra_args(words)
    except ValueError:
        return True
    return False


# --------------------------------------------------------------------------- point 5: API exposure


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.213.9.1", "192.168.1.20"])
def test_api_beyond_loopback_needs_a_key_or_a_trusted_network(clean_environ, host):
    message = refusal(clean_environ, VLLM_HOST=host)
    assert f"VLLM_HOST={host} from environment" in message and "DSPARK_TRUSTED_NETWORK=1" in message
    assert settings_with(clean_environ, VLLM_HOST=host, VLLM_API_KEY="sk-abc").warnings == ()
    assert settings_with(clean_environ, VLLM_HOST=host, DSPARK_API_KEYS="sk-a sk-b").vllm_host
    trusted = settings_with(clean_environ, VLLM_HOST=host, DSPARK_TRUSTED_NETWORK="1")
    assert any("without an API key" in w and "DSPARK_TRUSTED_NETWORK=1" in w for w in trusted.warnings)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_needs_no_key(clean_environ, host):
    assert settings_with(clean_environ, VLLM_HOST=host).warnings == ()


def test_cli_host_option_and_config_check(tmp_path):
    env = tmp_path / "open.env"
    env.write_text("VLLM_HOST=0.0.0.0\n")
    env.chmod(0o600)
    proc = run_dspark(["config", "check", "--env-file", str(env)])
    errors = [l for l in proc.stderr.splitlines() if l.startswith("dspark: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and f"{env}:1" in errors[0] and "Traceback" not in proc.stderr
    env.write_text("VLLM_HOST=0.0.0.0\nDSPARK_TRUSTED_NETWORK=1\n")
    proc = run_dspark(["config", "check", "--env-file", str(env)])
    assert proc.returncode == 0 and "without an API key" in proc.stderr
    assert run_dspark(["config", "check", "--strict", "--env-file", str(env)]).returncode == 2

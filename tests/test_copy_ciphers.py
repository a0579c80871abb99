"""The copy's cipher preference only when the operator set no cipher list: prepending
AES-GCM to a hardened list would bring back ssh's whole default list. Read from the real `ssh -G`."""

from __future__ import annotations

import subprocess

from dspark_launch.model.copy import CIPHER_PREFERENCE, SSHTarget, cipher_preference


def effective_ciphers(argv: list[str], host: str) -> str:
    out = subprocess.run([*argv, "-G", host], capture_output=True, text=True, timeout=30).stdout
    return next(line for line in out.splitlines() if line.startswith("ciphers "))


def test_a_hardened_cipher_list_is_kept_as_the_operator_wrote_it(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  Ciphers aes256-gcm@openssh.com\n")
    hardened = ("ssh", "-F", str(config))
    assert cipher_preference(hardened, "10.213.9.2") == []
    assert (
        effective_ciphers([*hardened, *cipher_preference(hardened, "10.213.9.2")], "10.213.9.2")
        == "ciphers aes256-gcm@openssh.com"
    )
    # What the old unconditional option did to it: the default list back, after AES-GCM.
    assert effective_ciphers([*hardened, *CIPHER_PREFERENCE], "10.213.9.2").count(",") >= 4


def test_without_a_cipher_setting_aes_gcm_comes_first_and_the_defaults_stay(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  ServerAliveInterval 15\n")
    plain = ("ssh", "-F", str(config))
    assert cipher_preference(plain, "10.213.9.2") == list(CIPHER_PREFERENCE)
    argv = SSHTarget("10.213.9.2").ssh_argv()
    line = effective_ciphers(argv, "10.213.9.2")  # this machine's own ssh configuration sets no ciphers
    assert line.startswith("ciphers aes128-gcm@openssh.com,aes256-gcm@openssh.com,") and "chacha20" in line

"""What the installed vLLM's `vllm serve` offers: its flags, their choices, its speculative methods,
and which KV cache dtypes its DeepSeek-V4 attention takes on each GPU generation.

`describe_installed_vllm()` runs on a node (the head, through its agent): it imports
vLLM lazily and reads its own serve parser, so the answer is what that build accepts,
not what a release note says. The result is a frozen, JSON-able `VllmOffer`;
`python -m dspark_launch.node.vllm_offer` prints it, for an agent that keeps vLLM out
of its own process.

The KV judgement needs no GPU: for each compute capability in `JUDGED_CAPABILITIES` it
runs the installed build's own code with that capability: `_select_dsv4_attn_cls`
(models/deepseek_v4/nvidia/model.py: which DeepSeek-V4 attention layer vLLM builds
there), the layer's `_resolve_dsv4_kv_cache_dtype` (models/deepseek_v4/attention.py:
its KV layout) and its backend's `validate_configuration` (the backend's dtype,
capability and combination rules). Whether a kernel library is installed is not part
of that verdict (`modules` says it).
"""

from __future__ import annotations

import subprocess
import sys
import typing

from dspark_launch.node.values import (  # noqa: F401 (the values' home)
    BootJudgement,
    KvJudgement,
    KvVerdict,
    OfferedFlag,
    VllmOffer,
)
from dspark_launch.node.versions import OPTIONAL_PACKAGES

# GPU generations the KV judgement is run for (Hopper, Blackwell B200/B300, Thor, RTX Pro / GB10).
JUDGED_CAPABILITIES = ("9.0", "10.0", "10.3", "11.0", "12.0", "12.1")
# Optional libraries some flags need (found without importing them): node/versions.OPTIONAL_PACKAGES.
OPTIONAL_MODULES = tuple(module for module, _ in OPTIONAL_PACKAGES)


def _literal_values(annotation: object) -> list[str]:
    """Every string of a (nested) typing.Literal."""
    values: list[str] = []
    for arg in typing.get_args(annotation):
        values += [arg] if isinstance(arg, str) else _literal_values(arg)
    return values


def _registered(manager_module: str, manager: str) -> tuple[str, ...]:
    import importlib

    try:
        return tuple(sorted(getattr(importlib.import_module(manager_module), manager).list_registered()))
    except (ImportError, AttributeError):
        return ()


def _judge_deepseek_v4_kv(dtypes: tuple[str, ...]) -> tuple[tuple[KvJudgement, ...], str]:
    """Each dtype on each JUDGED_CAPABILITIES, by the installed build's own DeepSeek-V4 code (module docstring);
    ((), why) when this build cannot be asked (no DeepSeek-V4, or its code moved)."""
    from types import SimpleNamespace
    from unittest import mock

    try:
        import torch
        import vllm.utils.flashinfer as flashinfer_utils
        from vllm.models.deepseek_v4 import attention as dsv4_attention
        from vllm.models.deepseek_v4.nvidia import model as dsv4_model
        from vllm.platforms.interface import DeviceCapability

        select, layout_of = dsv4_model._select_dsv4_attn_cls, dsv4_attention._resolve_dsv4_kv_cache_dtype
    except (ImportError, AttributeError) as exc:
        return (), f"not judged: this vLLM's DeepSeek-V4 attention code cannot be read ({type(exc).__name__}: {exc})"
    judgements = []
    no_backend = SimpleNamespace(attention_config=SimpleNamespace(backend=None))
    for text in JUDGED_CAPABILITIES:
        capability = DeviceCapability(*(int(part) for part in text.split(".")))
        platform = SimpleNamespace(get_device_capability=lambda capability=capability: capability)
        # The library check is the node's install, not the dtype rule: asked apart (`modules`).
        with (
            mock.patch.object(dsv4_model, "current_platform", platform),
            mock.patch.object(flashinfer_utils, "has_flashinfer_sparse_mla_sm120", lambda: True),
        ):
            layer = select(no_backend)
            backend = layer.backend_cls
            verdicts = []
            for dtype in dtypes:
                try:
                    layout, refusal = layout_of(layer.use_fp8_ds_mla_layout, dtype, None)[0], ""
                except ValueError as exc:
                    layout, refusal = "", str(exc).split(". ")[0]
                reasons = backend.validate_configuration(
                    512, torch.bfloat16, dtype, 256, True, True, True, False, False, capability, "decoder"
                )
                if reasons and not refusal:
                    layout, refusal = "", f"{backend.get_name()}: {'; '.join(dict.fromkeys(reasons))}"
                verdicts.append(KvVerdict(dtype, layout, refusal))
        judgements.append(KvJudgement(text, f"{layer.__name__} ({backend.get_name()})", tuple(verdicts)))
    return tuple(judgements), (
        "the installed vLLM's DeepSeek-V4 code run for each capability: _select_dsv4_attn_cls, "
        "_resolve_dsv4_kv_cache_dtype, the backend's validate_configuration"
    )


def _optional_modules() -> tuple[str, ...]:
    import importlib.util

    found = []
    for name in OPTIONAL_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                found.append(name)
        except (ImportError, ValueError):
            continue
    return tuple(found)


def _static_choices() -> dict[str, tuple[str, ...]]:
    """Values argparse leaves open but the build checks later: attention backends, load formats and (0.33 on)
    KV cache dtypes, which CacheConfig checks against KV_CACHE_DTYPES instead of argparse choices."""
    found: dict[str, tuple[str, ...]] = {}
    try:
        from vllm.config.cache import KV_CACHE_DTYPES

        found["kv_cache_dtype"] = tuple(KV_CACHE_DTYPES)
    except ImportError:  # before 0.33: argparse's choices
        pass
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        found["attention_backend"] = tuple(AttentionBackendEnum.__members__)
    except ImportError:
        pass
    try:
        from vllm.model_executor.model_loader import LoadFormats

        found["load_format"] = tuple(_literal_values(LoadFormats))
    except ImportError:
        pass
    return found


def describe_installed_vllm(config_path: str | None = None) -> VllmOffer:
    """Node side: the installed vLLM's serve parser as data, with the dry boot (vllm_dryboot) of the
    checkpoint whose config.json `config_path` names (None: the profile's shipped copy). Takes seconds."""
    import dataclasses

    import vllm
    import vllm.envs
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    from dspark_launch.node.serve_argcheck import serve_parser

    # The tool and reasoning parsers are registries, not argparse choices: ask the registries.
    registries = {
        "tool_call_parser": _registered("vllm.tool_parsers", "ToolParserManager")
        or _registered("vllm.entrypoints.openai.tool_parsers", "ToolParserManager"),
        "reasoning_parser": _registered("vllm.reasoning", "ReasoningParserManager"),
        **_static_choices(),
    }
    parser = serve_parser()
    flags = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        choices = tuple(str(c) for c in action.choices) if action.choices else registries.get(action.dest, ())
        flags.append(OfferedFlag(tuple(action.option_strings), action.dest, action.nargs != 0, choices))
    kv_dtypes = next((f.choices for f in flags if f.dest == "kv_cache_dtype"), ())
    judgements, judged_by = _judge_deepseek_v4_kv(kv_dtypes)
    from dspark_launch.node.vllm_dryboot import dry_boot

    boots, booted_by = dry_boot(JUDGED_CAPABILITIES, config_path)
    try:
        from vllm.config.speculative import DraftSampleMethod

        draft_sampling = tuple(_literal_values(DraftSampleMethod))
    except ImportError:
        draft_sampling = ()
    return VllmOffer(
        version=str(vllm.__version__),
        flags=tuple(flags),
        speculative_methods=tuple(sorted(set(_literal_values(SpeculativeMethod)))),
        kv_judgements=judgements,
        kv_judged_by=judged_by,
        env_names=tuple(sorted(getattr(vllm.envs, "environment_variables", {}))),
        modules=_optional_modules(),
        draft_sample_methods=draft_sampling,
        speculative_fields=tuple(f.name for f in dataclasses.fields(SpeculativeConfig) if f.init),
        boot_judgements=boots,
        booted_by=booted_by,
    )


_MARK = "DSPARK-VLLM-OFFER "


def probe_installed_vllm(python: str = sys.executable, timeout_s: int = 300) -> VllmOffer:
    """Node side, for an agent that keeps vLLM out of its own process: runs the probe in `python`."""
    from dspark_launch.errors import DsparkError

    proc = subprocess.run([python, "-m", __name__], capture_output=True, text=True, timeout=timeout_s)
    answers = [line[len(_MARK) :] for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not answers:
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DsparkError(f"cannot read the installed vLLM's serve flags with {python}: {detail}")
    return VllmOffer.from_json(answers[-1])


if __name__ == "__main__":
    sys.stdout.write(_MARK + describe_installed_vllm(sys.argv[1] if len(sys.argv) > 1 else None).to_json() + "\n")

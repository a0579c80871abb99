"""The default profile's plan on a given vLLM offer, as the dry-boot tests read it (tests/test_dry_boot.py on the
installed vLLM, tests/test_dry_boot_compat.py on other releases)."""

from __future__ import annotations

import dataclasses

from dspark_launch.config.profile_resolve import resolve
from dspark_launch.config.settings import resolve as load_settings
from dspark_launch.node.vllm_offer import VllmOffer
from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
from dspark_launch.profiles.gpu import given_target
from tests.support.paths import REPO

# A stock `pip install vllm` wheel requires flashinfer-python, fastsafetensors, instanttensor, nvidia-cutlass-dsl;
# b12x is only the extra `pip install "vllm[b12x]"`.
STOCK = ("flashinfer", "fastsafetensors", "instanttensor", "cutlass")
WITH_B12X = ("b12x", *STOCK)


def assert_gb10_boot_as_vllm_decides(offer: VllmOffer) -> None:
    """What vLLM's own code decides for DeepSeek-V4-Flash's config.json (fp4 experts): Mxfp4MoEMethod judged by
    the MXFP4 oracle on 12.1 (flashinfer_b12x refused, b12x, marlin and auto chosen), each capability's attention.
    `auto` is MARLIN with DeepGEMM off (VLLM_USE_DEEP_GEMM=0, the profile's) and in a build without DeepGEMM; a
    build that ships it (the CUDA wheels) picks DeepGEMM there with it on (tests/test_dry_boot_newest.py)."""
    assert "deepseek-v4-flash-0731.config.json" in offer.booted_by
    gb10 = offer.boot("12.1")
    assert gb10.moe_method == "Mxfp4MoEMethod"
    assert gb10.attention == "DeepseekV4FlashInferSM120Attention (FLASHINFER_MLA_SPARSE_DSV4)"
    assert offer.boot("9.0").attention == "DeepseekV4FlashMLAAttention (FLASHMLA_SPARSE_DSV4)"
    refused = gb10.verdict("moe", "flashinfer_b12x")
    assert refused.refusal.startswith("ValueError: moe_backend='flashinfer_b12x' is not supported for MXFP4 MoE")
    assert gb10.verdict("moe", "b12x").chosen == gb10.verdict("moe", "b12x", "0").chosen == "B12X_MXFP4_MXFP8"
    assert gb10.verdict("moe", "marlin").chosen == gb10.verdict("moe", "marlin", "0").chosen == "MARLIN"
    assert gb10.verdict("moe", "auto", "0").chosen == "MARLIN"
    auto = gb10.verdict("moe", "auto").chosen
    if "DeepGEMM shipped with this build" in offer.booted_by:
        assert auto, gb10.verdict("moe", "auto")  # a release's own pick with DeepGEMM on (0.34: DEEPGEMM_MXFP4)
    else:
        assert auto == "MARLIN"
    assert not gb10.unjudged, gb10.unjudged


def settings(environ: dict[str, str] | None = None):
    return load_settings(env_file=str(REPO / ".env.dspark.example"), environ=environ or {})


def value_of(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def line_of(resolved, subject: str) -> str:
    return next(d.line for d in resolved.decisions if d.subject == subject)


def plan_for(offer: VllmOffer, capability: str, modules: tuple[str, ...], environ: dict[str, str] | None = None):
    return resolve(
        DEEPSEEK_V4_FLASH, dataclasses.replace(offer, modules=modules), settings(environ), given_target(capability)
    )

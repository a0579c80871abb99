"""The dry boot: every pre-GPU decision the installed vLLM makes for DeepSeek-V4 on each compute capability,
asked of its own code on the CPU (node side, imports vLLM; run through `vllm_offer`).

For each capability the platform object is patched to report a CUDA device of that capability
(`_enum`, `get_device_capability`: every `is_cuda()`, `has_device_capability()`,
`is_device_capability_family()` of vLLM then answers for it), and vLLM's own functions run on the
checkpoint's configuration (`config.json`: the pulled one, else the profile's shipped copy,
profiles/data/README.md):

- attention: `_select_dsv4_attn_cls` (models/deepseek_v4/nvidia/model.py) with no backend asked;
- MoE: `DeepseekV4FP8Config.get_quant_method` (models/deepseek_v4/quant_config.py) for a routed-experts
  layer of this checkpoint: fp4 experts -> `Mxfp4MoEMethod`, whose constructor runs
  `select_deepseek_v4_mxfp4_moe_backend` (fused_moe/oracle/mxfp4.py, `map_mxfp4_backend` inside) for
  each `--moe-backend` value; the NVFP4 path when the checkpoint says `moe_quant_algo: NVFP4`;
- linear: `choose_scaled_mm_linear_kernel` (model_executor/kernels/linear) for the checkpoint's
  block-FP8 linears under each `--linear-backend` value;
- CUDA graphs: `CompilationConfig.resolve_cudagraph_mode_and_sizes` with the attention backends' own
  graph support, MTP's decode query length, and piecewise capture available only when
  VLLM_USE_BREAKABLE_CUDAGRAPH is on (VllmConfig turns it on for DeepSeek-V4 when unset) or the model
  class is compiled (`@support_torch_compile`; the NVIDIA DeepSeek-V4 model is not).

Kernel libraries (b12x, FlashInfer's sparse MLA) are assumed present for the verdict, as for the KV
dtype: whether a node has them is its version row's `packages` (the cluster decides, config side).
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from dspark_launch.node.values import BackendVerdict, BootJudgement, GraphVerdict

SHIPPED_CONFIG = Path(__file__).resolve().parent.parent / "profiles" / "data" / "deepseek-v4-flash-0731.config.json"
# The breakable-graph variable as the profile may set it: unset (""), off, on.
BREAKABLE_VALUES = ("", "0", "1")
# What the MoE oracle's FusedMoEConfig is built from (config.json).
MOE_FIELDS = ("n_routed_experts", "num_experts_per_tok", "hidden_size", "moe_intermediate_size")
# The layer the MoE oracle is asked for: past the hash-routed layers (num_hash_layers), as most layers are.
_ROUTED_PREFIX = "model.layers.{}.ffn.experts"


def _literal_values(annotation: object) -> list[str]:
    values: list[str] = []
    for arg in typing.get_args(annotation):
        values += [arg] if isinstance(arg, str) else _literal_values(arg)
    return values


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


class _Capability:
    """The platform reports a CUDA GPU of `capability` while inside (all of vLLM shares the one object)."""

    def __init__(self, capability):
        from vllm.platforms import PlatformEnum, current_platform

        cls = type(current_platform)
        self.patches = [mock.patch.object(cls, "_enum", PlatformEnum.CUDA),
                        mock.patch.object(cls, "get_device_capability",
                                          classmethod(lambda _cls, device_id=0: capability))]

    def __enter__(self):
        for patch in self.patches:
            patch.start()
        return self

    def __exit__(self, *exc):
        for patch in reversed(self.patches):
            patch.stop()


def _libraries_present():
    """b12x's kernels and FlashInfer's SM120 sparse MLA reported installed (see the module docstring)."""
    import vllm.utils.flashinfer as flashinfer_utils
    from vllm.model_executor.kernels.linear.scaled_mm import b12x as linear_b12x
    from vllm.model_executor.layers.fused_moe import b12x as moe_b12x

    present = SimpleNamespace(is_supported=lambda *a, **k: True)
    return [mock.patch.object(moe_b12x, "get_b12x_fused_moe", lambda: present),
            mock.patch.object(linear_b12x, "_import_b12x_blockscaled", lambda: present),
            mock.patch.object(flashinfer_utils, "has_flashinfer_sparse_mla_sm120", lambda: True)]


def _moe_verdicts(hf: dict, values: tuple[str, ...]) -> tuple[str, tuple[BackendVerdict, ...]]:
    import torch
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType,
    )
    from vllm.models.deepseek_v4 import quant_config as dsv4_quant

    current = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(**hf)))
    oracle = ""
    verdicts = []
    for value in values:
        # TP 2 as the profile serves: the experts' intermediate size is split over the two ranks.
        parallel = FusedMoEParallelConfig.make_no_parallel()
        moe = FusedMoEConfig(
            num_experts=hf["n_routed_experts"], experts_per_token=hf["num_experts_per_tok"],
            hidden_dim=hf["hidden_size"], intermediate_size=hf["moe_intermediate_size"],
            num_local_experts=hf["n_routed_experts"], num_logical_experts=hf["n_routed_experts"],
            activation=MoEActivation.SILU, device="cuda", routing_method=RoutingMethodType.DeepseekV4,
            moe_parallel_config=parallel, in_dtype=torch.bfloat16, moe_backend=value,
            swiglu_limit=hf.get("swiglu_limit"), has_hash_routing=False)
        layer = RoutedExperts.__new__(RoutedExperts)
        layer.__dict__["moe_config"] = moe
        quant = dsv4_quant.DeepseekV4FP8Config.from_config(dict(hf.get("quantization_config") or {}))
        with mock.patch.object(dsv4_quant, "get_current_vllm_config", lambda: current):
            try:
                method = quant.get_quant_method(layer, _ROUTED_PREFIX.format(hf.get("num_hash_layers", 0)))
            except (ValueError, NotImplementedError, KeyError, AssertionError) as exc:
                verdicts.append(BackendVerdict(value, "", _first_line(exc)))
                continue
        chosen = getattr(method, "mxfp4_backend", None) or getattr(method, "nvfp4_backend", None)
        oracle = oracle or type(method).__name__
        verdicts.append(BackendVerdict(value, getattr(chosen, "value", str(chosen or type(method).__name__))))
    return oracle, tuple(verdicts)


def _linear_verdicts(hf: dict, capability, values: tuple[str, ...]) -> tuple[BackendVerdict, ...]:
    import torch
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8Dynamic128Sym, kFp8Static128BlockSym,
    )

    # The checkpoint's linears: FP8 weights in 128x128 blocks, activations quantized per 128 (fp8.py's
    # block path), e.g. the attention's q_lora projection hidden_size -> q_lora_rank.
    config = linear.FP8ScaledMMLinearLayerConfig(
        weight_quant_key=kFp8Static128BlockSym, activation_quant_key=kFp8Dynamic128Sym,
        input_dtype=torch.bfloat16, out_dtype=torch.bfloat16,
        weight_shape=(hf.get("q_lora_rank") or hf["hidden_size"], hf["hidden_size"]))
    verdicts = []
    for value in values:
        with mock.patch.object(linear, "_get_linear_backend", lambda *, quantization, value=value: value):
            try:
                kernel = linear.choose_scaled_mm_linear_kernel(
                    config, linear._POSSIBLE_FP8_BLOCK_KERNELS, capability.major * 10 + capability.minor,
                    quantization="fp8_block_w8a8")
            except (ValueError, NotImplementedError) as exc:
                verdicts.append(BackendVerdict(value, "", _first_line(exc)))
                continue
        wanted = linear._LINEAR_BACKEND_KERNEL_MAP.get(value, set())
        if value != "auto" and kernel not in wanted:
            # vLLM falls back to automatic selection with a warning: the flag does nothing for these layers.
            verdicts.append(BackendVerdict(value, "", f"no {value} kernel can run the block-FP8 linears here "
                                                      f"(vLLM falls back to {kernel.__name__})"))
            continue
        verdicts.append(BackendVerdict(value, kernel.__name__))
    return tuple(verdicts)


def _graph_verdicts(layer, hf: dict, speculative_tokens: int) -> tuple[GraphVerdict, ...]:
    from vllm.config.compilation import CompilationConfig, CUDAGraphMode
    from vllm.config.vllm import default_breakable_cudagraph_architectures
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper
    from vllm.models.deepseek_v4.nvidia import model as dsv4_model

    builders = [cls.get_builder_cls() for cls in (layer.backend_cls, getattr(layer, "swa_backend_cls", None)) if cls]
    support = min((b._cudagraph_support for b in builders), key=lambda s: s.value)
    lowest = next(b for b in builders if b._cudagraph_support == support).__name__
    compiled = any(isinstance(obj, type) and issubclass(obj, TorchCompileWithNoGuardsWrapper)
                   for obj in vars(dsv4_model).values())
    by_default = bool(set(hf.get("architectures") or ()) & default_breakable_cudagraph_architectures())
    verdicts = []
    for requested in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "FULL", "NONE"):
        for breakable in BREAKABLE_VALUES:
            on = breakable == "1" or (breakable == "" and by_default)
            config = CompilationConfig(cudagraph_mode=CUDAGraphMode[requested])
            try:
                mode = config.resolve_cudagraph_mode_and_sizes(support, lowest, speculative_tokens + 1,
                                                               use_v2_model_runner=True,
                                                               piecewise_capture_available=on or compiled)
            except (ValueError, AssertionError) as exc:
                verdicts.append(GraphVerdict(requested, breakable, "", _first_line(exc)))
                continue
            why = (f"breakable CUDA graphs {'on' if on else 'off'}"
                   f"{' (VllmConfig turns them on for ' + '/'.join(hf.get('architectures') or ()) + ')' if breakable == '' and by_default else ''}"
                   f"; the model class {'is' if compiled else 'is not'} compiled; attention graph support "
                   f"{support.name} ({lowest})")
            if mode.name != requested:
                why += f": vLLM's resolution runs {mode.name}, not {requested}"
            verdicts.append(GraphVerdict(requested, breakable, mode.name, why))
    return tuple(verdicts)


def read_config(path: str | Path | None) -> tuple[dict, str]:
    """The checkpoint's config.json (path given, else the shipped copy) and how it is named in the offer."""
    import hashlib

    where = Path(path) if path else SHIPPED_CONFIG
    data = where.read_bytes()
    origin = "the pulled model's" if path else "the profile's shipped"
    return json.loads(data), f"{origin} {where.name} ({where}, sha256 {hashlib.sha256(data).hexdigest()[:16]})"


def dry_boot(capabilities: tuple[str, ...], config_path: str | None = None, speculative_tokens: int = 5
             ) -> tuple[tuple[BootJudgement, ...], str]:
    """The judgements for each capability, and what judged them; ((), why) when this vLLM cannot be asked."""
    try:
        from vllm.config.kernel import LinearBackend, MoEBackend
        from vllm.models.deepseek_v4.nvidia import model as dsv4_model
        from vllm.platforms.interface import DeviceCapability

        hf, named = read_config(config_path)
    except (ImportError, AttributeError, OSError, ValueError) as exc:
        return (), f"no dry boot: this vLLM's DeepSeek-V4 code or the config cannot be read ({_first_line(exc)})"
    missing = [key for key in MOE_FIELDS if key not in hf]
    if hf.get("model_type") != "deepseek_v4" or missing:
        return (), (f"no dry boot: {named} is not a DeepSeek-V4 checkpoint (model_type "
                    f"{hf.get('model_type')!r}{', no ' + ', '.join(missing) if missing else ''})")
    moe_values, linear_values = tuple(_literal_values(MoEBackend)), tuple(_literal_values(LinearBackend))
    judgements = []
    for text in capabilities:
        capability = DeviceCapability(*(int(part) for part in text.split(".")))
        libraries = _libraries_present()
        with _Capability(capability):
            for patch in libraries:
                patch.start()
            try:
                layer = dsv4_model._select_dsv4_attn_cls(SimpleNamespace(attention_config=SimpleNamespace(backend=None)))
                attention = f"{layer.__name__} ({layer.backend_cls.get_name()})"
                oracle, moe = _moe_verdicts(hf, moe_values)
                linear_found = _linear_verdicts(hf, capability, linear_values)
                graphs = _graph_verdicts(layer, hf, speculative_tokens)
            except Exception as exc:  # vLLM's code moved: the offer says so, resolution says "not judged"
                return (), f"no dry boot: this vLLM's selection code could not be asked on {text} ({_first_line(exc)})"
            finally:
                for patch in reversed(libraries):
                    patch.stop()
        judgements.append(BootJudgement(text, attention, oracle, moe, linear_found, graphs))
    return tuple(judgements), (f"the installed vLLM's own code on {named}: _select_dsv4_attn_cls, "
                               "DeepseekV4FP8Config.get_quant_method -> the MoE oracle, "
                               "choose_scaled_mm_linear_kernel, resolve_cudagraph_mode_and_sizes")

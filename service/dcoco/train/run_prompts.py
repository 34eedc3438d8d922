"""The long run's prompts: one seeded, ordered stream, so that a data position is an index.

Three domains, interleaved by weight in a fixed order; a domain whose prompts were all answered
greedily goes on with the same prompts answered by sampling (`RunConfig.resample`), and one
that runs out of those too leaves the others:
- prose: every human turn of the ShareGPT conversations, after the turns before it (the
  recorded answers stand in for the target's own in the history);
- code: requests built from functions of Python's standard library, as the corpus stage builds,
  then from those of a few pinned installed packages (`RunConfig.code_packages`);
- math: the seeded word-problem generator.

Each prompt keeps the text's own answer (the recorded reply, the function's source, the
generator's worked solution) for teacher-forced training (`run_teacher`); self-distillation
ignores it.

Nothing evaluated is ever trained on, by two rules: a prompt whose record key falls in the
held-out split (`corpus.is_held_out`, the split the shipped `heldout/` files come from) is left
out, and so is any prompt whose text, normalised, equals or starts like a prompt of the held-out
files or of the packaged evaluation suites (HumanEval, GSM8K, MT-Bench, AIME, GPQA).
"""

import hashlib
import random
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from dcoco.paths import REPO_ROOT
from dcoco.suites import HELDOUT, PACKAGED, load_suite
from dcoco.train.corpus import is_held_out
from dcoco.train.corpus_chat import (
    MAX_CHARS,
    MAX_NON_ASCII,
    MIN_CHARS,
    conversations,
    sharegpt_file,
)
from dcoco.train.corpus_code import package_files, records_from_file, stdlib_files
from dcoco.train.corpus_math import math_records
from dcoco.train.run_config import Resample, RunConfig

Message = dict[str, str]
PREFIX_CHARS = 64  # a held-out prompt's normalised opening that no training prompt may share
ROLES = {"human": "user", "gpt": "assistant"}


@dataclass(frozen=True)
class RunPrompt:
    domain: str
    key: str  # the record key that decides the split
    messages: tuple[Message, ...]  # the conversation up to and including the user's turn
    answer: str = ""  # the text's own answer to it; empty where the text has none
    temperature: float = 0.0  # how the target answers it: 0 greedy, else sampled


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


@dataclass(frozen=True)
class Exclusions:
    """Normalised texts and openings of every prompt that is evaluated."""

    texts: frozenset[str]
    openings: frozenset[str]

    @classmethod
    def of(cls, prompts: list[str]) -> "Exclusions":
        texts = [normalise(p) for p in prompts]
        return cls(frozenset(texts), frozenset(t[:PREFIX_CHARS] for t in texts))

    def excludes(self, text: str) -> bool:
        plain = normalise(text)
        return plain in self.texts or plain[:PREFIX_CHARS] in self.openings


def evaluated_prompts(heldout: Path) -> list[str]:
    """Every prompt `dcoco eval` and `dcoco bench` send: held-out files and packaged suites."""
    prompts: list[str] = []
    for name in (*HELDOUT, *PACKAGED):
        suite = load_suite(name, heldout)
        prompts += suite.prompts
        prompts += [m["content"] for history in suite.histories for m in history]
    return prompts


def prose_prompts(path: Path) -> Iterator[RunPrompt]:
    """Each usable human turn of each conversation, with the turns before it."""
    for record in conversations(path):
        turns = record.get("conversations")
        if not isinstance(turns, list):
            continue
        history: list[Message] = []
        key = f"sharegpt:{record.get('id')}"  # the corpus stage's key: the same split
        for turn in turns:
            if not isinstance(turn, dict) or turn.get("from") not in ROLES:
                break
            history.append(
                {"role": ROLES[str(turn["from"])], "content": str(turn.get("value", "")).strip()}
            )
        for at, message in enumerate(history):
            text = message["content"]
            usable = message["role"] == "user" and MIN_CHARS <= len(text) <= MAX_CHARS
            if usable and sum(not c.isascii() for c in text) <= MAX_NON_ASCII * len(text):
                after = history[at + 1 : at + 2]
                answer = after[0]["content"] if after and after[0]["role"] == "assistant" else ""
                yield RunPrompt("prose", key, tuple(history[: at + 1]), answer)


def code_prompts(packages: tuple[str, ...], max_chars: int, seed: int) -> Iterator[RunPrompt]:
    """The standard library's functions, then those of the installed `packages`."""
    stdlib, purelib = (Path(sysconfig.get_paths()[name]) for name in ("stdlib", "purelib"))
    files = [(path, stdlib) for path in stdlib_files(stdlib)]
    files += [(path, purelib) for path in package_files(packages, purelib)]
    rng = random.Random(seed)
    for path, root in files:
        for record in records_from_file(path, root, max_chars, rng):
            if record.domain == "code":
                messages = ({"role": "user", "content": record.user},)
                yield RunPrompt("code", record.key, messages, record.assistant)


def math_prompts(count: int, seed: int) -> Iterator[RunPrompt]:
    seen: set[str] = set()
    for record in math_records(count, seed):
        if record.user not in seen:
            seen.add(record.user)
            messages = ({"role": "user", "content": record.user},)
            yield RunPrompt("math", record.key, messages, record.assistant)


def interleave(
    domains: dict[str, list[RunPrompt]],
    weights: dict[str, float],
    seed: int,
    then: dict[str, list[RunPrompt]] | None = None,
) -> list[RunPrompt]:
    """Each domain shuffled and followed by its prompts in `then`, as they are; then merged so
    that every prefix holds the domains near their weights."""
    queues = {name: _shuffled(items, f"{seed}:{name}") for name, items in domains.items()}
    for name, items in (then or {}).items():
        queues[name] = queues.get(name, []) + items
    taken = dict.fromkeys(queues, 0)
    order: list[RunPrompt] = []
    while any(taken[n] < len(q) for n, q in queues.items()):
        live = [n for n, q in queues.items() if taken[n] < len(q)]
        name = min(live, key=lambda n: ((taken[n] + 1) / weights[n], n))
        order.append(queues[name][taken[name]])
        taken[name] += 1
    return order


def resampled(
    domains: dict[str, list[RunPrompt]], resample: Resample, seed: int
) -> dict[str, list[RunPrompt]]:
    """Each domain's prompts again, `resample.passes` times, each pass in its own seeded order,
    to be answered by sampling at `resample.temperature`."""
    return {
        name: [
            replace(prompt, temperature=resample.temperature)
            for n in range(1, resample.passes + 1)
            for prompt in _shuffled(items, f"{seed}:{name}:{n}")
        ]
        for name, items in domains.items()
    }


def _shuffled(items: list[RunPrompt], seed: str) -> list[RunPrompt]:
    order = list(items)
    random.Random(seed).shuffle(order)
    return order


def domain_prompts(
    cfg: RunConfig, math_problems: int, code_packages: tuple[str, ...], sharegpt: Path
) -> dict[str, list[RunPrompt]]:
    """Each weighted domain's usable prompts, in their sources' order; the same for the same
    arguments. Held-out and evaluated prompts are left out (module docstring)."""
    excluded = Exclusions.of(evaluated_prompts(REPO_ROOT / cfg.models_path / "heldout"))
    sources = {
        "prose": prose_prompts(sharegpt),
        "code": code_prompts(code_packages, cfg.max_chars, cfg.seed),
        "math": math_prompts(math_problems, cfg.seed),
    }
    return {
        name: [
            p
            for p in found
            if not is_held_out(p.key, cfg.test_percent, cfg.seed)
            and not excluded.excludes(p.messages[-1]["content"])
        ]
        for name, found in sources.items()
        if cfg.weights.get(name, 0.0) > 0
    }


def exhausted_domains(prompts: list[RunPrompt], start: int, weights: dict[str, float]) -> list[str]:
    """The weighted domains with no prompt left in the stream from index `start` on, where
    some other domain still has prompts: from there `interleave` gives the others alone."""
    left = {p.domain for p in prompts[start:]}
    gone = sorted(name for name, weight in weights.items() if weight > 0 and name not in left)
    return gone if left else []


def stream_of(cfg: RunConfig, sharegpt: Path | None = None) -> list[RunPrompt]:
    """The prompts a run's legs answer, in order. Where the stream grew (`cfg.grown`), the
    earlier stream's first prompts come first, then every prompt not among them. Each
    domain's sampled passes (`cfg.resample`) follow its greedy prompts and cover all of its
    prompts, those of the earlier stream included."""
    chats = sharegpt or sharegpt_file()
    domains = domain_prompts(cfg, cfg.math_problems, cfg.code_packages, chats)
    again = resampled(domains, cfg.resample, cfg.seed) if cfg.resample else None
    if cfg.grown is None:
        return interleave(domains, cfg.weights, cfg.seed, again)
    grown = cfg.grown
    before = domain_prompts(cfg, grown.math_problems, grown.code_packages, chats)
    head = interleave(before, cfg.weights, cfg.seed)[: grown.at]
    answered = {_conversation(p) for p in head}
    rest = {
        name: [p for p in found if _conversation(p) not in answered]
        for name, found in domains.items()
    }
    return head + interleave(rest, cfg.weights, cfg.seed, again)


def digest(prompts: list[RunPrompt]) -> str:
    """A fingerprint of the stream's prompts in order: the same on every machine whose
    packaged texts and pinned packages agree (a leg records it, `run.leg_record`)."""
    text = hashlib.sha256()
    for prompt in prompts:
        text.update(repr((prompt.domain, prompt.temperature, _conversation(prompt))).encode())
    return text.hexdigest()[:16]


def _conversation(prompt: RunPrompt) -> tuple[tuple[str, str], ...]:
    return tuple((m["role"], m["content"]) for m in prompt.messages)

"""What the benchmark sends: suites sampled with a seed, and the modes each prompt runs in.

Each suite is sampled on its own (the seed and the suite's name pick its `limit` prompts), so
adding a suite leaves the others' samples alone; the sampled prompts of all suites are then
shuffled together once, and every server gets them in that same order.
"""

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcoco.bench.client import Call, Message
from dcoco.shared.errors import UsageError
from dcoco.suites import Suite, file_suite, load_suite

SAMPLING = {"greedy": 0.0, "t1": 1.0}
THINKING = {"default": (None,), "on": (True,), "off": (False,), "both": (True, False)}


@dataclass(frozen=True)
class Item:
    suite: str
    index: int  # the prompt's position in its suite
    messages: list[Message]


@dataclass(frozen=True)
class Mode:
    """A sampling temperature and, where a chat template has the switch, extended thinking."""

    sampling: str  # a key of SAMPLING
    thinking: bool | None = None  # None: send no chat_template_kwargs, the template's default

    @property
    def name(self) -> str:
        suffix = {None: "", True: "+thinking", False: "+no-thinking"}[self.thinking]
        return self.sampling + suffix

    def extra(self) -> dict[str, Any]:
        """vLLM's (and Hugging Face's) switch; a server without it refuses the parameter."""
        if self.thinking is None:
            return {}
        return {"chat_template_kwargs": {"enable_thinking": self.thinking}}


def modes(sampling: list[str], thinking: str) -> list[Mode]:
    return [Mode(s, t) for s in sampling for t in THINKING[thinking]]


def load_suites(names: list[str], files: list[Path], heldout: Path) -> list[Suite]:
    suites = [load_suite(name, heldout) for name in names] + [file_suite(f) for f in files]
    seen: set[str] = set()
    for suite in suites:
        if suite.name in seen:
            raise UsageError(f"two suites share a name: {suite.name}")
        seen.add(suite.name)
    if not suites:
        raise UsageError("nothing to send: name --suites or --prompts")
    return suites


def sample(suites: list[Suite], limit: int, seed: int) -> list[Item]:
    items = []
    for suite in suites:
        picked = random.Random(f"{seed}:{suite.name}").sample(
            range(len(suite.prompts)), min(limit, len(suite.prompts))
        )
        items += [Item(suite.name, i, suite.conversation(i)) for i in picked]
    random.Random(seed).shuffle(items)
    return items


def calls(items: list[Item], count: int, mode: Mode, max_tokens: int, seed: int) -> list[Call]:
    """`count` calls: the items in order, cycled when `count` is larger. Sampled modes carry a
    seed per position, so every server is asked for the same sampled answers."""
    temperature = SAMPLING[mode.sampling]
    return [
        Call(
            suite=items[i % len(items)].suite,
            messages=items[i % len(items)].messages,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed * 100_003 + i if temperature > 0 else None,
            extra=mode.extra(),
        )
        for i in range(count)
    ]

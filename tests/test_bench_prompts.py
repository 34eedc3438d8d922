"""What the benchmark sends: the packaged suites it adds, seeded samples and the calls made of
them."""

from pathlib import Path

import pytest

from dcoco.bench.prompts import Item, Mode, calls, load_suites, modes, sample
from dcoco.paths import TINY_HELDOUT
from dcoco.shared.errors import UsageError
from dcoco.suites import Suite, load_suite


def test_aime_gpqa_and_mtbench_second_turns_load_offline(tmp_path: Path) -> None:
    aime = load_suite("aime2025", tmp_path)
    assert len(aime.prompts) == 30
    assert "aime2025-I.jsonl, aime2025-II.jsonl" in aime.source
    assert aime.prompts[0].startswith("Find the sum of all integer bases")
    gpqa = load_suite("gpqa", tmp_path)
    assert len(gpqa.prompts) == 198
    first = gpqa.prompts[0]
    assert first.startswith("Answer the following multiple choice question.")
    assert all(f"\n{letter}) " in first for letter in "ABCD")
    assert "\nC) 10^-4 eV" in first  # the correct answer, at the place its row's seed put it
    assert load_suite("gpqa", tmp_path).prompts == gpqa.prompts  # the shuffle is fixed
    second = load_suite("mtbench2", tmp_path)
    assert len(second.prompts) == 30
    conversation = second.conversation(0)
    assert [m["role"] for m in conversation] == ["user", "assistant", "user"]
    assert conversation[0]["content"].startswith("Imagine you are participating in a race")
    assert conversation[1]["content"].startswith("If you have just overtaken the second person")
    assert conversation[2]["content"] == second.prompts[0]
    assert load_suite("mtbench", tmp_path).conversation(0) == [
        {"role": "user", "content": load_suite("mtbench", tmp_path).prompts[0]}
    ]


def test_samples_are_seeded_capped_and_independent_per_suite() -> None:
    a = Suite("a", [f"a{i}" for i in range(50)], "test")
    b = Suite("b", [f"b{i}" for i in range(3)], "test")
    items = sample([a, b], limit=5, seed=1)
    assert sum(i.suite == "a" for i in items) == 5
    assert sum(i.suite == "b" for i in items) == 3
    assert items == sample([a, b], limit=5, seed=1)
    assert items != sample([a, b], limit=5, seed=2)
    # Adding a suite leaves another suite's sample as it was.
    c = Suite("c", ["c0"], "test")
    picked = {i.index for i in items if i.suite == "a"}
    assert {i.index for i in sample([a, b, c], 5, 1) if i.suite == "a"} == picked
    assert all(i.messages == a.conversation(i.index) for i in items if i.suite == "a")


def test_calls_cycle_the_sample_and_seed_only_sampled_modes() -> None:
    items = [Item("s", i, [{"role": "user", "content": str(i)}]) for i in range(3)]
    greedy = calls(items, 7, Mode("greedy"), max_tokens=9, seed=4)
    assert [c.messages[0]["content"] for c in greedy] == ["0", "1", "2", "0", "1", "2", "0"]
    assert all(c.seed is None and c.temperature == 0.0 and c.max_tokens == 9 for c in greedy)
    sampled = calls(items, 7, Mode("t1"), 9, seed=4)
    assert len({c.seed for c in sampled}) == 7
    assert all(c.temperature == 1.0 for c in sampled)
    assert sampled == calls(items, 7, Mode("t1"), 9, seed=4)
    thinking = modes(["greedy"], "both")
    assert [m.name for m in thinking] == ["greedy+thinking", "greedy+no-thinking"]
    assert thinking[1].extra() == {"chat_template_kwargs": {"enable_thinking": False}}
    assert modes(["t1"], "default")[0].extra() == {}


def test_suites_need_distinct_names(tmp_path: Path) -> None:
    code = tmp_path / "code.jsonl"
    code.write_text('{"prompt": "x"}\n')
    with pytest.raises(UsageError, match="share a name: code"):
        load_suites(["code"], [code], TINY_HELDOUT)
    with pytest.raises(UsageError, match="nothing to send"):
        load_suites([], [], TINY_HELDOUT)

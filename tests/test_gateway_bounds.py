"""The token bound the gateway refuses oversized prompts by, before tokenizing them: never above
the real count, on the shipped tokenizers and adversarial texts; absent where it would not hold;
and tight enough that the bodies that cost seconds to tokenize are refused without it."""

import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from dcoco.gateway.bounds import token_bound
from dcoco.paths import SMOLLM2_TARGET, TINY_TARGET
from dcoco.tokenizer import train_tokenizer

TOKENIZERS = {
    "tiny": TINY_TARGET / "tokenizer.json",
    "smollm2": SMOLLM2_TARGET / "tokenizer.json",  # converted by `make setup`
}


def adversarial_texts() -> list[str]:
    rng = random.Random(0)
    alphabet = "ab \n\t.,;{}()<>|_-=0123456789éßλжआ中文😀\u0301\u200b"
    return [
        "hello world " * 2000,
        "\n" + " " * 100_000,  # the longest tokens are runs of spaces after a newline
        " " * 50_000,
        "\n" * 50_000,
        "<|im_start|><|im_end|><|endoftext|>" * 500,  # special tokens, matched whole
        "<|im_start|>user\nhi<|im_end|>\n" * 300,
        "😀" * 5000,
        "中文" * 5000,
        "e\u0301" * 5000,
        "def f(x):\n    return x * 2\n" * 500,
        "".join(rng.choice(alphabet) for _ in range(30_000)),
        "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(20_000)),
    ]


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_the_bound_never_exceeds_the_real_count(name: str) -> None:
    path = TOKENIZERS[name]
    if not path.exists():
        pytest.skip(f"{path} is made by `make setup`")
    raw = path.read_text()
    inner = HFTokenizer.from_str(raw)
    bound = token_bound(raw, inner)
    assert bound is not None
    for text in adversarial_texts():
        real = len(inner.encode(text, add_special_tokens=False).ids)
        assert bound.least_tokens(text) <= real, (text[:40], bound.least_tokens(text), real)


def test_the_bound_refuses_the_costly_bodies_without_tokenizing() -> None:
    """The hostile body of the hardening trials: 3.9 MB that took 4 s to tokenize."""
    raw = (TINY_TARGET / "tokenizer.json").read_text()
    bound = token_bound(raw, HFTokenizer.from_str(raw))
    assert bound is not None
    assert bound.least_tokens("hello world " * 325_000) > 8192  # SmolLM2's whole context


def test_a_normalizer_that_shrinks_text_is_measured_after_it(tmp_path: Path) -> None:
    """NFC composes three conjoining jamo (9 bytes) into one Hangul syllable (3 bytes)."""
    jamo = "\u1100\u1161\u11a8"  # composes to "각"
    inner = HFTokenizer(models.BPE())
    inner.normalizer = normalizers.NFC()
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.train_from_iterator(
        ["각각각 hello"] * 50,
        trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    bound = token_bound(inner.to_str(), inner)
    assert bound is not None
    text = jamo * 10_000
    real = len(inner.encode(text, add_special_tokens=False).ids)
    assert bound.least_tokens(text) <= real


def test_no_bound_where_one_token_can_cover_unbounded_input() -> None:
    wordpiece = HFTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert token_bound(wordpiece.to_str(), wordpiece) is None  # a long word is one [UNK]
    removing = train_tokenizer(["hello world"] * 10, vocab_size=280)
    removing.pre_tokenizer = pre_tokenizers.Whitespace()  # spaces are dropped, not tokenized
    assert token_bound(removing.to_str(), removing) is None
    stripping = train_tokenizer(["hello world"] * 10, vocab_size=280)
    mask = AddedToken("<mask>", lstrip=True, special=True)  # absorbs the spaces before it
    stripping.add_special_tokens([mask])
    assert token_bound(stripping.to_str(), stripping) is None

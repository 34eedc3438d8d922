import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from dcoco.tokenizer import Tokenizer
from dcoco.worker.detokenizer import Detokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """Byte-level tokens, one per byte, so multi-byte characters span several tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    inner = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    return Tokenizer(inner, None, [])


def feed(detok: Detokenizer, ids: list[int], step: int) -> list[str]:
    out = [detok.push(ids[i : i + step]) for i in range(0, len(ids), step)]
    return [*out, detok.flush()]


@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_text_is_released_whole_characters_at_a_time(tokenizer: Tokenizer, step: int) -> None:
    text = "naïve café → 東京 🙂 ok"
    pieces = feed(Detokenizer(tokenizer), tokenizer.encode(text), step)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("step", [1, 2, 5])
def test_stop_strings_cut_the_text_before_them(tokenizer: Tokenizer, step: int) -> None:
    ids = tokenizer.encode("alpha beta\n\ngamma delta")
    detok = Detokenizer(tokenizer, stops=("\n\n", "zzz"))
    pieces = feed(detok, ids, step)
    assert "".join(pieces) == "alpha beta"
    assert detok.stopped
    assert detok.push(tokenizer.encode("more")) == ""


def test_a_possible_stop_prefix_is_held_until_it_resolves(tokenizer: Tokenizer) -> None:
    detok = Detokenizer(tokenizer, stops=("END",))
    assert detok.push(tokenizer.encode("the EN")) == "the "
    assert detok.push(tokenizer.encode("D")) == ""
    assert detok.stopped
    other = Detokenizer(tokenizer, stops=("END",))
    assert other.push(tokenizer.encode("the EN")) == "the "
    assert other.push(tokenizer.encode("ough")) == "ENough"


def test_resuming_continues_without_repeating(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("héllo wörld, again")
    first = Detokenizer(tokenizer)
    sent = first.push(ids[:4])  # "h" + "é" (2 bytes) + "l" ... part of the text
    resumed = Detokenizer(tokenizer, prefix_ids=ids[:7], sent_text=sent)
    rest = feed(resumed, ids[7:], 2)
    assert sent + "".join(rest) == "héllo wörld, again"


def test_a_character_split_across_deltas_goes_out_whole_with_the_delta_that_completes_it(
    tokenizer: Tokenizer,
) -> None:
    emoji = tokenizer.encode("🙂")  # four byte tokens
    assert len(emoji) == 4
    detok = Detokenizer(tokenizer)
    assert detok.push(tokenizer.encode("ok ") + emoji[:1]) == "ok "
    assert detok.push(emoji[1:3]) == ""
    assert detok.push(emoji[3:] + tokenizer.encode("!")) == "🙂!"
    cut = Detokenizer(tokenizer)
    assert cut.push(tokenizer.encode("é")[:1]) == ""
    assert cut.flush() == ""  # a character whose last bytes never came is dropped, not U+FFFD

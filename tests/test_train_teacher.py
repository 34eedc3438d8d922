"""Teacher-forced data: the target's prefill over fixed text gives the same features and argmax
as one unpadded pass per sequence, and each label mode labels the slots it says it does."""

from dataclasses import replace

import pytest
import torch

from dcoco.checkpoint import load_target
from dcoco.paths import TINY_TARGET
from dcoco.tokenizer import END_OF_TEXT, IM_END, Tokenizer
from dcoco.train.data import Continuations, Labels
from dcoco.train.run_config import RunConfig
from dcoco.train.run_prompts import RunPrompt
from dcoco.train.run_teacher import Prefiller, prefill

BLOCK = 4


def text_rows() -> Continuations:
    """Two rows: prompt 0..2, then text; `predicted` leaves the text at known places."""
    tokens = torch.tensor(
        [
            [5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17, 18],
            [5, 6, 7, 20, 21, 22, 23, 24, 0, 0, 0, 0],
        ]
    )  # [S, T]
    predicted = tokens.clone()  # [S, T]
    predicted[0, 5] = 99  # the target would not write 12 at position 5
    predicted[0, 9] = 98
    predicted[1, 4] = 97
    return Continuations(tokens, torch.tensor([3, 3]), torch.tensor([12, 8]), predicted=predicted)


def expected(data: Continuations, row: int, anchor: int, mode: Labels) -> list[int]:
    """Slot labels written out one by one."""
    out = []
    length = int(data.lengths[row])
    assert data.predicted is not None
    for p in range(BLOCK):
        at = anchor + p + 1
        if at >= length:
            out.append(-100)
            continue
        if mode is Labels.TEXT:
            out.append(int(data.tokens[row, at]))
            continue
        prefix = range(anchor + 1, at)
        off = any(int(data.tokens[row, j]) != int(data.predicted[row, j]) for j in prefix)
        out.append(-100 if mode is Labels.AGREED and off else int(data.predicted[row, at]))
    return out


@pytest.mark.parametrize("mode", list(Labels))
def test_each_label_mode_labels_the_slots_it_names(mode: Labels) -> None:
    data = replace(text_rows(), labels=mode)
    rows = torch.tensor([0, 1, 0, 1])  # [N]
    tokens, starts, labels = data.batch(rows, 6, BLOCK, torch.Generator().manual_seed(0))
    assert tokens.shape == (4, 12)
    for i, row in enumerate(rows.tolist()):
        for a, anchor in enumerate(starts[i].tolist()):
            assert labels[i, a].tolist() == expected(data, row, anchor, mode), (row, anchor)


def test_agreed_labels_stop_where_the_text_leaves_the_greedy_path() -> None:
    data = replace(text_rows(), labels=Labels.AGREED)
    assert data.predicted is not None
    # anchor 3 (token 10): slot 0 is position 4, slot 1 position 5 (text 12, argmax 99): the
    # argmax label 99 still counts, as its prefix (position 4) is on the path; slot 2 does not.
    expected_row = [11, 99, -100, -100]
    assert expected(data, 0, 3, Labels.AGREED) == expected_row
    rows = torch.zeros(64, dtype=torch.long)  # [N]
    _, starts, labels = data.batch(rows, 8, BLOCK, torch.Generator().manual_seed(1))
    at_three = labels[starts == 3]  # [M, B]
    assert len(at_three) > 0
    assert (at_three == torch.tensor(expected_row)).all()


def test_rows_without_predictions_label_with_their_tokens_in_every_mode() -> None:
    plain = replace(text_rows(), predicted=None)
    rows = torch.tensor([0, 1])  # [N]
    got = [
        replace(plain, labels=mode).batch(rows, 5, BLOCK, torch.Generator().manual_seed(2))[2]
        for mode in Labels
    ]
    assert all(torch.equal(got[0], g) for g in got[1:])


def test_a_padded_prefill_equals_one_pass_per_sequence() -> None:
    target = load_target(TINY_TARGET)
    tokenizer = Tokenizer.from_dir(TINY_TARGET)
    layers = (1, 3)
    sequences = [[3, *range(40, 52)], [2, *range(60, 66)], [4, *range(70, 90)]]
    answers = prefill(target, sequences, layers, tokenizer.token_id(END_OF_TEXT), argmax=True)
    for sequence, answer in zip(sequences, answers, strict=True):
        assert answer.prompt == sequence[1 : 1 + sequence[0]]
        assert answer.prompt + answer.output == sequence[1:]
        tokens = torch.tensor([sequence[1:]])  # [1, T]
        with torch.no_grad():
            hidden, feats = target(
                tokens, torch.arange(tokens.shape[1])[None], feature_layers=layers
            )
        assert feats is not None
        assert answer.features is not None
        assert answer.features.shape == (tokens.shape[1] - 1, feats.shape[-1])
        torch.testing.assert_close(answer.features, feats[0, :-1], atol=1e-4, rtol=1e-4)
        best = target.logits(hidden[0]).argmax(-1)  # [T]
        assert answer.predicted is not None
        assert answer.predicted[0] == tokens[0, 0]
        assert torch.equal(answer.predicted[1:], best[:-1])


def test_a_shard_holds_prompt_and_cut_answer_and_skips_what_cannot_train() -> None:
    """Skipped: a prompt without an answer, one too long, and a sampled pass's repeat."""
    tokenizer = Tokenizer.from_dir(TINY_TARGET)
    cfg = replace(
        RunConfig(), shard_sequences=3, max_prompt_tokens=64, max_new_tokens=8, precision="fp32"
    )
    short = "The answer is 4."
    prompts = [
        RunPrompt("math", "a", ({"role": "user", "content": "What is 2 + 2?"},), short),
        RunPrompt("math", "b", ({"role": "user", "content": "No answer here."},), "  "),
        RunPrompt("math", "c", ({"role": "user", "content": "x " * 200},), short),
        RunPrompt("math", "d", ({"role": "user", "content": "Count."},), "one two " * 20),
        RunPrompt("math", "e", ({"role": "user", "content": "And 3 + 3?"},), "It is 6."),
    ]
    prompts.insert(1, replace(prompts[0], temperature=1.0))  # a sampled pass: its text was read
    prefiller = Prefiller(
        load_target(TINY_TARGET), tokenizer, prompts, 0, cfg, (1, 3), argmax=False
    )
    while (taken := prefiller.take_shard()) is None:
        prefiller.step()
    shard, skipped = taken
    assert (len(shard), skipped, prefiller.cursor) == (3, 3, 6)
    assert prefiller.exhausted
    assert shard.predicted is None
    assert shard.teacher_forced
    end = tokenizer.token_id(IM_END)
    answers = {
        tokenizer.decode(row[int(p) : int(n)].tolist()): row[int(n) - 1].item()
        for row, p, n in zip(shard.tokens, shard.prompt_lens, shard.lengths, strict=True)
    }
    assert answers[short] == end  # a whole answer closes its turn
    cut = [text for text in answers if text.startswith("one two")]
    assert len(cut) == 1
    assert answers[cut[0]] != end  # a cut one does not
    assert int((shard.lengths - shard.prompt_lens).max()) == cfg.max_new_tokens
    assert shard.features is not None
    assert shard.features.shape[0] == int((shard.lengths - 1).sum())

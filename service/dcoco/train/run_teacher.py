"""The long run's teacher-forced data: the target's prefill over fixed text, in shards.

Each prompt of the run's stream is rendered with the chat template and followed by the text's
own answer (`RunPrompt.answer`) and `<|im_end|>`. One causal pass of the target over it, in the
engine's precision, gives the target's features at the drafter's layers at every position and
its argmax at every position: the data of a self-distilled shard without decoding, so at the
cost of a prefill (compute-bound, many hundreds of tokens a second on one core). What the
slots learn, the text or the target's argmax, is `Continuations.labels`, chosen at training.

The prompts are consumed in order from a cursor that advances only when a shard is taken, so
a stopped leg repeats at most the shard it was building.
"""

from dataclasses import replace

import torch

from dcoco.model.causal_lm import CausalLM
from dcoco.precision import ACTIVATIONS
from dcoco.shared.options import Precision
from dcoco.tokenizer import END_OF_TEXT, IM_END, Tokenizer
from dcoco.train.data import Continuations
from dcoco.train.distill_stage import Answer, pack
from dcoco.train.run_config import RunConfig
from dcoco.train.run_prompts import RunPrompt

LOGIT_ROWS = 8_192  # positions per lm_head chunk: [8192, 49152] bf16 logits are 0.8 GB


class Prefiller:
    """Teacher-forced shards from the prompts at and after `start`; with `argmax`, each
    position's argmax too (the lm_head costs about a fifth more than the layers alone)."""

    def __init__(
        self,
        target: CausalLM,
        tokenizer: Tokenizer,
        prompts: list[RunPrompt],
        start: int,
        cfg: RunConfig,
        feature_layers: tuple[int, ...],
        argmax: bool,
    ) -> None:
        dtype = ACTIVATIONS[Precision(cfg.precision)]
        self.target = target.to(dtype).eval()  # in place, as the engine's runner does
        self.tokenizer, self.prompts, self.cfg = tokenizer, prompts, cfg
        self.feature_layers, self.argmax = feature_layers, argmax
        self.cursor = start  # the next prompt to read
        self.skipped = 0  # prompts without an answer, or too long, since the last shard
        self.pending: list[list[int]] = []  # encoded sequences not yet prefilled
        self.done: list[Answer] = []
        self.made = 0  # answer tokens prefilled by this prefiller: label tokens

    @property
    def exhausted(self) -> bool:
        return self.cursor >= len(self.prompts) and not self.pending and not self.done

    def step(self) -> None:
        """Encodes the next shard's sequences when none are pending, then prefills one batch."""
        if not self.pending and not self.done:
            self.pending = self._encode(self.cfg.shard_sequences)
        batch = self._next_batch()
        if batch:
            self.done += prefill(self.target, batch, self.feature_layers, self.pad, self.argmax)
            self.made += sum(len(s) - 1 - s[0] for s in batch)

    def take_shard(self) -> tuple[Continuations, int] | None:
        """The next shard and the prompts it skipped, once all its sequences are prefilled."""
        if self.pending or not self.done:
            return None
        width = self.cfg.max_prompt_tokens + self.cfg.max_new_tokens
        shard = pack(self.done, width, self.pad, self.feature_layers)
        skipped, self.skipped, self.done = self.skipped, 0, []
        return replace(shard, teacher_forced=True), skipped

    @property
    def pad(self) -> int:
        return self.tokenizer.token_id(END_OF_TEXT)

    def _encode(self, count: int) -> list[list[int]]:
        """Up to `count` sequences from the cursor on, each as [prompt length, *token ids]: the
        prompt, then the answer cut to max_new_tokens, closed by <|im_end|> when it fits. A
        sampled pass's prompt is skipped: its text was read in the greedy pass."""
        found: list[list[int]] = []
        end = self.tokenizer.token_id(IM_END)
        while len(found) < count and self.cursor < len(self.prompts):
            prompt = self.prompts[self.cursor]
            self.cursor += 1
            ids = self.tokenizer.encode(self.tokenizer.render_chat(list(prompt.messages)))
            answer = [*self.tokenizer.encode(prompt.answer.strip()), end]
            if prompt.temperature or len(answer) < 2 or len(ids) > self.cfg.max_prompt_tokens:
                self.skipped += 1
                continue
            found.append([len(ids), *ids, *answer[: self.cfg.max_new_tokens]])
        return sorted(found, key=len)  # similar lengths batch with little padding

    def _next_batch(self) -> list[list[int]]:
        """The shortest pending sequences that fit in prefill_tokens once padded (at least
        one)."""
        taken = 1
        while (
            taken < len(self.pending)
            and (taken + 1) * len(self.pending[taken]) <= self.cfg.prefill_tokens
        ):
            taken += 1
        batch, self.pending = self.pending[:taken], self.pending[taken:]
        return batch


@torch.no_grad()
def prefill(
    target: CausalLM, batch: list[list[int]], layers: tuple[int, ...], pad: int, argmax: bool
) -> list[Answer]:
    """Sequences [prompt length, *tokens] -> Answers with the features at every position but
    the last and, with `argmax`, `predicted`: the target's argmax for each position (the first
    position, which nothing predicts, holds its own token)."""
    lengths = [len(s) - 1 for s in batch]
    tokens = torch.full((len(batch), max(lengths)), pad, dtype=torch.int64)  # [N, T]
    for row, sequence in enumerate(batch):
        tokens[row, : lengths[row]] = torch.tensor(sequence[1:])  # [len]
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)  # [N, T]
    # Right padding is harmless: causal attention keeps pads out of every earlier position.
    hidden, feats = target(tokens, positions, feature_layers=layers)  # [N, T, H], [N, T, F]
    assert feats is not None
    predicted = None
    if argmax:
        flat = hidden.flatten(0, 1)  # [N*T, H]
        best = torch.cat(
            [
                target.logits(flat[i : i + LOGIT_ROWS]).argmax(-1)
                for i in range(0, len(flat), LOGIT_ROWS)
            ]
        ).view_as(tokens)  # [N, T] the argmax after each position
        predicted = torch.cat([tokens[:, :1], best[:, :-1]], dim=1)  # [N, T] for each position
    return [
        Answer(
            sequence[1 : 1 + sequence[0]],
            sequence[1 + sequence[0] :],
            feats[row, : lengths[row] - 1].clone(),  # [len - 1, F]
            None if predicted is None else predicted[row, : lengths[row]].clone(),  # [len]
        )
        for row, sequence in enumerate(batch)
    ]

"""Stage 4: the target's own greedy continuations of training prompts, for self-distillation.

Drafters learn what the verifier will actually check: its greedy choices after its own
greedy prefix, which real text stops matching a few tokens in. The engine generates them in the
precision inference runs, in one continuously refilled batch, and can keep the target features
it computes on the way, which spares the drafter stages a pass of a large target.
"""

import random
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from dcoco.engine.engine import Engine
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams
from dcoco.tokenizer import END_OF_TEXT, Tokenizer, chat_prompt
from dcoco.train.config import DistillConfig
from dcoco.train.corpus import Record
from dcoco.train.data import Continuations


def distill_prompts(
    tokenizer: Tokenizer, records: list[Record], cfg: DistillConfig, seed: int
) -> list[list[int]]:
    """Up to max_prompts encoded chat prompts from shuffled training records."""
    order = list(records)
    random.Random(seed).shuffle(order)
    prompts = []
    for record in order:
        ids = tokenizer.encode(chat_prompt(tokenizer, record.user))
        if len(ids) <= cfg.max_prompt_tokens:
            prompts.append(ids)
        if len(prompts) == cfg.max_prompts:
            break
    return prompts


def distilling_engine(
    target: CausalLM,
    tokenizer: Tokenizer,
    rows: int,
    max_len: int,
    precision: str,
    feature_layers: tuple[int, ...],
) -> Engine:
    """A plain greedy engine over `rows` sequences of up to `max_len` tokens in `precision`,
    keeping the features of `feature_layers` for every token it generates. Each decoding row
    reads its own context (`EngineConfig.own_rows`) where the cache is fp32."""
    return Engine(
        target,
        None,
        EngineConfig(
            mode=Mode.VANILLA,
            max_batch_size=rows,
            max_model_len=max_len,
            eos_token_ids=tokenizer.eos_token_ids,
            precision=Precision(precision),
            feature_layers=feature_layers,
            own_rows=True,  # rows of 20 to 770 positions: 1.11-1.17x the label tokens a second
        ),
    )


@torch.no_grad()
def generate_continuations(
    target: CausalLM,
    tokenizer: Tokenizer,
    prompts: list[list[int]],
    cfg: DistillConfig,
    feature_layers: tuple[int, ...] = (),
) -> Continuations:
    """Greedy continuations until the budget runs out; unfinished requests are dropped, and so
    are those whose continuation has fewer than 2 tokens (no block with a label). With
    `feature_layers`, the target's features at those layers are kept too."""
    max_len = cfg.max_prompt_tokens + cfg.max_new_tokens
    engine = distilling_engine(
        target, tokenizer, cfg.batch_size, max_len, cfg.precision, feature_layers
    )
    params = SamplingParams(max_tokens=cfg.max_new_tokens)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    outputs: dict[int, list[int]] = {}
    features: dict[int, list[torch.Tensor]] = {}
    finished: list[int] = []
    deadline = time.perf_counter() + cfg.budget_s
    with tqdm(total=len(prompts), desc="distill", unit="seq") as bar:
        while engine.has_unfinished() and time.perf_counter() < deadline:
            for out in engine.step().outputs:
                request = int(out.request_id)
                outputs.setdefault(request, []).extend(out.new_token_ids)
                if out.features is not None:
                    features.setdefault(request, []).append(out.features)
                if out.finished:
                    finished.append(request)
                    bar.update(1)
    kept = sorted(i for i in finished if len(outputs[i]) >= 2)
    answers = [
        Answer(prompts[i], outputs[i], torch.cat(features[i]) if feature_layers else None)
        for i in kept
    ]
    width = cfg.max_prompt_tokens + cfg.max_new_tokens
    return pack(answers, width, tokenizer.token_id(END_OF_TEXT), feature_layers)


@dataclass(frozen=True)
class Answer:
    """One finished continuation: its prompt, the target's tokens, and the features at every
    position but the last ([len(prompt) + len(output) - 1, F]), when kept. A fixed text's
    answer (`run_teacher`) may carry the target's argmax for each position, `predicted`."""

    prompt: list[int]
    output: list[int]
    features: torch.Tensor | None
    predicted: torch.Tensor | None = None  # [len(prompt) + len(output)]


def pack(
    answers: list[Answer], width: int, pad: int, feature_layers: tuple[int, ...]
) -> Continuations:
    """Answers as one padded Continuations table of `width` columns; `predicted` is kept
    when every answer has it."""
    tokens = torch.full((len(answers), width), pad, dtype=torch.int64)  # [S, T]
    predicted = tokens.clone()  # [S, T]
    for row, answer in enumerate(answers):
        sequence = answer.prompt + answer.output
        tokens[row, : len(sequence)] = torch.tensor(sequence)  # [len]
        if answer.predicted is not None:
            predicted[row, : len(sequence)] = answer.predicted  # [len]
    prompt_lens = torch.tensor([len(a.prompt) for a in answers], dtype=torch.int64)  # [S]
    lengths = torch.tensor([len(a.prompt) + len(a.output) for a in answers])  # [S]
    kept = predicted if all(a.predicted is not None for a in answers) else None
    if not feature_layers:
        return Continuations(tokens, prompt_lens, lengths, predicted=kept)
    table = torch.cat([a.features for a in answers if a.features is not None])  # [P, F]
    offsets = torch.cumsum(lengths - 1, 0) - (lengths - 1)  # [S]
    return Continuations(tokens, prompt_lens, lengths, table, offsets, feature_layers, kept)

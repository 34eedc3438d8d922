"""Adopting self-distilled shards made outside this run, so that costly answers are not made
twice: `dcoco train-run --adopt FILE`.

Self-distillation is the run's costliest data (about 30 label tokens a CPU-second on one core),
so a shard that an earlier run of the same prompt stream wrote (one stopped before its
checkpoint could be kept, say) can join this run as its next shard. Each answer's prompt is
found by its token ids among the stream's prompts still to answer; those count as done, and the
stream's prompts before the last of them that it does not answer are generated again (the
run's `redo`). A shard whose answers are not all in the stream, that keeps other layers' features
or that holds teacher-forced text is refused with one line.
"""

from pathlib import Path

from dcoco.checkpoint import CheckpointError
from dcoco.tokenizer import Tokenizer
from dcoco.train.data import Continuations
from dcoco.train.run_config import RunConfig
from dcoco.train.run_data import Position, answer_tokens, for_corrector, write_shard
from dcoco.train.run_prompts import RunPrompt


def adopt(
    path: Path,
    work: Path,
    position: Position,
    prompts: list[RunPrompt],
    tokenizer: Tokenizer,
    cfg: RunConfig,
    feature_layers: tuple[int, ...],
) -> int:
    """Writes the shard at `path` as the run's next shard and counts it; returns the number of
    prompts it answers."""
    shard = Continuations.load(path)
    width = cfg.max_prompt_tokens + cfg.max_new_tokens
    if shard.teacher_forced or shard.features is None:
        raise CheckpointError(f"{path}: not a self-distilled shard with features")
    if shard.feature_layers != feature_layers or shard.tokens.shape[1] != width:
        raise CheckpointError(
            f"{path}: features of layers {shard.feature_layers} and width "
            f"{shard.tokens.shape[1]}, this run keeps {feature_layers} and {width}"
        )
    rows = [tuple(shard.tokens[r, : int(shard.prompt_lens[r])].tolist()) for r in range(len(shard))]
    limit = position.next_prompt + 4 * len(rows) + cfg.batch_size
    found = open_indices(rows, prompts, tokenizer, position, limit)
    if len(found) < len(rows):
        raise CheckpointError(
            f"{path}: {len(rows) - len(found)} of {len(rows)} answers answer no prompt this "
            "run has still to answer; it was made with other prompt settings, or the run "
            "answered them already"
        )
    last = max(found)
    before = set(position.redo) | set(range(position.next_prompt, last + 1))
    position.redo = sorted(before - set(found))
    position.next_prompt = max(position.next_prompt, last + 1)
    write_shard(work, position.shards, shard)
    tokens = answer_tokens(shard)
    position.answers += len(shard)
    position.label_tokens += tokens
    if for_corrector(position.shards, cfg):
        position.corrector_tokens += tokens
    position.shards += 1
    return len(found)


def open_indices(
    rows: list[tuple[int, ...]],
    prompts: list[RunPrompt],
    tokenizer: Tokenizer,
    position: Position,
    limit: int,
) -> list[int]:
    """The stream index of each row's prompt among those no written shard answers yet (the
    run's `redo`, then those from `next_prompt` up to `limit`). A prompt the stream repeats
    (a sampled pass over prompts answered greedily before) is booked at its first open
    occurrence, never at one already answered, so that every occurrence is answered once."""
    wanted: dict[tuple[int, ...], int] = {}
    for row in rows:
        wanted[row] = wanted.get(row, 0) + 1
    found: list[int] = []
    for index in [*position.redo, *range(position.next_prompt, min(limit, len(prompts)))]:
        prompt = prompts[index]
        ids = tuple(tokenizer.encode(tokenizer.render_chat(list(prompt.messages))))
        if wanted.get(ids, 0) > 0:
            wanted[ids] -= 1
            found.append(index)
            if len(found) == len(rows):
                break
    return found

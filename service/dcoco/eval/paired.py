"""A cheap, paired measure for the data-source A/B: teacher-forced acceptance on fixed greedy
completions of the evaluation suites.

    python -m dcoco.eval.paired --limit 8 --completions build/ab/completions.json \\
        shipped=models/smollm2/dflash argmax=build/ab/argmax/step-240/dflash

The target's greedy completions of each suite's first prompts are generated once (plain
decoding, bf16, all prompts of a suite in one batch) and kept in a file; every drafter is then
measured on the same tokens, as `dcoco eval`'s coverage table measures it: a block drafted at
every position, the top-1 draft's accepted length and top-K coverage by depth. Under greedy
decoding the teacher-forced accepted length is what speculative decoding would accept on those
completions, without running the engine once per drafter. For a drafter with a corrector, the
corrector's walk under each of `--rules` is measured on the same blocks (the seed's ablations:
`docs/ablations.md`). With `--temperature T`, the completions are sampled at T and each draft's
expected accepted length at T is measured instead (`dcoco.eval.expected`).
"""

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from dcoco.checkpoint import load_drafter, load_target
from dcoco.engine.engine import Engine
from dcoco.eval.cli import encode_suite
from dcoco.eval.coverage import measure_coverage
from dcoco.eval.expected import expected_accepted_length
from dcoco.model.causal_lm import CausalLM
from dcoco.paths import DEFAULT_HELDOUT, DEFAULT_TARGET
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision, Rule
from dcoco.shared.sampling import SamplingParams
from dcoco.spec.drafter import DFlashDrafter
from dcoco.suites import SUITES, load_suite
from dcoco.tokenizer import Tokenizer

MAX_MODEL_LEN = 1024
Pairs = list[tuple[list[int], list[int]]]  # (prompt ids, completion ids)


def completions(
    target_folder: Path, heldout: Path, limit: int, max_tokens: int, temperature: float = 0.0
) -> dict[str, Pairs]:
    """Each suite's first `limit` prompts with the target's completions, in bf16: greedy, or
    sampled at `temperature` (seeded, so the file can be made again)."""
    tokenizer = Tokenizer.from_dir(target_folder)
    target = load_target(target_folder)
    cfg = EngineConfig(
        mode=Mode.VANILLA,
        max_batch_size=limit,
        max_model_len=MAX_MODEL_LEN,
        eos_token_ids=tokenizer.eos_token_ids,
        precision=Precision.BF16,
    )
    engine = Engine(target, None, cfg)
    found: dict[str, Pairs] = {}
    for name in SUITES:
        prompts = encode_suite(
            load_suite(name, heldout), tokenizer, limit, MAX_MODEL_LEN - max_tokens
        )
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=0)
        done, _ = engine.generate(prompts, params)
        found[name] = [(p, c.token_ids) for p, c in zip(prompts, done, strict=True)]
    return found


def arm_coverage(
    target_folder: Path,
    drafter_folder: Path,
    pairs: dict[str, Pairs],
    top_k: int,
    rules: tuple[Rule, ...] = (),
) -> dict[str, Any]:
    """One drafter's teacher-forced figures per suite and their means over suites; the walks
    under `rules` when the drafter has a corrector."""
    target, drafter = bf16_pair(target_folder, drafter_folder)
    walked = rules if drafter.corrector is not None else ()
    with torch.no_grad():
        per_suite = {
            name: measure_coverage(target, drafter, suite, top_k, walked)
            for name, suite in pairs.items()
        }
    found = list(per_suite.values())

    def mean(values: list[float]) -> float:
        return round(sum(values) / len(values), 3)

    def by_depth(hits: str) -> list[float]:
        return [
            mean([getattr(c, hits)[p] / max(1, c.slots[p]) for c in found])
            for p in range(drafter.config.block_size)
        ]

    lengths = {n: round(1 + c.top1_accepted / max(1, c.blocks), 3) for n, c in per_suite.items()}
    walks = {
        rule.value: {
            n: round(1 + c.walk_accepted[rule.value] / max(1, c.blocks), 3)
            for n, c in per_suite.items()
        }
        for rule in walked
    }
    top1, topk = by_depth("top1"), by_depth("topk")
    return {
        "accepted_length": lengths,
        "mean_accepted_length": mean(list(lengths.values())),
        "oracle_walk": mean([1 + c.oracle_accepted / max(1, c.blocks) for c in found]),
        "top1_slot1": top1[0],
        "topk_slot1": topk[0],
        "top1_slot15": top1[-1],
        "topk_slot15": topk[-1],
        "top1_by_depth": top1,
        "topk_by_depth": topk,
        "walk_accepted_length": walks,
        "mean_walk_accepted_length": {rule: mean(list(w.values())) for rule, w in walks.items()},
    }


def arm_expected(
    target_folder: Path,
    drafter_folder: Path,
    pairs: dict[str, Pairs],
    top_k: int,
    temperature: float,
    rules: tuple[Rule, ...] = (),
) -> dict[str, Any]:
    """One drafter's expected accepted lengths at `temperature` per suite (`eval.expected`),
    for its top-1 draft and, with a corrector, each rule's walk; and their means over suites."""
    target, drafter = bf16_pair(target_folder, drafter_folder)
    walked = rules if drafter.corrector is not None else ()
    per_suite = {
        name: expected_accepted_length(target, drafter, suite, top_k, temperature, walked)
        for name, suite in pairs.items()
    }
    drafts = next(iter(per_suite.values())).keys()
    lengths = {d: {n: per_suite[n][d] for n in per_suite} for d in drafts}
    means = {d: round(sum(v.values()) / len(v), 3) for d, v in lengths.items()}
    return {"temperature": temperature, "expected_accepted_length": lengths, "mean": means}


def bf16_pair(target_folder: Path, drafter_folder: Path) -> tuple[CausalLM, DFlashDrafter]:
    target = load_target(target_folder).to(torch.bfloat16)
    drafter = load_drafter(drafter_folder).to(torch.bfloat16)
    if drafter.mask_embedding is not None:
        drafter.mask_embedding = drafter.mask_embedding.to(torch.bfloat16)
    return target, drafter


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m dcoco.eval.paired")
    parser.add_argument("arms", nargs="+", help="NAME=drafter folder")
    parser.add_argument("--limit", type=int, default=8, help="prompts per suite")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--completions", type=Path, required=True, help="made once, then read")
    parser.add_argument(
        "--rules",
        nargs="*",
        choices=[r.value for r in Rule],
        default=[Rule.PREFIX.value],
        help="the corrector walks to measure for drafters with a corrector (default: prefix)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="above 0: completions sampled at it, and each draft's expected accepted length "
        "at it (dcoco.eval.expected) instead of the greedy figures; give its own --completions",
    )
    args = parser.parse_args()
    if not 0.0 <= args.temperature <= 100.0:
        parser.error(f"--temperature must be in [0, 100], got {args.temperature}")
    torch.set_num_threads(args.threads)
    if not args.completions.exists():
        args.completions.parent.mkdir(parents=True, exist_ok=True)
        made = completions(
            DEFAULT_TARGET, DEFAULT_HELDOUT, args.limit, args.max_tokens, args.temperature
        )
        args.completions.write_text(json.dumps(made))
    pairs = {k: [(p, c) for p, c in v] for k, v in json.loads(args.completions.read_text()).items()}
    for arm in args.arms:
        name, folder = arm.split("=", 1)
        rules = tuple(Rule(r) for r in args.rules)
        if args.temperature > 0:
            figures = arm_expected(
                DEFAULT_TARGET, Path(folder), pairs, args.top_k, args.temperature, rules
            )
        else:
            figures = arm_coverage(DEFAULT_TARGET, Path(folder), pairs, args.top_k, rules)
        print(json.dumps({"arm": name} | figures), flush=True)


if __name__ == "__main__":
    main()

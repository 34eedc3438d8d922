"""`dcoco eval`: every variant on every suite and setting, then coverage, tables and plots."""

import argparse
import functools
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dcoco.checkpoint import CheckpointError, load_drafter, load_target
from dcoco.eval.coverage import measure_coverage
from dcoco.eval.plots import acceptance_by_position, coverage_by_depth, speedup_by_suite
from dcoco.eval.report import goals, markdown, run_record
from dcoco.eval.runner import SETTINGS, VARIANTS, Measurement, Models, compare_to_vanilla, measure
from dcoco.paths import REPO_ROOT
from dcoco.precision import WIDTHS, cost_table
from dcoco.shared.engine_config import DEFAULT_CACHE_DIR
from dcoco.shared.errors import UsageError
from dcoco.shared.options import Precision, Rule
from dcoco.spec.drafter import DFlashDrafter
from dcoco.suites import Suite, file_suite, load_suite
from dcoco.tokenizer import Tokenizer, TokenizerError, chat_prompt

COVERAGE_DRAFTERS = ("dflash", "dcoco")


def load_models(folder: Path, needed: set[str], precision: Precision) -> tuple[Models, Tokenizer]:
    tokenizer = Tokenizer.from_dir(folder / "target")
    target = load_target(folder / "target")
    if precision is Precision.AUTO:  # one choice for every variant, measured once
        precision = cost_table(target, WIDTHS, DEFAULT_CACHE_DIR).fastest()
    drafters = {name: load_drafter(folder / name) for name in sorted(needed)}
    fp32 = functools.cache(lambda: load_target(folder / "target"))
    models = Models(target, drafters, tokenizer.eos_token_ids, precision, fp32)
    return models, tokenizer


def encode_suite(
    suite: Suite, tokenizer: Tokenizer, limit: int, max_prompt: int
) -> list[list[int]]:
    """The first `limit` prompts that leave room for the generation."""
    encoded = []
    for text in suite.prompts:
        ids = tokenizer.encode(chat_prompt(tokenizer, text))
        if len(ids) <= max_prompt:
            encoded.append(ids)
        if len(encoded) == limit:
            break
    if not encoded:
        raise UsageError(f"suite {suite.name}: no prompt fits in {max_prompt} tokens")
    return encoded


def shown(path: Path) -> str:
    """The path relative to the repository when it lies inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT) if resolved.is_relative_to(REPO_ROOT) else path)


def top_k(drafters: dict[str, DFlashDrafter]) -> int:
    corrected = [d.corrector.config.top_k for d in drafters.values() if d.corrector is not None]
    return corrected[0] if corrected else 16


def evaluate(args: argparse.Namespace) -> tuple[dict[str, Any], list[Measurement]]:
    """Every run, then coverage; returns the results file's content and the measurements."""
    variants = [v for v in VARIANTS if v.name in args.variants]
    settings = [s for s in SETTINGS if s.name in args.settings]
    needed = {v.drafter for v in variants if v.drafter} | set(COVERAGE_DRAFTERS)
    try:
        suites = [load_suite(name, args.models / "heldout") for name in args.suites]
        suites += [file_suite(path) for path in args.prompts]
        models, tokenizer = load_models(args.models, needed, Precision(args.precision))
    except (CheckpointError, TokenizerError, OSError) as problem:
        raise UsageError(str(problem)) from None
    names = [s.name for s in suites]
    if len(set(names)) < len(names):
        raise UsageError(f"two suites share a name: {sorted(names)}; rename the --prompts file")
    block = max((d.config.block_size for d in models.drafters.values()), default=0)
    max_prompt = args.max_model_len - args.max_tokens - block - 2
    if max_prompt < 1:
        raise UsageError(f"--max-tokens {args.max_tokens} leaves no room for a prompt")
    prompts = {s.name: encode_suite(s, tokenizer, args.limit, max_prompt) for s in suites}
    load_before = os.getloadavg()
    runs: list[Measurement] = []
    plan = [(st, su, v) for st in settings for su in suites for v in variants]
    for setting, suite, variant in tqdm(plan, desc="eval", unit="run"):
        runs.append(
            measure(
                models,
                variant,
                setting,
                suite.name,
                prompts[suite.name],
                args.max_tokens,
                args.max_model_len,
            )
        )
    compare_to_vanilla(runs)
    k = top_k(models.drafters)
    coverage: dict[str, dict[str, dict[str, Any]]] = {}
    greedy: dict[str, Measurement] = {}  # the first greedy setting's vanilla completions
    for m in runs:
        if m.variant == "vanilla" and m.setting.startswith("greedy"):
            greedy.setdefault(m.suite, m)
    for name in COVERAGE_DRAFTERS:
        coverage[name] = {}
        for suite_name, run in greedy.items():
            pairs = list(zip(prompts[suite_name], run.token_ids, strict=True))
            drafter = models.drafters[name]
            rules = (Rule.PREFIX,) if drafter.corrector is not None else ()
            coverage[name][suite_name] = measure_coverage(
                models.target, drafter, pairs, k, rules
            ).summary()
    command = (
        "dcoco eval " + shlex.join(sys.argv[2:]) if sys.argv[1:2] == ["eval"] else "dcoco eval"
    )
    return {
        "config": {
            "command": command,
            "models": shown(args.models),
            "limit": args.limit,
            "max_tokens": args.max_tokens,
            "max_model_len": args.max_model_len,
            "precision": models.precision.value,
            "precision_asked": args.precision,
            "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            # Other work on the machine skews tokens/s (never accepted lengths): 1-minute load
            # averages before and after the runs; above the thread count means contention.
            "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "top_k": k,
            "block_size": block,
            "variants": [v.name for v in variants],
            "settings": [s.name for s in settings],
        },
        "suites": {s.name: {"source": s.source, "prompts": len(prompts[s.name])} for s in suites},
        "runs": [run_record(m) for m in runs],
        "coverage": coverage,
        "goals": goals(runs, coverage),
    }, runs


def run_eval(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    results, runs = evaluate(args)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval-results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "eval-results.md").write_text(markdown(results, runs))
    first = results["config"]["settings"][0]
    acceptance_by_position(runs, first, out / "eval-acceptance-by-position.png")
    coverage_by_depth(results["coverage"], "dflash", out / "eval-coverage-by-depth.png")
    speedup_by_suite(runs, first, out / "eval-speedup-by-suite.png")
    print(markdown(results, runs))

"""`dcoco generate`: run prompts through the embedded engine, for people and for scripts."""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from dcoco.checkpoint import CheckpointError
from dcoco.engine.engine import Engine
from dcoco.engine.load import load_engine
from dcoco.engine.outputs import Completion
from dcoco.settings import EngineSettings, settings_from
from dcoco.shared.errors import UsageError
from dcoco.shared.prompt_files import read_prompts
from dcoco.shared.sampling import SamplingParams
from dcoco.tokenizer import Tokenizer, TokenizerError


def run_generate(args: argparse.Namespace) -> None:
    prompts = [args.prompt] if args.prompt is not None else read_prompts(Path(args.prompts))
    try:
        tokenizer = Tokenizer.from_dir(args.target)
        engine = build_engine(args, tokenizer)
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
        )
        encoded = [encode(tokenizer, text, args.chat) for text in prompts]
        completions, _ = engine.generate(encoded, params)
    except (CheckpointError, TokenizerError, ValueError) as problem:
        raise UsageError(str(problem)) from None
    for text, completion in zip(prompts, completions, strict=True):
        print(render(text, completion, tokenizer, args.json))
        sys.stdout.flush()


def build_engine(args: argparse.Namespace, tokenizer: Tokenizer) -> Engine:
    settings = settings_from(EngineSettings, args)
    if settings.mode.needs_drafter and args.drafter is None:
        raise UsageError(f"--mode {settings.mode} needs --drafter")
    # One batch of prompts, then exit: compiling in the background would not pay.
    cfg = replace(settings.engine_config(tokenizer.eos_token_ids), compile=False)
    engine = load_engine(Path(args.target), Path(args.drafter) if args.drafter else None, cfg)
    vocab = engine.runner.target.config.vocab_size
    if tokenizer.vocab_size > vocab:
        raise UsageError(
            f"the tokenizer has {tokenizer.vocab_size} tokens, the target only {vocab}"
        )
    return engine


def encode(tokenizer: Tokenizer, text: str, chat: bool) -> list[int]:
    if chat:
        text = tokenizer.render_chat([{"role": "user", "content": text}])
    return tokenizer.encode(text)


def render(prompt: str, completion: Completion, tokenizer: Tokenizer, as_json: bool) -> str:
    text = tokenizer.decode(completion.token_ids)
    if not as_json:
        return text
    record = {
        "prompt": prompt,
        "prompt_tokens": len(completion.prompt_ids),
        "token_ids": completion.token_ids,
        "text": text,
        "finish_reason": completion.finish_reason,
        "stats": completion.stats.to_dict(),
    }
    return json.dumps(record, ensure_ascii=False)

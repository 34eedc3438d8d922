import random

from dcoco.spec.ngram import MAX_N, MIN_N, NgramIndex


def lookup(tokens: list[int], k: int) -> list[int]:
    index = NgramIndex()
    index.extend(tokens)
    return index.draft(k).tokens


def test_the_latest_match_of_the_longest_suffix_is_continued() -> None:
    tokens = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 4, 1, 2, 3]
    # [1, 2, 3] occurs at the start only; [2, 3] also later (followed by 7), but the longer wins.
    assert lookup(tokens, 3) == [9, 9, 5]
    assert lookup(tokens, 1) == [9]
    assert lookup([5, 2, 3, 7, 8, 6, 2, 3], 4) == [7, 8, 6, 2]  # the latest of [2, 3]: one


def test_the_draft_stops_at_the_end_of_the_context() -> None:
    assert lookup([4, 5, 6, 4, 5], 10) == [6, 4, 5]


def test_nothing_is_drafted_without_a_match_of_two_tokens() -> None:
    assert lookup([1, 2, 3, 4], 5) == []
    assert lookup([1, 2, 3, 1], 5) == []  # a single repeated token is not enough
    assert lookup([1, 2], 5) == []
    assert lookup([1, 2, 1, 2], 0) == []


def test_a_repeated_token_run_drafts_more_of_it() -> None:
    assert lookup([7] * 6, 3) == [7, 7]  # the latest earlier match has two successors left


def searched(tokens: list[int], k: int) -> list[int]:
    """The rule in the module's docstring, by searching the whole list."""
    for n in range(min(MAX_N, len(tokens) - 1), MIN_N - 1, -1):
        suffix = tokens[-n:]
        starts = [s for s in range(n, len(tokens)) if tokens[s - n : s] == suffix]
        if starts:
            whole = [s for s in starts if s + k <= len(tokens)]
            start = whole[-1] if whole else starts[0]
            return tokens[start : start + k]
    return []


def test_the_index_drafts_what_a_search_of_the_whole_context_does() -> None:
    """A small vocabulary repeats itself often; the index is extended a few tokens at a time,
    as a sequence's committed tokens extend it."""
    rng = random.Random(0)
    for _ in range(50):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 60))]
        index = NgramIndex()
        done = 0
        while done < len(tokens):
            step = rng.randrange(1, 5)
            index.extend(tokens[done : done + step])
            done = min(len(tokens), done + step)
            for k in (1, 3, 15):
                assert index.draft(k).tokens == searched(tokens[:done], k)


def test_a_draft_names_the_length_of_the_suffix_it_matched() -> None:
    index = NgramIndex()
    index.extend([1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 4, 1, 2, 3])
    assert index.draft(3).n == 3  # [1, 2, 3]
    index.extend([6])
    assert index.draft(3) == ([], 0)

from dcoco.spec.ngram import lookup


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

import pytest
import torch

from dcoco.engine.engine import Engine
from dcoco.engine.prefill import EXPLORE_EVERY
from dcoco.engine.runner import ContextUpdate
from dcoco.engine.sequence import Sequence
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Rule
from dcoco.shared.sampling import SamplingParams
from dcoco.spec.drafter import DFlashDrafter
from factories import greedy_reference, make_target

Pair = tuple[CausalLM, DFlashDrafter]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [3], [2] * 13, [7, 1], [9, 9, 4, 0, 2]]
CONFIGS = [
    (Mode.VANILLA, Rule.PREFIX),
    (Mode.DFLASH, Rule.PREFIX),
    (Mode.DCOCO, Rule.PREFIX),
    (Mode.DCOCO, Rule.GLOBAL),
    (Mode.DCOCO, Rule.DISCOUNTED),
]


def engine(
    pair: Pair, mode: Mode = Mode.DCOCO, rule: Rule = Rule.PREFIX, batch: int = 4, **kw: int
) -> Engine:
    target, drafter = pair
    return Engine(
        target,
        drafter,
        EngineConfig(mode=mode, rule=rule, max_batch_size=batch, max_model_len=96, **kw),
    )


@pytest.mark.parametrize(("mode", "rule"), CONFIGS)
def test_greedy_output_is_token_for_token_the_targets(pair: Pair, mode: Mode, rule: Rule) -> None:
    """Six prompts of mixed lengths through four slots: sequences join as others finish."""
    completions, cycles = engine(pair, mode, rule).generate(PROMPTS, SamplingParams(max_tokens=40))
    for completion, prompt in zip(completions, PROMPTS, strict=True):
        assert completion.token_ids == greedy_reference(pair[0], prompt, 40)
        assert completion.finish_reason == "length"
    if mode is not Mode.VANILLA:  # the test only means something if drafts were accepted
        assert sum(c.accepted_tokens for c in cycles) > 50
        assert any(0 < n < 5 for c in cycles for n in c.accepted_lengths)  # partial acceptance
        assert any(n == 5 for c in cycles for n in c.accepted_lengths)  # whole block
    if mode is Mode.DCOCO:
        assert sum(c.corrected_tokens for c in cycles) > 0


@pytest.mark.parametrize("block", [1, 2, 7])
def test_any_block_size_is_lossless(pair: Pair, block: int) -> None:
    mode = Mode.DCOCO if block > 1 else Mode.DFLASH
    completions, _ = engine(pair, mode, num_speculative_tokens=block).generate(
        PROMPTS[:3], SamplingParams(max_tokens=20)
    )
    for completion, prompt in zip(completions, PROMPTS, strict=False):
        assert completion.token_ids == greedy_reference(pair[0], prompt, 20)


def test_greedy_output_does_not_depend_on_the_batch(pair: Pair) -> None:
    params = SamplingParams(max_tokens=30)
    alone, _ = engine(pair, batch=1).generate([PROMPTS[1]], params)
    crowded, _ = engine(pair, batch=6).generate(PROMPTS, params)
    assert crowded[1].token_ids == alone[0].token_ids


def test_a_seeded_request_replays_whatever_shares_its_batch(pair: Pair) -> None:
    seeded = SamplingParams(max_tokens=30, temperature=0.9, seed=7)
    alone, _ = engine(pair, batch=1).generate([PROMPTS[0]], seeded)
    eng = engine(pair, batch=4)
    eng.add_request("seeded", PROMPTS[0], seeded)
    for i, prompt in enumerate(PROMPTS[1:4]):
        eng.add_request(f"other{i}", prompt, SamplingParams(max_tokens=30, temperature=1.0))
    tokens: list[int] = []
    while eng.has_unfinished():
        tokens += [
            t for out in eng.step().outputs if out.request_id == "seeded" for t in out.new_token_ids
        ]
    assert tokens == alone[0].token_ids
    other_seed, _ = engine(pair, batch=1).generate(
        [PROMPTS[0]], SamplingParams(max_tokens=30, temperature=0.9, seed=8)
    )
    assert other_seed[0].token_ids != tokens


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_seeded_sampled_output_does_not_depend_on_the_speculation(pair: Pair, top_p: float) -> None:
    """Uniforms keyed by output position and the sample-then-match rule: a seeded request's
    tokens are the same plain, with n-gram, DFlash, DCOCO, and with adaptive verification (which
    verifies prefixes of different lengths), alone or in a batch."""
    seeded = SamplingParams(max_tokens=40, temperature=0.3, top_p=top_p, seed=11)
    plain, _ = engine(pair, Mode.VANILLA, batch=1).generate([PROMPTS[1]], seeded)
    runs = {
        "dflash": engine(pair, Mode.DFLASH, batch=1),
        "dcoco": engine(pair, Mode.DCOCO, batch=1),
        "ngram": engine(pair, Mode.NGRAM, batch=6),
        "adaptive": engine(pair, Mode.DCOCO, batch=6, adaptive=True),
    }
    for name, eng in runs.items():
        batch = PROMPTS if name in ("ngram", "adaptive") else [PROMPTS[1]]
        completions, cycles = eng.generate(batch, seeded)
        assert completions[batch.index(PROMPTS[1])].token_ids == plain[0].token_ids, name
        assert sum(c.accepted_tokens for c in cycles) > 0, name  # drafts were really accepted
    verified = {c.draft_tokens // c.verifications for c in cycles}
    assert len(verified) > 1  # the adaptive run verified prefixes of more than one length


def test_abort_frees_the_slot_and_leaves_the_others_intact(pair: Pair) -> None:
    eng = engine(pair, batch=2)
    params = SamplingParams(max_tokens=25)
    for i, prompt in enumerate(PROMPTS[:3]):
        eng.add_request(f"r{i}", prompt, params)
    outputs: dict[str, list[int]] = {"r1": [], "r2": []}
    outputs["r1"] += [
        t for out in eng.step().outputs if out.request_id == "r1" for t in out.new_token_ids
    ]
    assert eng.abort("r0")
    assert not eng.abort("r0")
    first = True
    while eng.has_unfinished():
        for out in eng.step().outputs:
            assert out.request_id != "r0"
            outputs[out.request_id] += out.new_token_ids
        if first:  # r2 took r0's slot in the step right after the abort
            assert outputs["r2"]
            first = False
    assert outputs["r2"] == greedy_reference(pair[0], PROMPTS[2], 25)
    assert outputs["r1"] == greedy_reference(pair[0], PROMPTS[1], 25)  # moved to slot 0


@pytest.mark.parametrize("mode", [Mode.VANILLA, Mode.DCOCO])
def test_sequences_leaving_at_different_steps_move_no_one_elses_cache(
    pair: Pair, mode: Mode
) -> None:
    """Running sequences keep slots 0..n-1: whenever one finishes, the highest moves into its
    slot with its cached prefix (and its drafter context), and its output goes on unchanged."""
    eng = engine(pair, mode, batch=4)
    lengths = [3, 30, 7, 18, 1, 25]
    for i, (prompt, n) in enumerate(zip(PROMPTS, lengths, strict=True)):
        eng.add_request(f"r{i}", prompt, SamplingParams(max_tokens=n))
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
    while eng.has_unfinished():
        for out in eng.step().outputs:
            outputs[out.request_id] += out.new_token_ids
        assert [s.slot for s in eng.scheduler.running] == list(range(len(eng.scheduler.running)))
    for i, (prompt, n) in enumerate(zip(PROMPTS, lengths, strict=True)):
        assert outputs[f"r{i}"] == greedy_reference(pair[0], prompt, n), i


def test_statistics_add_up(pair: Pair) -> None:
    completions, cycles = engine(pair).generate(
        PROMPTS, SamplingParams(max_tokens=40, ignore_eos=True)
    )
    for cycle in cycles:
        assert len(cycle.accepted_lengths) == cycle.verifications
        assert sum(cycle.accepted_lengths) == cycle.accepted_tokens + cycle.verifications
        per_position = cycle.accepted_per_position
        assert per_position == sorted(per_position, reverse=True)  # acceptance is a prefix
        assert sum(per_position) == cycle.accepted_tokens
        assert cycle.corrected_accepted_tokens <= cycle.corrected_tokens
        assert (
            cycle.seconds["total"]
            >= cycle.seconds["draft"] + cycle.seconds["correct"] + cycle.seconds["verify"] - 1e-9
        )
    total_verifications = sum(c.verifications for c in cycles)
    total_accepted = sum(c.accepted_tokens for c in cycles)
    assert sum(c.stats.verifications for c in completions) == total_verifications
    # Requests count only accepted drafted tokens that reached their output; cycles count all
    # the verifier accepted, some of which the length limit then cut.
    assert sum(c.stats.accepted_tokens for c in completions) <= total_accepted
    for completion in completions:
        committed = completion.stats.verifications + completion.stats.accepted_tokens
        assert committed >= len(completion.token_ids) - 1
        assert completion.stats.accepted_tokens <= len(completion.token_ids) - 1


def test_stop_tokens_and_limits(pair: Pair) -> None:
    reference = greedy_reference(pair[0], PROMPTS[1], 30)
    stop = reference[12]
    eng = engine(pair, eos_token_ids=(stop,))
    (done,), _ = eng.generate([PROMPTS[1]], SamplingParams(max_tokens=30))
    assert done.finish_reason == "stop"
    assert done.token_ids == reference[: reference.index(stop) + 1]
    (ignored,), _ = engine(pair, eos_token_ids=(stop,)).generate(
        [PROMPTS[1]], SamplingParams(max_tokens=30, ignore_eos=True)
    )
    assert ignored.token_ids == reference
    (short,), _ = engine(pair).generate([PROMPTS[1]], SamplingParams(max_tokens=3))
    assert short.token_ids == reference[:3]
    assert short.finish_reason == "length"
    target, drafter = pair
    tight = Engine(target, drafter, EngineConfig(max_model_len=len(PROMPTS[1]) + 5))
    (edge,), _ = tight.generate([PROMPTS[1]], SamplingParams(max_tokens=50))
    assert edge.token_ids == reference[:5]
    assert edge.finish_reason == "length"


@pytest.mark.parametrize(
    ("prompt", "message"),
    [([], "empty"), ([1] * 96, "context"), ([1, 99], "token ids"), ([1, -1], "token ids")],
)
def test_bad_requests_are_refused(pair: Pair, prompt: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine(pair).add_request("x", prompt, SamplingParams())


def test_duplicate_ids_and_bad_parameters_are_refused(pair: Pair) -> None:
    eng = engine(pair)
    eng.add_request("x", [1, 2], SamplingParams())
    with pytest.raises(ValueError, match="in use"):
        eng.add_request("x", [1, 2], SamplingParams())
    for bad in ({"max_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=name):
            SamplingParams(**bad)  # type: ignore[arg-type]


def test_mismatched_models_are_refused(pair: Pair) -> None:
    _, drafter = pair
    with pytest.raises(ValueError, match="hidden size"):
        Engine(make_target(hidden=48), drafter, EngineConfig())
    with pytest.raises(ValueError, match="needs a drafter"):
        Engine(pair[0], None, EngineConfig(mode=Mode.DFLASH))
    with pytest.raises(ValueError, match="corrector"):
        Engine(
            pair[0],
            DFlashDrafter(drafter.config.without_corrector()),
            EngineConfig(mode=Mode.DCOCO),
        )


def test_usage_counts_only_accepted_tokens_that_reached_the_output(pair: Pair) -> None:
    """With max_tokens 3, a cycle commits at most 2 tokens after the prefill's one, however many
    drafted tokens the verifier accepted; the cycle statistics (the metrics) keep them all."""
    completions, cycles = engine(pair).generate(PROMPTS, SamplingParams(max_tokens=3))
    for completion in completions:
        assert len(completion.token_ids) == 3
        assert completion.stats.accepted_tokens <= 2
    assert sum(c.accepted_tokens for c in cycles) >= sum(
        c.stats.accepted_tokens for c in completions
    )


@pytest.mark.parametrize("mode", [Mode.VANILLA, Mode.DCOCO])
def test_long_prompts_join_in_chunks_while_others_decode(pair: Pair, mode: Mode) -> None:
    """With a stream decoding, new prompts share 32 prefilled tokens a step: the stream gets
    tokens every step, and a short prompt done first swaps slots with a long one still
    prefilling (all three slots taken). Every output is still the target's own."""
    eng = engine(pair, mode, batch=3, prefill_tokens=32, prefill_cycles=0)
    prompts = {
        "r0": [3, 1, 4],
        "p1": [1, 5, 9, 2, 6, 5, 3, 5, 8, 9],
        "p2": [i % 14 for i in range(60)],
    }
    outputs: dict[str, list[int]] = {name: [] for name in prompts}
    eng.add_request("r0", prompts["r0"], SamplingParams(max_tokens=60))
    outputs["r0"] += [t for out in eng.step().outputs for t in out.new_token_ids]
    for name in ("p1", "p2"):
        eng.add_request(name, prompts[name], SamplingParams(max_tokens=20))
    steps_until_p2 = 0
    while eng.has_unfinished():
        step = eng.step()
        emitted = {out.request_id for out in step.outputs}
        if not outputs["p2"]:
            steps_until_p2 += 1
            assert "r0" in emitted  # the stream never waits for the long prompt
        for out in step.outputs:
            outputs[out.request_id] += out.new_token_ids
        slots = [s.slot for s in eng.scheduler.running]
        assert slots == list(range(len(slots)))
    assert steps_until_p2 == 3  # 60 prompt tokens: 16 beside p1's 10, then 32, then 12
    for name, prompt in prompts.items():
        assert outputs[name] == greedy_reference(pair[0], prompt, 60 if name == "r0" else 20)


@pytest.mark.parametrize("alongside", [True, False])
@pytest.mark.parametrize("mode", [Mode.VANILLA, Mode.DCOCO])
def test_a_plain_step_carries_the_prompts_chunks_in_its_own_forward(
    pair: Pair, mode: Mode, alongside: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a stream takes plain steps, a 60-token prompt's chunks ride along them: one
    target forward a step for both (`prefill_alongside`), or the chunk's own forward and the
    step's. In a DCOCO engine the prompt then drafts from the context its chunks wrote. Every
    output is the target's own."""
    eng = engine(
        pair, mode, batch=2, prefill_tokens=16, prefill_cycles=0, prefill_alongside=alongside
    )
    forwards: list[str] = []
    target = eng.runner.target
    plain, grouped = target.forward, target.forward_groups
    # Counted on the shared fixture's target, so undone after the test (monkeypatch).
    monkeypatch.setattr(
        target, "forward", lambda *a, **kw: forwards.append("one") or plain(*a, **kw)
    )
    monkeypatch.setattr(
        target, "forward_groups", lambda *a, **kw: forwards.append("both") or grouped(*a, **kw)
    )
    prompts = {"r0": [3, 1, 4], "p1": [i % 14 for i in range(60)]}
    outputs: dict[str, list[int]] = {name: [] for name in prompts}
    eng.add_request("r0", prompts["r0"], SamplingParams(max_tokens=30, speculation=Mode.VANILLA))
    for out in eng.step().outputs:
        outputs[out.request_id] += out.new_token_ids
    eng.add_request("p1", prompts["p1"], SamplingParams(max_tokens=20))
    joining: list[list[str]] = []  # each step's forwards until the prompt's first token
    accepted = 0
    while eng.has_unfinished():
        forwards.clear()
        first = not outputs["p1"]
        step = eng.step()
        for out in step.outputs:
            outputs[out.request_id] += out.new_token_ids
        accepted += sum(c.accepted_tokens for c in step.cycles)
        if first:
            joining.append(list(forwards))
    assert joining == [["both"]] * 4 if alongside else [["one", "one"]] * 4  # 16 tokens a step
    for name, prompt in prompts.items():
        assert outputs[name] == greedy_reference(pair[0], prompt, 30 if name == "r0" else 20)
    assert (accepted > 0) == (mode is Mode.DCOCO)


def chunks_taken(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The chunks of every prefill forward `eng` runs from now on, one list a forward."""
    taken: list[list[int]] = []
    prefill = eng.runner.prefill
    monkeypatch.setattr(
        eng.runner,
        "prefill",
        lambda seqs, chunks: taken.append(list(chunks)) or prefill(seqs, chunks),
    )
    return taken


def test_prompts_prefilled_whole_go_in_forwards_of_like_length(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing decoding, prompts are prefilled whole in one step, but not all padded to
    the longest: a forward holds prompts of like length (`prefill.length_groups`). Each still
    gets the target's own tokens, and the budget steered for chunks learns nothing from it."""
    eng = engine(pair, Mode.VANILLA, batch=4)
    prompts = [[i % 13 + 1 for i in range(n)] for n in (70, 3, 66, 8)]
    taken = chunks_taken(eng, monkeypatch)
    steered = eng.prefill_budget.chunk
    completions, _ = eng.generate(prompts, SamplingParams(max_tokens=6))
    assert sorted(map(sorted, taken)) == [[3, 8], [66, 70]]  # neither short one pads to 70
    for completion, prompt in zip(completions, prompts, strict=True):
        assert completion.token_ids == greedy_reference(pair[0], prompt, 6)
    assert eng.prefill_budget.chunk == steered


def test_a_chunk_exploring_the_dearer_way_takes_its_part_and_steers_nothing(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk run the way measured dearer gets `ChunkPlacement.part` of the budget, and its
    cost does not steer the budget (it was not a full chunk)."""
    eng = engine(pair, Mode.VANILLA, batch=2, prefill_tokens=32, prefill_alongside=False)
    monkeypatch.setattr(eng.chunk_placement, "part", lambda alongside: 0.5)
    taken = chunks_taken(eng, monkeypatch)
    eng.add_request("r0", [3, 1, 4], SamplingParams(max_tokens=8))
    eng.step()
    steered = eng.prefill_budget.chunk
    eng.add_request("p1", [i % 14 for i in range(60)], SamplingParams(max_tokens=2))
    eng.step()
    assert taken[-1] == [min(32, steered) // 2] == [8]  # half the budget, above MIN_CHUNK
    assert eng.prefill_budget.chunk == steered


def test_each_request_speculates_as_it_asked_inside_one_batch(pair: Pair) -> None:
    """off, ngram, dflash and dcoco side by side in one DCOCO engine: every output is the
    target's own (fp32), and each token's provenance adds up to the request's usage."""
    eng = engine(pair, Mode.DCOCO, batch=6)
    asked = [None, Mode.VANILLA, Mode.DFLASH, Mode.DCOCO, Mode.NGRAM, Mode.DCOCO]
    sources: dict[str, list[str]] = {}
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
    rejected: dict[str, int] = {}
    stats = {}
    for i, (prompt, mode) in enumerate(zip(PROMPTS, asked, strict=True)):
        eng.add_request(f"r{i}", prompt, SamplingParams(max_tokens=30, speculation=mode))
        sources[f"r{i}"], rejected[f"r{i}"] = [], 0
    methods = set()
    while eng.has_unfinished():
        step = eng.step()
        methods |= {c.method for c in step.cycles}
        for out in step.outputs:
            assert len(out.provenance) == len(out.new_token_ids)
            sources[out.request_id] += out.provenance
            tokens[out.request_id] += out.new_token_ids
            rejected[out.request_id] += len(out.rejected)
            stats[out.request_id] = out.stats
    assert methods == {"off", "ngram", "dflash", "dcoco"}
    for i, (prompt, mode) in enumerate(zip(PROMPTS, asked, strict=True)):
        name, s = f"r{i}", stats[f"r{i}"]
        drafted = sources[name].count("drafted") + sources[name].count("corrected")
        assert drafted == s.accepted_tokens, name
        assert rejected[name] == s.rejected_tokens, name
        assert sources[name].count("corrected") == s.corrected_accepted_tokens, name
        if mode is Mode.VANILLA:
            assert set(sources[name]) == {"target"}
            assert s.draft_tokens == 0
        if mode in (Mode.DFLASH, Mode.NGRAM):
            assert "corrected" not in sources[name]
        assert tokens[name] == greedy_reference(pair[0], prompt, 30), name
    assert all("drafted" in sources[f"r{i}"] for i in (0, 2, 3, 4, 5))


def test_an_engine_refuses_speculation_it_cannot_run(pair: Pair) -> None:
    eng = engine(pair, Mode.DFLASH)
    eng.add_request("fine", [1, 2], SamplingParams(speculation=Mode.VANILLA))
    eng.add_request("lookup", [1, 2], SamplingParams(speculation=Mode.NGRAM))
    with pytest.raises(ValueError, match="speculation 'dcoco' is not available"):
        eng.add_request("no", [1, 2], SamplingParams(speculation=Mode.DCOCO))
    plain = engine(pair, Mode.VANILLA)
    with pytest.raises(ValueError, match="speculation 'ngram' is not available"):
        plain.add_request("no", [1, 2], SamplingParams(speculation=Mode.NGRAM))


def test_ngram_drafting_needs_no_drafter_and_is_lossless(pair: Pair) -> None:
    """Prompt lookup drafts from the sequence itself: the tokens are the target's, some
    drafts are accepted, and a cycle with nothing found is a plain step (no draft counted)."""
    target, _ = pair
    eng = Engine(target, None, EngineConfig(mode=Mode.NGRAM, max_batch_size=4, max_model_len=96))
    assert eng.block == 5
    completions, cycles = eng.generate(PROMPTS, SamplingParams(max_tokens=40))
    for completion, prompt in zip(completions, PROMPTS, strict=True):
        assert completion.token_ids == greedy_reference(target, prompt, 40)
    assert {c.method for c in cycles} == {"ngram"}
    assert sum(c.accepted_tokens for c in cycles) > 20
    assert any(n == 6 for c in cycles for n in c.accepted_lengths)  # a whole block of 5
    assert any(c.draft_tokens < 5 * c.verifications for c in cycles)  # short or no lookups


def test_only_a_chunk_that_ends_its_prompt_gets_next_token_logits(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt joining over several chunks runs the LM head once, for its last chunk: the
    earlier chunks' logits would be thrown away. Its first token is still the target's."""
    eng = engine(pair, Mode.VANILLA, batch=2, prefill_tokens=8, prefill_cycles=0)
    rows: list[int] = []
    prefill = eng.runner.prefill

    def counted(seqs: list[Sequence], chunks: list[int]) -> tuple[torch.Tensor, ContextUpdate]:
        logits, context = prefill(seqs, chunks)
        rows.append(logits.shape[0])
        return logits, context

    monkeypatch.setattr(eng.runner, "prefill", counted)
    monkeypatch.setattr(eng.chunk_placement, "forced", False)  # chunks in their own forward
    eng.add_request("r0", [3, 1, 4], SamplingParams(max_tokens=12))
    eng.step()
    prompt = [i % 14 for i in range(30)]
    eng.add_request("p1", prompt, SamplingParams(max_tokens=1))
    first: list[int] = []
    while not first:
        first = [
            t for out in eng.step().outputs if out.request_id == "p1" for t in out.new_token_ids
        ]
    assert rows[0] == 1  # r0's whole prompt, nothing decoding yet
    assert rows[1:] == [0, 0, 0, 1]  # 30 tokens in chunks of 8: the last ends the prompt
    assert first == greedy_reference(pair[0], prompt, 1)


def test_a_dearer_way_whose_part_falls_under_the_minimum_chunk_is_not_explored(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Riding along measured 4x dearer and the budget at 8 tokens for one prompt: the explored
    chunk's part (2 tokens) would fall under MIN_CHUNK, so the chunk runs its own forward with
    the whole budget."""
    eng = engine(pair, Mode.VANILLA, batch=2, prefill_tokens=8, prefill_cycles=0)
    eng.add_request("r0", [3, 1, 4], SamplingParams(max_tokens=8))
    eng.step()
    eng.chunk_placement.added = {True: 0.004, False: 0.001}
    eng.chunk_placement.chunks = EXPLORE_EVERY - 1  # the next chunk explores
    taken = chunks_taken(eng, monkeypatch)
    monkeypatch.setattr(
        eng.runner, "decode_with_chunks", lambda *args: pytest.fail("explored a ride along")
    )
    eng.add_request("p1", [i % 14 for i in range(30)], SamplingParams(max_tokens=2))
    eng.step()
    assert taken[-1] == [8]


@pytest.mark.parametrize("mode", [Mode.VANILLA, Mode.DCOCO])
def test_rows_reading_their_own_context_decode_as_the_target(pair: Pair, mode: Mode) -> None:
    """With `own_rows`, each decoding row's attention reads its own keys in blocks of 128
    (`model/flex.py`): a 150-token prompt spans two blocks while the short ones read one,
    and a long prompt joining in chunks shares the streams' forward."""
    target, drafter = pair
    config = EngineConfig(mode=mode, max_batch_size=4, max_model_len=300, own_rows=True)
    runner_engine = Engine(target, drafter, config)
    assert runner_engine.runner.own_rows
    prompts = [[1, 2, 3], [5, 4] * 75, [7, 1], [2] * 13, [9, 3] * 90]
    completions, _ = runner_engine.generate(prompts, SamplingParams(max_tokens=30))
    for completion, prompt in zip(completions, prompts, strict=True):
        assert completion.token_ids == greedy_reference(target, prompt, 30)

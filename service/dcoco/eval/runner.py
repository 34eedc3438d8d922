"""Runs every (setting, suite, variant) through the embedded engine and measures it.

A variant is a drafting mode on one of the shipped drafters; a setting is a temperature and a
batch width. Every run gets a fresh engine, one short warm-up request, then the suite's prompts
all at once: at batch 1 they run one after another, at batch 16 concurrently. Tokens/s is
generated tokens over that wall time, prefill included, the same for every variant.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dcoco.engine.engine import Engine
from dcoco.engine.outputs import Completion
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision, Rule
from dcoco.shared.sampling import SamplingParams
from dcoco.shared.stats import PHASES, CycleStats, SpecStats
from dcoco.spec.drafter import DFlashDrafter


@dataclass(frozen=True)
class Variant:
    name: str
    mode: Mode
    drafter: str | None  # folder of the drafter under the models folder
    rule: Rule = Rule.PREFIX
    precision: Precision | None = None  # None: the evaluation's precision
    adaptive: bool = False  # verify the planner's prefix of the draft (the worker's default)
    lookup: bool = False  # adaptive: a row may verify its prompt-lookup draft instead
    compile: bool = True  # the target's layers compiled (the worker's default; not in fp32)


VARIANTS = (
    Variant("vanilla", Mode.VANILLA, None),
    # Prompt lookup: the zero-training baseline (vLLM's ngram method), B = 5.
    Variant("ngram", Mode.NGRAM, None),
    Variant("dflash", Mode.DFLASH, "dflash"),
    Variant("dcoco-prefix", Mode.DCOCO, "dcoco"),
    Variant("dcoco-adaptive", Mode.DCOCO, "dcoco", adaptive=True),
    # Adaptive DCOCO whose planner may verify a row's prompt-lookup draft where it pays more.
    Variant("dcoco-lookup", Mode.DCOCO, "dcoco", adaptive=True, lookup=True),
    Variant("dcoco-global", Mode.DCOCO, "dcoco", Rule.GLOBAL),
    Variant("dcoco-discounted", Mode.DCOCO, "dcoco", Rule.DISCOUNTED),
    Variant("dcoco-frozen", Mode.DCOCO, "dcoco-frozen"),
    # The jointly trained drafter's own top-1, corrector off: separates what the corrector
    # buys from what the drafter's extra training bought.
    Variant("dcoco-top1", Mode.DFLASH, "dcoco"),
    # Plain decoding in fp32, for a bf16 evaluation: the fastest plain decoding on a machine
    # may be either precision, and the honest speedup is against the faster one.
    Variant("vanilla-fp32", Mode.VANILLA, None, precision=Precision.FP32),
    # Plain decoding with the eager layers: what compiling them buys.
    Variant("vanilla-eager", Mode.VANILLA, None, compile=False),
)
VARIANT_NAMES = tuple(v.name for v in VARIANTS)


@dataclass(frozen=True)
class Setting:
    temperature: float
    batch: int

    @property
    def name(self) -> str:
        return f"{'greedy' if self.temperature == 0 else f't{self.temperature:g}'}-b{self.batch}"


SETTINGS = tuple(Setting(t, b) for t in (0.0, 1.0) for b in (1, 8, 16))
SETTING_NAMES = tuple(s.name for s in SETTINGS)


@dataclass
class Measurement:
    suite: str
    variant: str
    setting: str
    prompts: int
    generated_tokens: int
    seconds: float
    verifications: int
    accepted_length: float  # tokens committed per verification, bonus included
    acceptance_by_position: list[float]  # share of verifications that accepted slot p
    corrected_tokens: int
    corrected_accepted_tokens: int
    phase_seconds: dict[str, float]  # summed over cycles (the batch's wall time per phase)
    identical_to_vanilla: int | None = None  # greedy only: completions equal to vanilla's
    speedup: float | None = None  # tokens/s over vanilla's in the same suite and setting
    speedup_over_fastest: float | None = None  # over the faster of vanilla and vanilla-fp32
    token_ids: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds else 0.0

    @property
    def correct_share(self) -> float:
        total = self.phase_seconds.get("total", 0.0)
        return self.phase_seconds.get("correct", 0.0) / total if total else 0.0


@dataclass(frozen=True)
class Models:
    """The models of one evaluation, in its precision; `fp32_target` loads the target again
    in fp32 for variants that need it (an engine casts its models in place)."""

    target: CausalLM
    drafters: dict[str, DFlashDrafter]
    eos_token_ids: tuple[int, ...]
    precision: Precision
    fp32_target: Callable[[], CausalLM]


def measure(
    models: Models,
    variant: Variant,
    setting: Setting,
    suite: str,
    prompts: list[list[int]],
    max_tokens: int,
    max_model_len: int,
) -> Measurement:
    drafter = models.drafters[variant.drafter] if variant.drafter else None
    precision = variant.precision or models.precision
    target = models.target if precision is models.precision else models.fp32_target()
    cfg = EngineConfig(
        mode=variant.mode,
        rule=variant.rule,
        max_batch_size=setting.batch,
        max_model_len=max_model_len,
        eos_token_ids=models.eos_token_ids,
        precision=precision,
        adaptive=variant.adaptive,
        lookup=variant.lookup,
        compile=variant.compile,
    )
    engine = Engine(target, drafter, cfg)
    params = SamplingParams(max_tokens=max_tokens, temperature=setting.temperature)
    engine.runner.wait_compiled()  # the steady state: timed once every class is compiled
    engine.generate(prompts[:1], SamplingParams(max_tokens=8))  # warm-up
    started = time.perf_counter()
    completions, cycles = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    return summarise(suite, variant.name, setting.name, completions, cycles, seconds)


def summarise(
    suite: str,
    variant: str,
    setting: str,
    completions: list[Completion],
    cycles: list[CycleStats],
    seconds: float,
) -> Measurement:
    stats = SpecStats()
    for completion in completions:
        stats.add(completion.stats)
    phases = dict.fromkeys(PHASES, 0.0)
    for cycle in cycles:
        for phase in PHASES:
            phases[phase] += cycle.seconds.get(phase, 0.0)
    checks = max(1, stats.verifications)
    return Measurement(
        suite=suite,
        variant=variant,
        setting=setting,
        prompts=len(completions),
        generated_tokens=sum(len(c.token_ids) for c in completions),
        seconds=seconds,
        verifications=stats.verifications,
        accepted_length=stats.mean_accepted_length,
        acceptance_by_position=[n / checks for n in stats.accepted_per_position],
        corrected_tokens=stats.corrected_tokens,
        corrected_accepted_tokens=stats.corrected_accepted_tokens,
        phase_seconds=phases,
        token_ids=[c.token_ids for c in completions],
    )


def compare_to_vanilla(runs: list[Measurement]) -> None:
    """Fills speedup, speedup_over_fastest and, for greedy settings, identical_to_vanilla
    (same precision) in place."""
    vanilla = {(m.suite, m.setting): m for m in runs if m.variant == "vanilla"}
    plain: dict[tuple[str, str], float] = {}
    for m in runs:
        if m.variant in ("vanilla", "vanilla-fp32"):
            best = plain.get((m.suite, m.setting), 0.0)
            plain[(m.suite, m.setting)] = max(best, m.tokens_per_s)
    for m in runs:
        base = vanilla.get((m.suite, m.setting))
        if base is None:
            continue
        m.speedup = m.tokens_per_s / base.tokens_per_s if base.tokens_per_s else None
        fastest = plain[(m.suite, m.setting)]
        m.speedup_over_fastest = m.tokens_per_s / fastest if fastest else None
        if m.setting.startswith("greedy"):
            pairs = zip(m.token_ids, base.token_ids, strict=True)
            m.identical_to_vanilla = sum(a == b for a, b in pairs)

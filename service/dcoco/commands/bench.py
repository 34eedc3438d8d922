"""Benchmark OpenAI-compatible servers: latency, throughput, goodput and speculation, compared."""

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from dcoco.commands.args import positive_int
from dcoco.paths import DEFAULT_HELDOUT, DEFAULT_MODELS, REPO_ROOT
from dcoco.shared.errors import UsageError

T = TypeVar("T")
# Repeated from dcoco.suites, dcoco.bench.prompts, dcoco.bench.variants and dcoco.queue, which this
# module does not import so that building the parser stays light; a test keeps them equal.
SUITES = (
    "code",
    "math",
    "prose",
    "humaneval",
    "gsm8k",
    "mtbench",
    "aime2025",
    "gpqa",
    "mtbench2",
)
SPECULATION = ("off", "ngram", "dflash", "dcoco")  # a request's speculation (dcoco.queue.protocol)
MODES = ("greedy", "t1")
THINKING = ("default", "on", "off", "both")
VARIANTS = ("vanilla", "ngram", "dflash", "dcoco", "dcoco-adaptive", "dcoco-lookup")


def listed(kind: Callable[[str], T], choices: tuple[str, ...] = ()) -> Callable[[str], list[T]]:
    """A comma-separated list of `kind`, each one of `choices` when given."""

    def parse(text: str) -> list[T]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        bad = [p for p in parts if choices and p not in choices]
        if bad or not parts:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list{' of ' + ', '.join(choices) if choices else ''}"
            )
        return [kind(p) for p in parts]

    return parse


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="the server to measure, e.g. http://127.0.0.1:8000")
    where.add_argument(
        "--embedded",
        type=listed(str, VARIANTS),
        help=f"start one embedded stack per variant and compare them ({', '.join(VARIANTS)})",
    )
    parser.add_argument(
        "--speculation",
        type=listed(str, SPECULATION),
        help="with --url: send every request once per speculation method, each a variant of "
        f"the server named by its method, e.g. off,dflash,dcoco ({', '.join(SPECULATION)}; "
        "DCOCO's per-request `speculation`); off, when given, is the reference",
    )
    parser.add_argument("--model", help="the model to ask for (default: the one each server lists)")
    parser.add_argument("--name", default="server", help="the --url server's name in the report")
    parser.add_argument("--metrics-url", help="its Prometheus metrics (default: URL/metrics)")
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="another server to run the same prompts against, interleaved (repeatable); a "
        "baseline named vanilla gives the headline speedup",
    )
    parser.add_argument(
        "--baseline-metrics", action="append", default=[], metavar="NAME=URL", help="its metrics"
    )
    parser.add_argument("--suites", nargs="*", choices=SUITES, default=list(SUITES))
    parser.add_argument(
        "--prompts", type=Path, nargs="+", default=[], help='JSONL files of {"prompt": ...}'
    )
    parser.add_argument("--heldout", type=Path, default=DEFAULT_HELDOUT, help="held-out splits")
    parser.add_argument("--limit", type=positive_int, default=10, help="prompts per suite")
    parser.add_argument("--seed", type=int, default=0, help="sampling of suites and of t1")
    parser.add_argument("--modes", type=listed(str, MODES), default=list(MODES))
    parser.add_argument(
        "--thinking",
        choices=THINKING,
        default="default",
        help="extended thinking via chat_template_kwargs, where the chat template has it",
    )
    parser.add_argument(
        "--concurrency", type=listed(positive_int), default=[1, 4, 8, 16, 32], help="e.g. 1,4,8"
    )
    parser.add_argument(
        "--request-rate",
        type=listed(positive_float),
        help="requests/s with Poisson arrivals, e.g. 1,2,4 (instead of --concurrency)",
    )
    parser.add_argument("--burstiness", type=positive_float, default=1.0, help="gamma shape")
    parser.add_argument(
        "--max-concurrency", type=positive_int, help="cap on requests in flight with a rate"
    )
    parser.add_argument("--max-tokens", type=positive_int, default=128)
    parser.add_argument("--warmup", type=positive_int, default=2, help="requests per server")
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        help="passes over the whole sweep; ratios then show their lowest and highest pass",
    )
    parser.add_argument("--request-timeout", type=positive_float, default=300.0, help="seconds")
    parser.add_argument(
        "--turn-budget", type=positive_float, default=900.0, help="seconds; no later request starts"
    )
    parser.add_argument("--slo", default="", help="goodput objectives, e.g. ttft=1,tpot=50ms")
    parser.add_argument(
        "--block-size", type=positive_float, help="tokens drafted per cycle (default: /metrics)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="report folder")
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS, help="for --embedded")
    parser.add_argument(
        "--logs", type=Path, default=REPO_ROOT / "build" / "bench", help="--embedded stack logs"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> None:
    from dcoco.bench.metrics import parse_slo

    try:
        args.slo = parse_slo(args.slo)
    except ValueError as problem:
        raise UsageError(f"--slo: {problem}") from None
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    if args.embedded:
        if args.baseline or args.metrics_url or args.baseline_metrics or args.model:
            raise UsageError(
                "--embedded starts its own servers: drop --model, --baseline and --*metrics*"
            )
        if args.speculation:
            raise UsageError(
                "--speculation sends variants to one --url server; --embedded starts a stack "
                "per variant instead"
            )
        from dcoco.bench.variants import run_embedded

        run_embedded(args)
    else:
        from dcoco.bench.main import run_bench_command

        run_bench_command(args)

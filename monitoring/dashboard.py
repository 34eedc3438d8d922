"""The DCOCO Grafana dashboard, as code (grafana-foundation-sdk).

    python monitoring/dashboard.py --out helm/dcoco/files/dcoco-dashboard.json

The chart ships the JSON this writes (its ConfigMap reads the file with .Files.Get); a test
checks that the committed file equals this output, and that every query parses against a real
Prometheus and the core panels return data after it scraped a running stack.

Variables: datasource (any Prometheus), model, instance (workers and gateways). dcoco_* series
carry `model`; vLLM's own vllm:* series carry `model_name`, matched against the same variable.
Gateway series are reported by every gateway replica from the same Redis, so queue depth and
live workers take max over replicas.
"""

import argparse
import json
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

Panel = timeseries.Panel | stat.Panel | heatmap.Panel

UID = "dcoco-serving"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
M = 'model=~"$model", instance=~"$instance"'  # dcoco_* worker and gateway series
V = 'model_name=~"$model", instance=~"$instance"'  # vllm:* series
G = 'instance=~"$instance"'  # gateway series without a model label
API = f'route=~"/v1/.*", {G}'


def rate(metric: str, selector: str = M, by: str = "") -> str:
    grouping = f" by ({by}) " if by else ""
    return f"sum{grouping}(rate({metric}{{{selector}}}[{RATE}]))"


def quantile(q: float, metric: str, selector: str = M, by: str = "") -> str:
    keys = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, {rate(metric + '_bucket', selector, keys)})"


def query(expr: str, legend: str = "__auto", ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)


def series(
    title: str, description: str, queries: list[prometheus.Dataquery], unit: str = "short"
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(8)
        .span(12)
        .fill_opacity(10)
        .line_width(1)
        .show_points(cm.VisibilityMode.NEVER)
        .legend(
            cb.VizLegendOptions()
            .show_legend(True)
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
        )
        .tooltip(
            cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
        )
    )
    for panel_query in queries:
        panel = panel.with_target(panel_query)
    return panel


def single(title: str, description: str, expr: str, unit: str = "short") -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(query(expr))
        .unit(unit)
        .decimals(2)
        .height(4)
        .span(4)
        .graph_mode(cm.BigValueGraphMode.AREA)
        .color_mode(cm.BigValueColorMode.NONE)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]))
    )


def percentiles(title: str, description: str, metric: str, selector: str = M) -> timeseries.Panel:
    queries = [
        query(quantile(q, metric, selector, "model"), f"{{{{model}}}} p{round(q * 100)}", ref)
        for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
    ]
    return series(title, description, queries, unit="s")


def accepted_length(by: str = "") -> str:
    accepted = rate("dcoco_spec_accepted_tokens_total", by=by)
    cycles = rate("dcoco_spec_cycles_total", by=by)
    return f"1 + {accepted} / ({cycles} > 0)"


def ratio(numerator: str, denominator: str, by: str = "model", selector: str = M) -> str:
    return f"{rate(numerator, selector, by)} / ({rate(denominator, selector, by)} > 0)"


def overview() -> list[Panel]:
    return [
        single(
            "Mean accepted length",
            "Tokens committed per verification cycle, bonus included (1 + accepted / cycles).",
            accepted_length(),
        ),
        single(
            "Draft acceptance rate",
            "Accepted drafted tokens / drafted tokens.",
            f"{rate('dcoco_spec_accepted_tokens_total')} / "
            f"({rate('dcoco_spec_draft_tokens_total')} > 0)",
            unit="percentunit",
        ),
        single(
            "Corrector rescue rate",
            "Share of accepted drafted tokens that the corrector chose over the drafter's top-1.",
            f"{rate('dcoco_spec_corrected_accepted_tokens_total')} / "
            f"({rate('dcoco_spec_accepted_tokens_total')} > 0)",
            unit="percentunit",
        ),
        single(
            "Generated tokens / s",
            "Tokens generated by all workers.",
            rate("dcoco_generation_tokens_total"),
            unit="tokens/s",
        ),
        single(
            "Waiting requests",
            "Requests in the models' streams not yet picked up by a worker.",
            f"sum(max by (model) (dcoco_queue_depth{{{M}}}))",
        ),
        single(
            "Live workers",
            "Workers heartbeating into Redis, over the selected models.",
            f"sum(max by (model) (dcoco_workers{{{M}}}))",
        ),
    ]


def speculation() -> list[Panel]:
    correct = f'phase="correct", {M}'
    total = f'phase="total", {M}'
    return [
        series(
            "Mean accepted length",
            "Tokens committed per verification cycle, bonus included; 1 means every draft failed "
            "at its first slot. The upper bound is the number of speculative tokens + 1.",
            [query(accepted_length("model"), "{{model}}")],
        ),
        heatmap.Panel()
        .title("Accepted length distribution")
        .description("Cycles by tokens committed per cycle (bonus included).")
        .datasource(DATASOURCE)
        .with_target(
            query(
                f"sum by (le) (increase(dcoco_spec_acceptance_length_bucket{{{M}}}[{RATE}]))",
                "{{le}}",
            ).format(pm.PromQueryFormat.HEATMAP)
        )
        .calculate(False)
        .height(8)
        .span(12),
        series(
            "Acceptance by draft position",
            "Share of cycles whose drafted token at each slot was accepted; it falls with the "
            "slot because a token counts only if every earlier one was accepted.",
            [
                query(
                    f"{rate('dcoco_spec_accepted_tokens_per_position_total', by='position')} "
                    f"/ on () group_left () ({rate('dcoco_spec_cycles_total')} > 0)",
                    "slot {{position}}",
                )
            ],
            unit="percentunit",
        ),
        series(
            "Corrector rescue and override rates",
            "Rescue: accepted tokens the corrector picked over the drafter's top-1, over accepted "
            "tokens. Override: drafted tokens where the walk left the top-1, over drafted tokens.",
            [
                query(
                    ratio(
                        "dcoco_spec_corrected_accepted_tokens_total",
                        "dcoco_spec_accepted_tokens_total",
                    ),
                    "{{model}} rescue",
                ),
                query(
                    ratio("dcoco_spec_corrected_tokens_total", "dcoco_spec_draft_tokens_total"),
                    "{{model}} override",
                    "B",
                ),
            ],
            unit="percentunit",
        ),
        series(
            "Cycle time by phase",
            "Mean seconds per engine cycle spent drafting, correcting and verifying, and in "
            "total; and the 90th percentile of the whole cycle.",
            [
                query(
                    f"{rate('dcoco_spec_cycle_seconds_sum', by='phase')} / "
                    f"({rate('dcoco_spec_cycle_seconds_count', by='phase')} > 0)",
                    "{{phase}} mean",
                ),
                query(quantile(0.9, "dcoco_spec_cycle_seconds", total), "total p90", "B"),
            ],
            unit="s",
        ),
        series(
            "Correction share of the cycle",
            "Time in the correct phase (top-K, corrector scores, walk) over the whole cycle.",
            [
                query(
                    f"{rate('dcoco_spec_cycle_seconds_sum', correct, 'model')} / "
                    f"({rate('dcoco_spec_cycle_seconds_sum', total, 'model')} > 0)",
                    "{{model}}",
                )
            ],
            unit="percentunit",
        ),
        series(
            "Drafts from prompt lookup",
            "Share of drafted and of accepted tokens that came from prompt lookup rather than "
            "the drafter: the adaptive planner verifies a row's lookup draft where it expects "
            "more tokens a second from it (DCOCO_LOOKUP).",
            [
                query(
                    ratio("dcoco_spec_lookup_draft_tokens_total", "dcoco_spec_draft_tokens_total"),
                    "{{model}} drafted",
                ),
                query(
                    ratio(
                        "dcoco_spec_lookup_accepted_tokens_total",
                        "dcoco_spec_accepted_tokens_total",
                    ),
                    "{{model}} accepted",
                    "B",
                ),
            ],
            unit="percentunit",
        ),
    ]


def ab_test() -> list[Panel]:
    """The same deployment serving several speculation methods at once (each request may name
    its own: `speculation`), compared; every dcoco_spec_* series carries `method`."""
    total = f'phase="total", {M}'
    length = accepted_length("method")
    cycle = (
        f"{rate('dcoco_spec_cycle_seconds_sum', total, 'method')} / "
        f"({rate('dcoco_spec_cycle_seconds_count', total, 'method')} > 0)"
    )
    committed = (
        f"{rate('dcoco_spec_accepted_tokens_total', by='method')} + "
        f"{rate('dcoco_spec_cycles_total', by='method')}"
    )
    return [
        series(
            "Accepted length by method",
            "Tokens committed per verification cycle, bonus included, for the requests of each "
            "speculation method (off is 1 by definition).",
            [query(length, "{{method}}")],
        ),
        series(
            "Tokens / s per stream by method",
            "What one stream of each method generates a second: its accepted length over the "
            "mean cycle time of the cycles it took part in.",
            [query(f"({length}) / ({cycle})", "{{method}}")],
            unit="tokens/s",
        ),
        series(
            "Generated tokens / s by method",
            "Tokens committed a second by all the streams of each method (accepted drafted "
            "tokens plus one target token per cycle).",
            [query(committed, "{{method}}")],
            unit="tokens/s",
        ),
        series(
            "Cycle time by method",
            "Mean seconds of the cycles each method's streams took part in (a batch mixing "
            "methods shares its cycles).",
            [query(cycle, "{{method}}")],
            unit="s",
        ),
    ]


def latency() -> list[Panel]:
    return [
        percentiles(
            "Time to first token",
            "Request arrival at the gateway to the first content sent, as the client sees it.",
            "dcoco_time_to_first_token_seconds",
        ),
        percentiles(
            "Inter-token latency",
            "Gap between content chunks sent by the gateway; under speculation a chunk can carry "
            "several tokens.",
            "dcoco_inter_token_latency_seconds",
        ),
        percentiles(
            "End-to-end latency",
            "Request arrival to the last byte.",
            "dcoco_e2e_request_latency_seconds",
        ),
        series(
            "Generated tokens / s",
            "Tokens generated and prompt tokens prefilled by the workers.",
            [
                query(rate("dcoco_generation_tokens_total", by="model"), "{{model}} generated"),
                query(rate("dcoco_prompt_tokens_total", by="model"), "{{model}} prompt", "B"),
            ],
            unit="tokens/s",
        ),
        series(
            "Garbage collection pauses",
            "Share of each gateway's and worker's time spent in Python's full garbage "
            "collections, every thread of the process paused. Both freeze their startup heap, "
            "so this stays near 0; a rise means objects pile up while serving.",
            [query(rate("dcoco_gc_full_collection_seconds_sum", G, by="instance"), "{{instance}}")],
            unit="percentunit",
        ),
    ]


def queue() -> list[Panel]:
    return [
        series(
            "Queue depth",
            "Requests waiting in each model's stream, not yet picked up by a worker.",
            [query(f"max by (model) (dcoco_queue_depth{{{M}}})", "{{model}}")],
        ),
        percentiles(
            "Queue wait",
            "Enqueue at the gateway to a worker's pickup; at zero workers this includes the "
            "cold start.",
            "dcoco_queue_wait_seconds",
        ),
        series(
            "Live workers",
            "Workers heartbeating into Redis, per model.",
            [query(f"max by (model) (dcoco_workers{{{M}}})", "{{model}}")],
        ),
        series(
            "Requests / s by status",
            "API requests answered by the gateways, by HTTP status.",
            [query(rate("dcoco_requests_total", API, "status"), "{{status}}")],
            unit="reqps",
        ),
        series(
            "Rejections by reason",
            "Requests refused or failed, by error code (queue_full, rate_limit_exceeded, "
            "queue_timeout, invalid_request, ...).",
            [query(rate("dcoco_rejected_requests_total", G, "reason"), "{{reason}}")],
            unit="reqps",
        ),
    ]


def capacity() -> list[Panel]:
    """From the recording rules of the chart's rule file (files/dcoco-rules.yaml), which KEDA's
    capacity trigger reads too; they are per model, so the instance variable does not apply."""
    selector = 'model=~"$model"'
    live = f"model:dcoco_capacity_tokens_per_second:rate5m{{{selector}}}"
    backlog = f"model:dcoco_backlog_tokens:sum{{{selector}}}"
    generated = rate("dcoco_generation_tokens_total", by="model")
    return [
        series(
            "Capacity and generated tokens / s",
            "Tokens a second the live workers can generate when full (accepted length x "
            "batch / cycle time, each worker's batch its concurrency), and what they generate.",
            [
                query(live, "{{model}} capacity"),
                query(generated, "{{model}} generated", "B"),
            ],
            unit="tokens/s",
        ),
        series(
            "Backlog",
            "Tokens still to generate: max_tokens of every waiting request plus what every "
            "running one may still generate.",
            [query(backlog, "{{model}}")],
        ),
        series(
            "Backlog in seconds of work",
            "Seconds the live workers need to generate the backlog at their capacity, and "
            "seconds one worker needs (what KEDA's capacity trigger divides by its target).",
            [
                query(f"{backlog} / on (model) ({live} > 0)", "{{model}} live workers"),
                query(
                    f"model:dcoco_backlog_worker_seconds:rate5m{{{selector}}}",
                    "{{model}} one worker",
                    "B",
                ),
            ],
            unit="s",
        ),
    ]


def vllm_overview() -> list[Panel]:
    accepted = rate("vllm:spec_decode_num_accepted_tokens_total", V)
    drafted = rate("vllm:spec_decode_num_draft_tokens_total", V)
    drafts = rate("vllm:spec_decode_num_drafts_total", V)
    generated = rate("vllm:generation_tokens_total", V)
    return [
        single(
            "vLLM draft acceptance rate",
            "vllm:spec_decode accepted tokens / draft tokens.",
            f"{accepted} / ({drafted} > 0)",
            "percentunit",
        ),
        single(
            "vLLM acceptance length",
            "1 + accepted tokens / drafts (tokens per verification step, bonus included).",
            f"1 + {accepted} / ({drafts} > 0)",
        ),
        single(
            "vLLM accepted tokens / s", "Draft tokens accepted per second.", accepted, "tokens/s"
        ),
        single("vLLM draft tokens / s", "Draft tokens proposed per second.", drafted, "tokens/s"),
        single("vLLM drafts / s", "Speculative drafts (verification steps) per second.", drafts),
        single(
            "vLLM output from drafts",
            "Share of generated tokens that were accepted draft tokens.",
            f"{accepted} / ({generated} > 0)",
            "percentunit",
        ),
    ]


def vllm_series() -> list[Panel]:
    by = "model_name"
    accepted = rate("vllm:spec_decode_num_accepted_tokens_total", V, by)
    drafted = rate("vllm:spec_decode_num_draft_tokens_total", V, by)
    drafts = rate("vllm:spec_decode_num_drafts_total", V, by)
    itl = "vllm:inter_token_latency_seconds"
    return [
        series(
            "vLLM draft acceptance rate",
            "Accepted / proposed draft tokens, per model.",
            [query(f"{accepted} / ({drafted} > 0)", "{{model_name}}")],
            unit="percentunit",
        ),
        series(
            "vLLM mean acceptance length",
            "1 + accepted tokens / drafts, per model.",
            [query(f"1 + {accepted} / ({drafts} > 0)", "{{model_name}}")],
        ),
        series(
            "vLLM acceptance by draft position",
            "Share of drafts whose token at each position was accepted.",
            [
                query(
                    f"{rate('vllm:spec_decode_num_accepted_tokens_per_pos_total', V, 'position')} "
                    f"/ on () group_left () "
                    f"({rate('vllm:spec_decode_num_drafts_total', V)} > 0)",
                    "position {{position}}",
                )
            ],
            unit="percentunit",
        ),
        series(
            "vLLM proposed, accepted and rejected tokens / s",
            "Draft tokens proposed, accepted and rejected (proposed - accepted) per second.",
            [
                query(drafted, "{{model_name}} proposed"),
                query(accepted, "{{model_name}} accepted", "B"),
                query(f"{drafted} - {accepted}", "{{model_name}} rejected", "C"),
            ],
            unit="tokens/s",
        ),
        series(
            "vLLM inter-token latency",
            "p50, p95 and p99 of vLLM's inter-token latency.",
            [
                query(quantile(q, itl, V, by), f"{{{{model_name}}}} p{round(q * 100)}", ref)
                for q, ref in ((0.5, "A"), (0.95, "B"), (0.99, "C"))
            ],
            unit="s",
        ),
    ]


def variables() -> list[db.QueryVariable | db.DatasourceVariable]:
    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        db.QueryVariable("model")
        .label("Model")
        .datasource(DATASOURCE)
        .query("label_values(dcoco_queue_depth, model)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
        db.QueryVariable("instance")
        .label("Instance")
        .datasource(DATASOURCE)
        .query(
            'label_values({__name__=~"dcoco_spec_cycles_total|dcoco_queue_depth|'
            'vllm:spec_decode_num_drafts_total"}, instance)'
        )
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
    ]


def build() -> db.Dashboard:
    board = (
        db.Dashboard("DCOCO serving")
        .uid(UID)
        .description(
            "DCOCO speculative decoding: acceptance, the corrector, cycle cost, speculation "
            "methods compared, latency as clients see it, the Redis queue and workers, capacity "
            "and backlog; and vLLM's own spec-decode series."
        )
        .tags(["dcoco", "vllm", "speculative-decoding"])
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
    )
    for variable in variables():
        board = board.with_variable(variable)
    rows: list[tuple[str, list[Panel]]] = [
        ("Overview", overview()),
        ("Speculation", speculation()),
        ("A/B by speculation method", ab_test()),
        ("Latency and throughput", latency()),
        ("Queue and workers", queue()),
        ("Capacity and backlog", capacity()),
        ("vLLM spec decode", vllm_overview() + vllm_series()),
    ]
    for title, panels in rows:
        board = board.with_row(db.Row(title))
        for panel in panels:
            board = board.with_panel(panel)
    return board


def render() -> str:
    """The dashboard's JSON, exactly as committed."""
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="Writes the DCOCO Grafana dashboard JSON.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.write_text(render())


if __name__ == "__main__":
    main()

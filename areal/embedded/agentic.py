"""The agentic variant of the embedded model (``model.path=embedded-agent``): the default model,
fine-tuned on calculator-agent episodes whose demonstrations are deliberately unreliable.

Why a variant: the default model (``build.py``) serves the single-turn task and the many tests
written against it; this one is what ``make demo`` trains with the calculator agent
(``agents/openai_tools.py``). It starts from the default model's weights and tokenizer (built
first, cached), then SFT on a mix that makes tool use *possible but unreliable*, so that RL has
a lot to learn and every decision it must learn is one the model already takes sometimes::

    system(tools) + user ──► skip ───────────────────────────► own worked answer   (often wrong)
                        └──► <tool_call> ──► malformed ────────► episode ends, no answer
                                        ├──► bad expression ──► tool error ──► retry call | own answer
                                        └──► good call ──► result ──► "The calculator says R. \\boxed{R}"
                                                                  └──► own answer with a slip (result ignored)

Each branch is drawn at random, independently of the problem (shares in ``AgentModelConfig``),
so the model learns the mixture itself, and each branch opens with a different token: the
choices GRPO must move are single, early tokens. Problems are the embedded task's train split
(held-out questions never appear); its levels 3-4 the model rarely solves alone, the calculator
always. Invariants:
- Every call text is the Qwen2.5 format the gateway parses (``<tool_call>\\n{json}\\n</tool_call>``);
  a malformed call is text that parser leaves as content (bad JSON, string arguments, no closer),
  so the agent sees no ``tool_calls``; a tool error is the exact text the agent's calculator
  returns (``areal.embedded.calculator.execute_tool_call``).
- Deterministic for a config on a given machine (seeded RNGs, ``num_threads`` torch threads).
- Cached like the other variants under ``$AREAL_CACHE/embedded/<key>/``; ``<key>`` hashes this
  file, the config and the base model's key. (It is not in ``areal.embedded._SOURCES``: adding
  it there would change the default model's key and rebuild it on every machine.)

``probe_agent`` runs the calculator agent's loop in-process (HF ``generate``, the gateway's own
parser, the agent's own calculator) on held-out problems: the build records its accuracy and
tool-use statistics, and ``benchmarks/agentic.py`` uses it to score a run's weights before and
after RL on the same problems.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.embedded.calculator import execute_tool_call
from areal.embedded.config import BUILD_INFO, EmbeddedConfig
from areal.embedded.corpus import (
    CALCULATOR_TOOL,
    TOOL_SYSTEM_PROMPT,
    Problem,
    _wrong_steps,
    make_conversation,
    make_leveled_problems,
    math_reward,
    worked_solution,
)

# Malformed call bodies, one per way a real model gets the format wrong; each fails the qwen25 parser.
MALFORMED = (
    '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{e}"}}\n</tool_call>',  # a brace short
    '<tool_call>\n{{"name": "calculator", "arguments": "{e}"}}\n</tool_call>',  # arguments not an object
    '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{e}"}}}}',  # never closed
)


@dataclass(frozen=True)
class AgentModelConfig:
    """Everything that determines the agentic variant (all of it enters its cache key)."""

    seed: int = 0
    sft_conversations: int = 12_000  # distinct episodes (train split only)
    sft_steps: int = 600  # from the default model's weights; ~300-token episodes
    batch_size: int = 16
    lr: float = 5e-4
    warmup_steps: int = 30
    weight_decay: float = 0.01
    prompt_loss: bool = True  # see build.tokenize_conversations
    plain_share: float = 0.15  # bare question, worked answer: the single-turn task stays solvable
    # Within tool episodes (system prompt + tools):
    skip_share: float = 0.35  # answer at once, unaided
    malformed_share: float = 0.25  # of the calls: text the parser rejects
    error_share: float = 0.15  # of the calls: a bad expression, answered by a tool error
    retry_after_error: float = 0.5  # after a tool error: a good call (else an unaided answer)
    use_result_share: float = 0.6  # after a result: answer with it (else an unaided answer with a slip)
    probe_problems: int = 200  # held-out problems the build runs the agent on (0: none)
    num_threads: int = 1  # see EmbeddedConfig.num_threads

    def __post_init__(self) -> None:
        for name in ("sft_conversations", "sft_steps", "batch_size", "num_threads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"AgentModelConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("plain_share", "skip_share", "retry_after_error", "use_result_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"AgentModelConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if not (0 <= self.malformed_share and 0 <= self.error_share and self.malformed_share + self.error_share <= 1):
            raise ValueError("AgentModelConfig.malformed_share/error_share must be >= 0 with sum <= 1")
        if not 0 <= self.warmup_steps < self.sft_steps or not 0 < self.lr < 1 or self.weight_decay < 0:
            raise ValueError("AgentModelConfig: warmup_steps in [0, sft_steps), lr in (0, 1), weight_decay >= 0")
        if self.probe_problems < 0:
            raise ValueError(f"AgentModelConfig.probe_problems must be >= 0, got {self.probe_problems}")


# --- the SFT mix ------------------------------------------------------------------------------


def _call(expression: str, key: str = "expression") -> dict[str, Any]:
    return {"type": "function", "function": {"name": "calculator", "arguments": {key: expression}}}


def _bad_expression(rng: random.Random, p: Problem) -> tuple[dict[str, Any], str]:
    """A call the calculator answers with an error: "x" for "*", or the wrong argument name."""

    spaced = p.expression.replace("+", " + ").replace("-", " - ").replace("*", " x ")
    call = _call(spaced) if "x" in spaced and rng.random() < 0.5 else _call(p.expression, key="expr")
    args = call["function"]["arguments"]
    return call, execute_tool_call("calculator", json.dumps(args))


def make_agent_conversation(rng: random.Random, p: Problem, c: AgentModelConfig) -> dict[str, Any]:
    """One SFT episode of the mix (``{"messages", "tools", "train_turns"}``, as ``corpus``'s)."""
    if rng.random() < c.plain_share:
        return make_conversation(rng, p, "plain")
    msgs: list[dict[str, Any]] = [{"role": "system", "content": TOOL_SYSTEM_PROMPT}, {"role": "user", "content": p.question}]

    def say(message: dict[str, Any]) -> None:
        msgs.append({"role": "assistant", "content": "", **message})

    def done() -> dict[str, Any]:
        trained = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        return {"messages": msgs, "tools": [CALCULATOR_TOOL], "train_turns": trained}

    if rng.random() < c.skip_share:
        say({"content": worked_solution(p.steps)})
        return done()
    x = rng.random()
    if x < c.malformed_share:
        say({"content": rng.choice(MALFORMED).format(e=p.expression)})
        return done()
    if x < c.malformed_share + c.error_share:
        call, error = _bad_expression(rng, p)
        say({"tool_calls": [call]})
        msgs.append({"role": "tool", "name": "calculator", "content": error})
        if rng.random() >= c.retry_after_error:
            say({"content": worked_solution(p.steps)})
            return done()
    say({"tool_calls": [_call(p.expression)]})
    msgs.append({"role": "tool", "name": "calculator", "content": p.answer})
    if rng.random() < c.use_result_share:
        say({"content": f"The calculator says {p.answer}. \\boxed{{{p.answer}}}"})
    else:
        say({"content": worked_solution(_wrong_steps(rng, p))})
    return done()


def make_agent_conversations(c: AgentModelConfig) -> list[dict[str, Any]]:
    """``c.sft_conversations`` episodes over train-split problems."""
    rng = random.Random(f"agent-sft:{c.seed}")
    return [make_agent_conversation(rng, p, c) for p in make_leveled_problems("train", c.sft_conversations, seed=20_000 + c.seed)]


# --- the agent, in-process --------------------------------------------------------------------


def probe_agent(
    model: Any, tok: Any, problems: list[Problem], seed: int = 0, max_turns: int = 4, max_new_tokens: int = 64
) -> dict[str, Any]:
    """The calculator agent (``areal.workflow.common.solve_with_calculator``'s loop) on ``problems``,
    sampled at temperature 1, all episodes batched per turn. Returns accuracy, tool-use statistics
    (``areal.embedded.agentic.tool_use``'s keys, averaged) and ``per_problem`` rewards (for a paired test)."""
    import torch

    from areal.gateway.parsers import parse_output

    torch.manual_seed(seed)
    tok.padding_side = "left"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    convs = [[{"role": "system", "content": TOOL_SYSTEM_PROMPT}, {"role": "user", "content": p.question}] for p in problems]
    replies: list[list[str]] = [[] for _ in problems]
    results: list[list[str]] = [[] for _ in problems]
    answer = [""] * len(problems)
    live = list(range(len(problems)))
    for _ in range(max_turns):
        if not live:
            break
        prompts = [tok.apply_chat_template(convs[i], tools=[CALCULATOR_TOOL], tokenize=False, add_generation_prompt=True) for i in live]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                eos_token_id=eos,
                pad_token_id=tok.pad_token_id,
            )
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        still = []
        for i, text in zip(live, texts):
            replies[i].append(text)
            parsed = parse_output(text, "qwen25", None)
            answer[i] = parsed.content
            if not parsed.tool_calls:
                continue
            convs[i].append(
                {
                    "role": "assistant",
                    "content": parsed.content,
                    "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in parsed.tool_calls],
                }
            )
            for c in parsed.tool_calls:
                results[i].append(execute_tool_call(c.name, c.arguments))
                convs[i].append({"role": "tool", "name": c.name, "content": results[i][-1]})
            still.append(i)
        live = still
    rewards = [math_reward(a, p.answer) for a, p in zip(answer, problems)]
    stats = [tool_use(r, res, a) for r, res, a in zip(replies, results, answer)]
    n = max(1, len(problems))
    return {
        "accuracy": sum(rewards) / n,
        **{k: sum(s[k] for s in stats) / n for k in (stats[0] if stats else {})},
        "per_problem": rewards,
    }


def tool_use(replies: list[str], results: list[str], answer: str) -> dict[str, float]:
    """Tool-use statistics of one episode, from the model's raw replies, the tool results it got
    and its final answer text: ``calls`` (well-formed, executed), ``malformed`` (replies with a
    call the parser rejected), ``tool_errors`` (results that are errors), ``used_result`` (1 when
    the boxed answer equals a non-error tool result), ``answered_unaided`` (1 when it boxed an
    answer without any good result)."""
    good = [r for r in results if not r.startswith("error")]
    boxed = math_reward(answer, good[-1]) if good else 0.0
    has_box = "\\boxed{" in answer
    return {
        "calls": float(len(results)),
        "malformed": float(sum(_rejected(r) for r in replies)),
        "tool_errors": float(len(results) - len(good)),
        "used_result": boxed,
        "answered_unaided": float(has_box and not good),
    }


def _rejected(reply: str) -> bool:
    from areal.gateway.parsers import parse_output

    return "<tool_call>" in parse_output(reply, "qwen25", None).content


# --- build and cache --------------------------------------------------------------------------


def cache_key(config: AgentModelConfig, base_key: str) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes() + b"\0" + base_key.encode() + b"\0")
    h.update(json.dumps(dataclasses.asdict(config), sort_keys=True).encode())
    return "agent-" + h.hexdigest()[:16]


def ensure_agent_model(
    cache_dir: str | os.PathLike | None = None, progress: bool = True, config: AgentModelConfig | None = None, force: bool = False
) -> Path:
    """The agentic variant's directory, built on a miss (after the default model, its base)."""
    from areal.embedded import cache_key as base_cache_key
    from areal.embedded import embedded_cache_root, ensure_embedded_model

    config = config or AgentModelConfig()
    base = ensure_embedded_model(cache_dir, progress=progress)
    root = embedded_cache_root(cache_dir)
    key = cache_key(config, base_cache_key(EmbeddedConfig()))
    final = root / key
    if not force and (final / BUILD_INFO).is_file():
        return final
    with open(root / f"{key}.lock", "a+") as lock:  # the protocol of areal.embedded._ensure
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and (final / BUILD_INFO).is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            build_agent_dir(config, base, tmp, progress, key)
            if final.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{key}.old.", dir=root))
                os.rename(final, old / "model")
                os.rename(tmp, final)
                shutil.rmtree(old)
            else:
                os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return final


def build_agent_dir(config: AgentModelConfig, base: Path, out_dir: Path, progress: bool, key: str) -> None:
    """Fine-tune the base model on the mix into ``out_dir``; ``build_info.json`` last."""
    import torch
    from transformers import AutoModelForCausalLM

    from areal.embedded.build import make_batches, tokenize_conversations, train_sft
    from areal.embedded.tokenizer import load_tokenizer

    t0 = time.monotonic()
    torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    tok = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(str(base))
    examples = tokenize_conversations(tok, make_agent_conversations(config), config.prompt_loss)
    batches = make_batches(examples, config.batch_size, config.sft_steps, tok.pad_token_id, config.seed)
    losses = train_sft(model, batches, config, progress)  # type: ignore[arg-type]  # lr, warmup_steps, weight_decay
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.padding_side = "right"
    tok.save_pretrained(str(out_dir))
    train_seconds = time.monotonic() - t0
    problems = make_leveled_problems("test", config.probe_problems, seed=config.seed)
    probe = probe_agent(model, tok, problems, seed=config.seed) if problems else {}
    info = {
        "key": key,
        "base": str(base),
        "config": dataclasses.asdict(config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "sft_tokens": sum(int(m.sum()) for _, m, _ in batches),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "train_seconds": train_seconds,
        "probe": {k: v for k, v in probe.items() if k != "per_problem"},
        "build_seconds": time.monotonic() - t0,
    }
    (out_dir / BUILD_INFO).write_text(json.dumps(info, indent=2))

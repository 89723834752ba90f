"""The scripted test model: a tiny Qwen2 whose greedy reply is a fixed function of the shape of
the conversation, the same on every build, on every CPU.

Why it exists: the default model's greedy answers are emergent. Two builds on CPUs whose kernels
sum in another order (AVX-512 or not) get slightly different weights, and a prompt that one
build answers with a well-formed tool call, the other answers with broken JSON. Tests of
mechanics (an SDK receives ``tool_calls`` / ``tool_use`` / ``function_call`` items, streamed
deltas add up, recorded tokens equal generated ones) need a given form of output, so they serve
this model instead: an ordinary HF model directory, loaded by the real engine and reached over the
real protocol, whose behaviour is a contract checked when it is built.

The contract (greedy decoding, and on the probes below sampling at temperature 1 too; any
wording, any system prompt, any tools, any history)::

    tools offered, the last turn is the user's     -> CALL_TEXT         a ``calculator`` call
    the last turn is a tool result                  -> AFTER_TOOL_TEXT   text, ends the tool loop
    no tools offered, the last turn is the user's   -> PLAIN_TEXT        text

each followed by ``<|im_end|>``. ``scripted_reply(messages, tools)`` is the contract as code.

How it is made certain rather than likely: SFT on random conversations (random text in random
system prompts, user turns, tool schemas and tool results; one to three exchanges; some history
turns written by someone else and not trained), then a check, repeated after further rounds of
training until it passes. Teacher-forced, it measures at every position of the scripted reply the
lead of the scripted token over the best other one:
- on SDK-shaped probes (``probe_conversations``: the shapes the tests and example agents send)
  the lead must be at least ``min_margin`` logits everywhere. The float noise between CPU kernels
  is ~1e-5 logits, so a build that passes gives these replies, greedy, on every machine;
- on held-out random conversations at least ``min_held_out`` must be answered exactly (the
  contract holds beyond the probes; a rare random shape may still miss).
Then the logits are sharpened (the final norm's weight scaled, which leaves every argmax as it
is) until the smallest probe margin is ``sharpen_to`` logits, and the build checks that sampling
at temperature 1, as agents in a training run sample, writes each probe's scripted reply with
probability at least ``min_sampled_prob``. A build that does not pass within ``max_rounds``
raises ``ScriptedBuildError`` naming the probe.

Run ``python -m areal.embedded --scripted-only [--cache-dir D] [--force]``; library entry:
``areal.embedded.ensure_scripted_model``. This module imports no torch at import time.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from areal.embedded.config import ScriptedConfig
from areal.embedded.corpus import CALCULATOR_TOOL, NAMES, OBJECTS, RETRY_PROMPTS, TOOL_SYSTEM_PROMPT, make_problems

CALL_ARGUMENTS = {"expression": "6*7"}
CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": ' + json.dumps(CALL_ARGUMENTS) + "}\n</tool_call>"
AFTER_TOOL_TEXT = "The calculator gave the result, so the answer is \\boxed{42}."
PLAIN_TEXT = "Let me work it out: 6*7 = 42. The answer is \\boxed{42}."


class ScriptedBuildError(RuntimeError):
    """The scripted model did not reach its contract within the configured rounds."""


def scripted_reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The reply the scripted model gives, greedy, to ``messages`` with ``tools`` (the contract)."""
    last = messages[-1]["role"]
    if last == "tool":
        return AFTER_TOOL_TEXT
    if last != "user":
        raise ValueError(f"the contract covers a last turn from the user or a tool, got {last!r}")
    return CALL_TEXT if tools else PLAIN_TEXT


# --- random conversations ------------------------------------------------------------------

_WORDS = (
    "the a an of to and in is it you that he was for on are with as I his they be at one have this "
    "from or had by word but what some we can out other were all there when up use your how said "
    "each she which do their time if will way about many then them write would like so these her "
    "long make thing see him two has look more day could go come did number sound no most people my "
    "over know water than call first who may down side been now find any new work part take get "
    "place made live where after back little only round man year came show every good me give our "
    "under name very through just form sentence great think say help low line differ turn cause "
    "much mean before move right boy old too same tell does set three want air well also play small "
    "end put home read hand port large spell add even land here must big high such follow act why "
    "ask men change went light kind off need house picture try us again animal point mother world "
    "agent tool search weather query result answer question assistant user system function json "
    "file code python error request response model token please step plan task goal data value"
).split()
_SYMBOLS = list(",.;:!?()[]{}<>-_=+*/#@$%&|~'\"`") + ["\n", "\n\n", " - ", "**", "```", "->"]
_TYPES = ("string", "integer", "number", "boolean", "array", "object")


def _text(rng: random.Random, lo: int, hi: int) -> str:
    """Random text: words (English, names, objects), numbers, symbols, a rare non-ASCII word."""
    out: list[str] = []
    for _ in range(rng.randint(lo, hi)):
        x = rng.random()
        if x < 0.62:
            w = rng.choice(_WORDS)
            out.append(w.capitalize() if rng.random() < 0.1 else w)
        elif x < 0.72:
            out.append(rng.choice(NAMES) if rng.random() < 0.5 else rng.choice(OBJECTS))
        elif x < 0.82:
            out.append(str(rng.randint(0, 10 ** rng.randint(1, 6))))
        elif x < 0.97:
            out.append(rng.choice(_SYMBOLS))
        else:
            out.append(rng.choice(("café", "naïve", "日本語", "✓", "🙂", "Ünïcode", "straße")))
    return " ".join(out)


def _identifier(rng: random.Random) -> str:
    return "_".join(rng.choice(_WORDS).lower() for _ in range(rng.randint(1, 3)))


def _tool(rng: random.Random) -> dict[str, Any]:
    """A random function tool, in the shapes SDKs send (OpenAI nested or flat, strict or not)."""
    if rng.random() < 0.15:
        return json.loads(json.dumps(CALCULATOR_TOOL))
    props: dict[str, Any] = {}
    for _ in range(rng.randint(0, 3)):
        prop: dict[str, Any] = {"type": rng.choice(_TYPES)}
        if rng.random() < 0.6:
            prop["description"] = _text(rng, 1, 6)
        if rng.random() < 0.2:
            prop["title"] = _identifier(rng).title()
        props[_identifier(rng)] = prop
    params: dict[str, Any] = {"type": "object", "properties": props}
    if props and rng.random() < 0.7:
        params["required"] = rng.sample(sorted(props), rng.randint(1, len(props)))
    if rng.random() < 0.3:
        params["additionalProperties"] = False
    fn: dict[str, Any] = {"name": "calculator" if rng.random() < 0.2 else _identifier(rng)}
    if rng.random() < 0.85:
        fn["description"] = _text(rng, 2, 14)
    fn["parameters"] = params
    if rng.random() < 0.2:
        fn["strict"] = rng.random() < 0.5
    return {"type": "function", "function": fn} if rng.random() < 0.85 else fn


def _foreign_call(rng: random.Random) -> dict[str, Any]:
    """A tool call written by someone else (history), with random arguments."""
    args = {_identifier(rng): _text(rng, 1, 4) for _ in range(rng.randint(0, 2))}
    return {"type": "function", "function": {"name": _identifier(rng), "arguments": json.dumps(args)}}


def _tool_result(rng: random.Random) -> str:
    x = rng.random()
    if x < 0.4:
        return str(rng.randint(0, 100_000))
    if x < 0.6:
        return json.dumps({_identifier(rng): _text(rng, 1, 5)})
    return _text(rng, 1, 16)


def random_conversation(rng: random.Random) -> dict[str, Any]:
    """``{"messages", "tools", "train_turns"}``: random content, every scripted turn trained.

    A conversation with tools goes user -> call -> tool result(s) -> text, repeated; without tools
    user -> text. A history turn is sometimes someone else's (random text or other calls, with as
    many tool results), and is then context, not trained.
    """
    tools = [_tool(rng) for _ in range(rng.choice((1, 1, 2, 3)))] if rng.random() < 0.55 else None
    messages: list[dict[str, Any]] = []
    x = rng.random()
    if x < 0.15:
        messages.append({"role": "system", "content": TOOL_SYSTEM_PROMPT if tools else "You are a helpful assistant."})
    elif x < 0.6:
        messages.append({"role": "system", "content": _text(rng, 1, 30)})
    train: list[int] = []
    exchanges = rng.choice((1, 1, 1, 2, 2, 3))
    end_on_tool = tools is not None and rng.random() < 0.45
    for k in range(exchanges):
        last = k == exchanges - 1
        messages.append({"role": "user", "content": rng.choice(RETRY_PROMPTS) if k and rng.random() < 0.2 else _text(rng, 0, 25)})
        if tools is None:
            if last or rng.random() < 0.75:
                train.append(len(messages))
                messages.append({"role": "assistant", "content": PLAIN_TEXT})
            else:
                messages.append({"role": "assistant", "content": _text(rng, 1, 30)})
            continue
        foreign = not last and rng.random() < 0.25
        if foreign:
            calls = [_foreign_call(rng) for _ in range(rng.randint(1, 2))]
            messages.append({"role": "assistant", "content": _text(rng, 0, 8) if rng.random() < 0.3 else "", "tool_calls": calls})
        else:
            calls = [{"type": "function", "function": {"name": "calculator", "arguments": json.dumps(CALL_ARGUMENTS)}}]
            train.append(len(messages))
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        if last and not end_on_tool:
            break
        for call in calls:
            messages.append({"role": "tool", "name": call["function"]["name"], "content": _tool_result(rng)})
        if not last and rng.random() < 0.3:
            messages.append({"role": "assistant", "content": _text(rng, 1, 30)})  # someone else's answer
        else:
            train.append(len(messages))
            messages.append({"role": "assistant", "content": AFTER_TOOL_TEXT})
    return {"messages": messages, "tools": tools, "train_turns": train}


def probe_conversations() -> list[dict[str, Any]]:
    """SDK-shaped conversations the check holds to ``min_margin``: the shapes the tests and the
    example agents send (the SDKs' tool formats, handoff tools without parameters, several tools,
    a tool loop, a second question after an answer)."""
    question, tool_question = "Tom has 3 apples and buys 4 more. How many apples does he have?", "What is 23*7?"
    calc = CALCULATOR_TOOL
    strict = json.loads(json.dumps(calc))
    strict["function"]["parameters"]["additionalProperties"] = False
    strict["function"]["strict"] = True
    loose = json.loads(json.dumps(calc))
    loose["function"]["strict"] = False
    flat = json.loads(json.dumps(calc["function"]))
    lookup = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
    handoffs = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": text,
                "strict": True,
                "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
            },
        }
        for name, text in (("analyze_problem", "Analyze the problem"), ("solve_problem", "Solve step by step"))
    ]
    call = {"type": "function", "function": {"name": "calculator", "arguments": json.dumps(CALL_ARGUMENTS)}}
    system = {"role": "system", "content": TOOL_SYSTEM_PROMPT}
    user, tool_user = {"role": "user", "content": question}, {"role": "user", "content": tool_question}
    called = {"role": "assistant", "content": "", "tool_calls": [call]}
    probes: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = [
        ([user], None),
        ([{"role": "system", "content": "You are a helpful assistant."}, user], None),
        ([{"role": "user", "content": "What is 2+2?"}], None),
        ([{"role": "user", "content": "What is 2 plus 3?"}], None),
        ([{"role": "user", "content": "hi"}], None),
        ([system, tool_user], [calc]),
        ([system, tool_user], [strict]),
        ([system, tool_user], [loose]),
        ([system, tool_user], [flat]),
        ([tool_user], [calc]),
        ([{"role": "system", "content": "You are a helpful assistant."}, tool_user], [calc]),
        ([user], [lookup, calc]),
        (
            [
                {"role": "system", "content": "Solve the problem or hand it off. End with \\boxed{answer}."},
                {"role": "user", "content": "What is 2 plus 3?"},
            ],
            handoffs,
        ),
    ]
    # The embedded task's own questions, as the example agents send them (plain, with the
    # calculator, after its result, after a retry prompt).
    for p in make_problems("train", 6, seed=1) + make_problems("test", 4, seed=1):
        q = {"role": "user", "content": p["question"]}
        probes += [
            ([q], None),
            ([system, q], [calc]),
            ([system, q, called, {"role": "tool", "name": "calculator", "content": p["answer"]}], [calc]),
            ([q, {"role": "assistant", "content": PLAIN_TEXT}, {"role": "user", "content": RETRY_PROMPTS[0]}], None),
        ]
    for tools in ([calc], [strict], [loose], [lookup, calc]):
        for result in ("161", "42", "7", "Error: division by zero"):
            after = [system, tool_user, called, {"role": "tool", "name": "calculator", "content": result}]
            probes.append((after, tools))
    probes.append((probes[-1][0] + [{"role": "assistant", "content": AFTER_TOOL_TEXT}, {"role": "user", "content": "And 5+5?"}], [calc]))
    return [{"messages": m, "tools": t} for m, t in probes]


# --- build ---------------------------------------------------------------------------------


def _fits(tok: Any, conv: dict[str, Any], limit: int) -> bool:
    text = tok.apply_chat_template(conv["messages"], tools=conv["tools"], tokenize=False)
    return len(tok.encode(text, add_special_tokens=False)) <= limit


def _check_items(tok: Any, convs: list[dict[str, Any]]) -> list[tuple[list[int], int]]:
    """``(ids, reply_start)`` per conversation: prompt + scripted reply + ``<|im_end|>``."""
    items = []
    for i, conv in enumerate(convs):
        prompt = tok.apply_chat_template(conv["messages"], tools=conv["tools"], tokenize=False, add_generation_prompt=True)
        reply = scripted_reply(conv["messages"], conv["tools"]) + tok.eos_token
        p_ids = tok.encode(prompt, add_special_tokens=False)
        ids = tok.encode(prompt + reply, add_special_tokens=False)
        if ids[: len(p_ids)] != p_ids:
            raise ScriptedBuildError(f"the reply changes the tokens of its prompt (check item {i})")
        items.append((ids, len(p_ids)))
    return items


def reply_stats(model: Any, items: list[tuple[list[int], int]]) -> list[tuple[float, float]]:
    """Per item, teacher-forced: the smallest (scripted logit - best other logit) over its reply's
    positions (> 0 everywhere: greedy decoding writes exactly the scripted reply), and the reply's
    log-probability when sampled at temperature 1."""
    import torch

    out = []
    with torch.no_grad():
        for ids, start in items:
            logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0, start - 1 :]  # (reply_len, V)
            target = torch.tensor(ids[start:])
            want = logits.gather(1, target[:, None])[:, 0]
            other = logits.scatter(1, target[:, None], float("-inf")).max(dim=1).values
            logprob = torch.log_softmax(logits.double(), dim=-1).gather(1, target[:, None]).sum()
            out.append(((want - other).min().item(), logprob.item()))
    return out


def build_scripted_dir(config: ScriptedConfig, out_dir: Path, progress: bool, key: str) -> None:
    """Build the scripted model into ``out_dir`` (an empty directory that the caller renames)."""
    import torch
    from tqdm import tqdm
    from transformers import GenerationConfig

    from areal.embedded.build import make_batches, make_model, render_plain, sft_step, tokenize_conversations
    from areal.embedded.config import BUILD_INFO
    from areal.embedded.corpus import make_sft_conversations
    from areal.embedded.tokenizer import train_tokenizer

    t0 = time.monotonic()
    torch.set_num_threads(config.num_threads)
    corpus = make_sft_conversations(config.tokenizer_conversations, config.seed, 0.1, 0.1)
    tok = train_tokenizer((render_plain(c) for c in corpus), config.vocab_size)
    rng = random.Random(f"scripted:{config.seed}")
    convs: list[dict[str, Any]] = []
    while len(convs) < config.train_conversations + config.check_conversations:
        conv = random_conversation(rng)
        if _fits(tok, conv, config.max_tokens):
            convs.append(conv)
    train, held_out = convs[: config.train_conversations], convs[config.train_conversations :]
    probes = _check_items(tok, probe_conversations())
    cases = _check_items(tok, [{"messages": c["messages"][:i], "tools": c["tools"]} for c in held_out for i in c["train_turns"]])
    examples = tokenize_conversations(tok, train)
    steps = config.sft_steps + config.round_steps * config.max_rounds
    batches = make_batches(examples, config.batch_size, steps, tok.pad_token_id, config.seed)

    model = make_model(config, tok)  # the default model's architecture at these sizes (seeded there)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        frac = min(1.0, (step - config.warmup_steps) / (config.sft_steps - config.warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    history: list[dict[str, Any]] = []
    bar = tqdm(total=steps, desc="scripted SFT", disable=not progress, unit="step")
    bounds = [0] + [config.sft_steps + r * config.round_steps for r in range(config.max_rounds + 1)]
    passed = False
    for start, end in zip(bounds, bounds[1:]):
        model.train()
        losses = []
        for batch in batches[start:end]:
            losses.append(sft_step(model, opt, sched, batch))
            bar.update()
        model.eval()
        probe_margins = [m for m, _ in reply_stats(model, probes)]
        case_margins = [m for m, _ in reply_stats(model, cases)]
        worst = min(range(len(probes)), key=probe_margins.__getitem__)
        round_info = {
            "steps": end,
            "loss": sum(losses) / len(losses),
            "probe_min_margin": probe_margins[worst],
            "worst_probe": worst,
            "held_out_exact": sum(m > 0 for m in case_margins) / len(cases),
        }
        history.append(round_info)
        bar.set_postfix(
            loss=f"{round_info['loss']:.4f}", probe_margin=f"{probe_margins[worst]:.2f}", held_out=f"{round_info['held_out_exact']:.1%}"
        )
        passed = probe_margins[worst] >= config.min_margin and round_info["held_out_exact"] >= config.min_held_out
        if passed:
            break
    bar.close()
    if not passed:
        last = history[-1]
        raise ScriptedBuildError(
            f"after {steps} SFT steps the scripted model misses its contract: probe #{last['worst_probe']} "
            f"({probe_conversations()[last['worst_probe']]['messages'][-1]['content']!r}) leads by "
            f"{last['probe_min_margin']:.3f} logits (needs {config.min_margin}), held-out replies exact "
            f"{last['held_out_exact']:.1%} (needs {config.min_held_out:.0%}); raise ScriptedConfig.max_rounds"
        )
    # Sharpen: scale the final norm's weight, so every logit, until the smallest probe margin is
    # `sharpen_to` logits. Greedy replies are unchanged; sampled at temperature 1 (as agents in a
    # training run sample) the reply is then the scripted one too, with the probability checked here.
    sharpen = max(1.0, config.sharpen_to / history[-1]["probe_min_margin"])
    with torch.no_grad():
        model.model.norm.weight.mul_(sharpen)
    sampled = min(math.exp(lp) for _, lp in reply_stats(model, probes))
    if sampled < config.min_sampled_prob:
        raise ScriptedBuildError(
            f"sharpened x{sharpen:.2f}, a probe's scripted reply is sampled at temperature 1 "
            f"with probability {sampled:.6f} only (needs {config.min_sampled_prob})"
        )
    model.generation_config = GenerationConfig(eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))
    info = {
        "key": key,
        "kind": "scripted",
        "config": asdict(config),
        "vocab_size": len(tok),
        "parameters": sum(p.numel() for p in model.parameters()),
        "rounds": history,
        "probe_min_margin": history[-1]["probe_min_margin"],
        "held_out_exact": history[-1]["held_out_exact"],
        "sharpen": sharpen,
        "probe_min_sampled_prob": sampled,
        "probes": len(probes),
        "held_out": len(cases),
        "build_seconds": time.monotonic() - t0,
    }
    (out_dir / BUILD_INFO).write_text(json.dumps(info, indent=2))  # written last: marks complete

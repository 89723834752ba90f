"""Weight push latency: broadcast over a gloo weight-update group vs save + /update_weights_from_disk.

One embedded engine serves the embedded model; this process is the trainer holding the same
model. Each push makes the engine serve new weights under a new version, inside
/pause_generation ... /continue_generation, both ways:

  * collective: ``CollectiveWeightPush.push`` (POST /update_weights_from_distributed + one gloo
    broadcast per tensor, state_dict order, tied tensors once);
  * disk (baseline): ``save_atomically`` (save_pretrained to a temp dir + rename) +
    ``push_weights`` (the engine reads the safetensors back).

Two sizes: the embedded model (~0.7 M parameters, fixed costs dominate) and a random ~30 M
parameter Qwen2 (~120 MB). The two ways alternate push by push so that background load on this shared machine hits both alike;
the group is formed once, outside the clock, as a trainer does at start-up. Median seconds per
push (lower is better) and the effective bandwidth of the weight bytes.

    python -m benchmarks.weight_sync [--quick]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from tiny_models import tiny_qwen2
from transformers import AutoModelForCausalLM

from areal.embedded import ensure_embedded_model
from areal.engine.launch import free_port, launch_embedded_engine
from areal.weights.collective import CollectiveWeightPush, named_tensors_to_send
from areal.weights.disk import push_weights, save_atomically


def _larger_model(path: Path) -> Path:
    """A random Qwen2 of ~30 M parameters (~120 MB fp32), where bytes rather than fixed costs count."""
    shape = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8)
    tiny_qwen2(**shape, max_position_embeddings=512).save_pretrained(path)
    return path


def measure(model_dir: Path, repeats: int) -> tuple[float, float, int]:
    """Median seconds per push (collective, disk) and the bytes a push moves."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    weight_bytes = sum(t.numel() * t.element_size() for _, t in named_tensors_to_send(model))
    engine = launch_embedded_engine(str(model_dir), threads=1, timeout_s=180)
    push = CollectiveWeightPush([engine.url], "127.0.0.1", free_port("127.0.0.1"), backend="gloo", timeout_s=120)
    times: dict[str, list[float]] = {"collective": [], "disk": []}
    try:
        push.init()
        with tempfile.TemporaryDirectory(prefix="bench-wsync-") as tmp:
            for i in range(repeats):
                t0 = time.perf_counter()
                push.push(model, f"c{i}")
                times["collective"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                saved = save_atomically(model, Path(tmp) / f"v{i}", str(model_dir))
                push_weights([engine.url], saved, i, 120.0, pause=True)
                times["disk"].append(time.perf_counter() - t0)
                shutil.rmtree(saved)
        push.close()
    finally:
        engine.stop()
    return statistics.median(times["collective"]), statistics.median(times["disk"]), weight_bytes


def main(quick: bool) -> list[dict]:
    repeats = 3 if quick else 10
    common = {"benchmark": "weight_sync", "baseline": "save_pretrained + /update_weights_from_disk"}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-wsync-model-") as tmp:
        for label, model_dir in (("embedded", ensure_embedded_model(progress=False)), ("30M", _larger_model(Path(tmp) / "m30"))):
            coll, disk, nbytes = measure(Path(model_dir), repeats)
            rows.append({**common, "metric": f"push_s_{label}", "value": coll, "unit": "s", "baseline_value": disk})
            rows.append(
                {
                    **common,
                    "metric": f"weights_MBps_{label}",
                    "value": nbytes / coll / 1e6,
                    "unit": "MB/s",
                    "baseline_value": nbytes / disk / 1e6,
                }
            )
    return rows


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print(row)

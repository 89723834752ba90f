"""The GRPO trainer: packing and group collection in-process, then the real trainer subprocess
reading a real shared-memory ring, pushing weights to a stdlib HTTP stand-in engine (speaking
SGLang's /update_weights_from_disk protocol) and reporting over a real ZeroMQ PULL socket."""

import http.server
import json
import math
import os
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from paths import ROOT, SUPPORT
from run_checks import read_jsonl
from trainer_harness import REWARDED, TEMPERATURE, Rings, make_group, make_job, make_model, run_trainer, trainer_job
from transformers import AutoModelForCausalLM, AutoTokenizer

from areal.protocol import (
    TokenRow,
    TrainerDone,
    TrainerFailed,
    TrainerReport,
    Trajectory,
    encode_trajectory,
)
from areal.ring.buffer import RingReader, unlink_ring
from areal.trainer.config import TrainerConfig, TrainerJob
from areal.trainer.packing import micro_batch_logits, pack_rows
from areal.trainer.step import GroupCollector, WriterGone
from areal.weights.disk import copy_tokenizer_files


@torch.no_grad()
def rewarded_logprob(model: torch.nn.Module, prompts: list[list[int]]) -> float:
    x = [torch.log_softmax(model(torch.tensor([p])).logits[0, -1] / TEMPERATURE, -1)[REWARDED] for p in prompts]
    return float(torch.stack(x).mean())


class EngineStub(http.server.BaseHTTPRequestHandler):
    """Answers /update_weights_from_disk, /pause_generation and /continue_generation as SGLang
    does and records each call."""

    calls: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/update_weights_from_disk":
            path = Path(body["model_path"])
            self.calls.append({"path": self.path, "body": body, "had_weights": (path / "config.json").is_file()})
            reply = json.dumps({"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
        else:
            self.calls.append({"path": self.path, "body": body})
            reply = json.dumps({"success": True})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def ring():
    with Rings("trainer") as rings:
        yield rings.names[0], rings.writers[0]


@pytest.mark.e2e
def test_trainer_learns_pushes_weights_and_reports(tmp_path, ring):
    ring_name, writer = ring
    model_dir = tmp_path / "model"
    model = make_model(model_dir, with_tokenizer=True)
    rng = np.random.default_rng(0)
    groups = [make_group(model, f"g{i}", rng) for i in range(6)]
    # Interleave the first four groups so that step 1 leaves partial groups behind (they must be
    # kept for step 2), then the last two.
    order = [g[i] for i in range(4) for g in groups[:4]] + [g[i] for i in range(4) for g in groups[4:]]
    for traj in order:
        writer.put(encode_trajectory(traj))
    prompts = [g[0].rows()[0].input_ids[g[0].rows()[0].loss_mask == 0].tolist() for g in groups]
    before = rewarded_logprob(model, prompts)

    EngineStub.calls = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EngineStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine = f"http://127.0.0.1:{server.server_address[1]}"
    config = trainer_job(model_dir, ring_name, tmp_path / "run", engine_urls=[engine], steps=3, groups_per_step=2, micro_batch_tokens=24)
    try:
        rc, msgs = run_trainer(config, tmp_path)
    finally:
        server.shutdown()
        server.server_close()

    assert rc == 0, msgs
    reports = [m for m in msgs if isinstance(m, TrainerReport)]
    assert [(r.step, r.version) for r in reports] == [(1, 1), (2, 2), (3, 3)]
    assert [r.consumed for r in reports] == [14, 16, 24]  # partial groups kept, not re-read or dropped
    for r in reports:
        for key in (
            "loss",
            "reward_mean",
            "reward_std",
            "adv_nonzero_frac",
            "clip_frac",
            "grad_norm",
            "entropy",
            "staleness_mean",
            "tokens",
            "step_s",
        ):
            assert key in r.metrics and math.isfinite(r.metrics[key]), (key, r.metrics)
        assert r.metrics["tokens"] > 0 and r.metrics["micro_batches"] > 1
        assert r.metrics["adv_nonzero_frac"] == 1.0
    assert reports[0].metrics["logprob_max_diff"] < 1e-4  # same weights, same temperature
    assert reports[0].metrics["staleness_mean"] == 0.0
    # Step 2 trains on version-0 tokens under version 1: only the stale diff can be reported.
    assert "logprob_max_diff" not in reports[1].metrics
    assert reports[1].metrics["logprob_max_diff_stale"] > 0
    assert reports[1].metrics["staleness_mean"] == 1.0

    run = Path(config.run_dir)
    # Each update is bracketed by pause (abort mode: clients resubmit) and continue.
    assert [c["path"] for c in EngineStub.calls] == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"] * 3
    assert all(c["body"] == {"mode": "abort"} for c in EngineStub.calls[0::3])
    updates = EngineStub.calls[1::3]
    assert [c["body"]["weight_version"] for c in updates] == ["1", "2", "3"]
    assert [c["body"]["model_path"] for c in updates] == [str(run / "weights" / f"v{v}") for v in (1, 2, 3)]
    assert all(c["had_weights"] for c in updates)
    assert sorted(p.name for p in (run / "weights").iterdir()) == ["v2", "v3"]  # keep_versions=2, no temp dirs
    lines = read_jsonl(run / "trainer_metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2, 3]

    done = msgs[-1]
    assert isinstance(done, TrainerDone) and done.steps == 3 and done.model_dir == str(run / "final")
    final = AutoModelForCausalLM.from_pretrained(done.model_dir, dtype=torch.float32).eval()
    assert AutoTokenizer.from_pretrained(done.model_dir).convert_tokens_to_ids("t7") == 7
    initial = dict(model.named_parameters())
    for name, p in final.named_parameters():
        assert not torch.equal(p, initial[name]), f"{name} did not change"
    after = rewarded_logprob(final, prompts)
    assert after > before + 0.1, (before, after)


@pytest.mark.e2e
def test_trainer_reports_failure_on_bad_engine_url(tmp_path, ring):
    ring_name, writer = ring
    model_dir = tmp_path / "model"
    model = make_model(model_dir, with_tokenizer=False)
    for traj in make_group(model, "g", np.random.default_rng(1), size=2):
        writer.put(encode_trajectory(traj))
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    config = trainer_job(model_dir, ring_name, tmp_path / "run", engine_urls=[f"http://127.0.0.1:{dead}"])
    rc, msgs = run_trainer(config, tmp_path)
    assert rc != 0
    assert not any(isinstance(m, TrainerReport) for m in msgs)
    assert isinstance(msgs[-1], TrainerFailed) and msgs[-1].rank == 0
    assert "WeightUpdateError" in msgs[-1].error and f"127.0.0.1:{dead}" in msgs[-1].error


def test_packed_micro_batches_equal_per_row(tmp_path):
    model = make_model(tmp_path / "m", with_tokenizer=False)
    rng = np.random.default_rng(2)
    trajs = make_group(model, "a", rng) + make_group(model, "b", rng)
    adv = torch.arange(len(trajs), dtype=torch.float32)
    packed = pack_rows(trajs, adv, micro_batch_tokens=10_000)
    single = pack_rows(trajs, adv, micro_batch_tokens=1)
    assert len(packed) == 1 and packed[0].rows == 10 and len(single) == 10
    with torch.no_grad():
        lp_packed = torch.log_softmax(micro_batch_logits(model, packed[0]) / TEMPERATURE, -1)
        lp_single = torch.cat([torch.log_softmax(micro_batch_logits(model, mb) / TEMPERATURE, -1) for mb in single])
    torch.testing.assert_close(lp_packed, lp_single, atol=1e-5, rtol=0)
    targets = packed[0].targets
    got = lp_packed.gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(got, packed[0].behaviour, atol=1e-5, rtol=0)  # == unpacked engine logprobs
    assert torch.equal(packed[0].advantages, torch.cat([mb.advantages for mb in single]))
    # Only sampled tokens are scored: 4 per row, except the 2-token second row of each episode 1.
    assert len(targets) == 4 * 8 + 2 * 2


def test_group_collector_keeps_partial_groups(ring):
    ring_name, writer = ring

    def traj(group: str, i: int, size: int) -> Trajectory:
        row = TokenRow(np.array([1, 2], np.int32), np.array([0, 1], np.uint8), np.zeros(2, np.float32), np.array([-1, 0], np.int32), 0.0)
        return Trajectory.from_rows(episode_id=f"{group}{i}", group_id=group, group_size=size, reward=float(i), status="ok", rows=[row])

    for t in [traj("a", 0, 2), traj("b", 0, 3), traj("b", 1, 3), traj("a", 1, 2), traj("c", 0, 1), traj("b", 2, 3)]:
        writer.put(encode_trajectory(t))
    reader = RingReader(ring_name, timeout_s=5)
    try:
        collector = GroupCollector(reader, record_timeout_s=0.05)
        first = collector.next_batch(2)
        assert [t.episode_id for t in first] == ["a0", "a1", "c0"]
        assert collector.consumed == 5 and list(collector.pending) == ["b"]
        assert [t.episode_id for t in collector.next_batch(1)] == ["b0", "b1", "b2"]
        with pytest.raises(TimeoutError, match=r"trainer.record_timeout_s"):  # records flowed, then none came
            collector.next_batch(1)
    finally:
        reader.close()


def _one_group(group: str) -> bytes:
    row = TokenRow(np.array([1, 2], np.int32), np.array([0, 1], np.uint8), np.zeros(2, np.float32), np.array([-1, 0], np.int32), 0.0)
    return encode_trajectory(
        Trajectory.from_rows(episode_id=f"{group}0", group_id=group, group_size=1, reward=0.0, status="ok", rows=[row])
    )


def test_the_first_record_is_waited_for_while_the_writer_runs_whatever_the_record_timeout(ring):
    """Before its first records the controller evaluates the initial weights, for as long as that
    takes: trainer.record_timeout_s bounds only the waits once records flow."""
    ring_name, writer = ring
    reader = RingReader(ring_name, timeout_s=5)
    late = threading.Timer(1.0, writer.put, [_one_group("late")])  # 20 x the record timeout
    late.start()
    try:
        batch = GroupCollector(reader, record_timeout_s=0.05).next_batch(1)
        assert [t.episode_id for t in batch] == ["late0"]
    finally:
        late.cancel()
        reader.close()


@pytest.mark.timeout(60)  # before: it waited for ever
def test_a_rank_waiting_for_records_stops_when_the_rings_writer_is_gone():
    """The writer (the controller) exits without a word: the rank says so, instead of waiting
    for ever, and takes first what the writer published before it went."""
    name = f"test-trainer-gone-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    code = (
        "import os, sys\n"
        "from areal.ring.buffer import RingWriter\n"
        f"w = RingWriter({name!r}, capacity_bytes=1 << 20)\n"
        "w.put(sys.stdin.buffer.read())\n"
        "os._exit(0)  # no close: the ring still names this process as its writer\n"
    )
    subprocess.run([sys.executable, "-c", code], input=_one_group("last"), check=True, timeout=60)
    reader = RingReader(name, timeout_s=5)
    try:
        assert not reader.writer_alive()
        collector = GroupCollector(reader, record_timeout_s=None)
        assert [t.episode_id for t in collector.next_batch(1)] == ["last0"]
        with pytest.raises(WriterGone, match="the ring's writer is gone"):
            collector.next_batch(1)
    finally:
        reader.close()
        unlink_ring(name)


def test_config_validation_names_the_field_and_round_trips():
    base = dict(model_path="m", ring_name="r", engine_urls=[], report_addr="tcp://127.0.0.1:5", run_dir="d", steps=1, groups_per_step=1)
    job = make_job(**base)
    assert TrainerJob.from_json(job.to_json()) == job
    for field, bad in [
        ("steps", 0),
        ("lr", 0.0),
        ("clip_eps", 1.5),
        ("engine_urls", ["localhost:1"]),
        ("report_addr", "nowhere"),
        ("keep_versions", 0),
        ("micro_batch_tokens", True),
        ("record_timeout_s", 0.0),
    ]:
        with pytest.raises(ValueError, match=field):
            make_job(**{**base, field: bad})
    assert make_job(**{**base, "record_timeout_s": None}).trainer.record_timeout_s is None  # the default: no bound
    assert TrainerJob.from_json(make_job(**{**base, "record_timeout_s": 2.5}).to_json()).trainer.record_timeout_s == 2.5
    with pytest.raises(ValueError, match="bogus"):
        TrainerJob.from_json(json.dumps({**base, "bogus": 1}))
    with pytest.raises(ValueError, match="trainer.lr must be a number"):
        TrainerJob.from_json(json.dumps({**{k: v for k, v in base.items() if k != "steps"}, "trainer": {"lr": "fast"}}))


def test_copy_tokenizer_files_tolerates_a_model_dir_without_them(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    (tmp_path / "src" / "config.json").write_text("{}")
    assert copy_tokenizer_files(tmp_path / "src", tmp_path / "dst") == []
    (tmp_path / "src" / "tokenizer.json").write_text("{}")
    assert copy_tokenizer_files(tmp_path / "src", tmp_path / "dst") == ["tokenizer.json"]


# ---- packing and memory -----------------------------------------------------------------------


def _sgd_delta(model_dir: Path, trajs: list[Trajectory], micro_batch_tokens: int, **overrides) -> dict[str, torch.Tensor]:
    """Parameter change of one train_step with SGD(lr=1) and no clipping: minus the gradient."""
    from areal.trainer.packing import PolicyScorer
    from areal.trainer.step import train_step

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = TrainerConfig(steps=1, max_grad_norm=1e9, micro_batch_tokens=micro_batch_tokens, **overrides)
    scorer = PolicyScorer(model, TEMPERATURE, varlen=config.varlen_attention)
    train_step(scorer, torch.optim.SGD(model.parameters(), lr=1.0), trajs, config, version=0)
    return {n: p.detach() - before[n] for n, p in model.named_parameters()}


def _padded_grad(model_dir: Path, trajs: list[Trajectory]) -> dict[str, torch.Tensor]:
    """The same GRPO gradient from a plain right-padded (B, T) batch with an attention mask."""
    from areal.trainer.loss import group_advantages

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    adv = group_advantages(torch.tensor([t.reward for t in trajs]), [t.group_id for t in trajs])
    rows = [(r, a) for t, a in zip(trajs, adv.tolist()) for r in t.rows()]
    T = max(len(r.input_ids) for r, _ in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    att = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T)
    beh = torch.zeros(len(rows), T)
    advs = torch.zeros(len(rows), T)
    for i, (r, a) in enumerate(rows):
        n = len(r.input_ids)
        ids[i, :n] = torch.from_numpy(r.input_ids.astype(np.int64))
        att[i, :n] = 1
        mask[i, :n] = torch.from_numpy(r.loss_mask.astype(np.float32))
        beh[i, :n] = torch.from_numpy(r.logprobs.copy())
        advs[i, :n] = a
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits[:, :-1] / TEMPERATURE, -1)  # (B, T-1, V)
    lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ratio = torch.exp(lp - beh[:, 1:])
    a = advs[:, 1:]
    per_token = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
    ((per_token * mask[:, 1:]).sum() / mask[:, 1:].sum()).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_packed_equals_padded_and_micro_batches_1x8_equal_8x1(tmp_path):
    """Packed rows (row-by-row attention, the default) == packed rows under one block-diagonally
    masked SDPA (trainer.varlen_attention=false) == one row per micro-batch == a padded batch."""
    model_dir = tmp_path / "m"
    model = make_model(model_dir, with_tokenizer=False)
    rng = np.random.default_rng(5)
    trajs = make_group(model, "a", rng) + make_group(model, "b", rng)  # 8 episodes, 10 rows
    one_by_eight = _sgd_delta(model_dir, trajs, micro_batch_tokens=10_000)
    masked = _sgd_delta(model_dir, trajs, micro_batch_tokens=10_000, varlen_attention=False)
    eight_by_one = _sgd_delta(model_dir, trajs, micro_batch_tokens=1)
    padded = _padded_grad(model_dir, trajs)
    assert any(float(d.abs().max()) > 1e-4 for d in one_by_eight.values())  # a real gradient, not zeros
    for name, d in one_by_eight.items():
        torch.testing.assert_close(d, masked[name], atol=1e-6, rtol=1e-4, msg=name)
        torch.testing.assert_close(d, eight_by_one[name], atol=1e-6, rtol=1e-4, msg=name)
        torch.testing.assert_close(-d, padded[name], atol=1e-6, rtol=1e-4, msg=name)


def test_packed_attention_needs_row_bounds_and_is_sdpa_without_them(tmp_path):
    """A model switched to PACKED_ATTENTION by a scorer answers plain calls as SDPA does, and its
    row bounds are the position-id restarts."""
    from areal.trainer.packing import PACKED_ATTENTION, PolicyScorer, row_bounds

    model = make_model(tmp_path / "m", with_tokenizer=False)
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    att = torch.ones_like(ids)
    att[1, 9:] = 0  # a right-padded row
    want = model(input_ids=ids, attention_mask=att).logits
    PolicyScorer(model, TEMPERATURE)
    assert model.config._attn_implementation == PACKED_ATTENTION
    torch.testing.assert_close(model(input_ids=ids, attention_mask=att).logits, want)
    assert row_bounds(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])) == [0, 3, 5, 9]
    PolicyScorer(model, TEMPERATURE, varlen=False)  # leaves a model another scorer switched as it is
    assert model.config._attn_implementation == PACKED_ATTENTION


MEMORY_SCRIPT = r"""  # argv: micro_batch_tokens, prompt tokens per 512-token row
import resource, sys, torch, numpy as np
from transformers import Qwen2Config, Qwen2ForCausalLM
from areal.trainer.packing import PolicyScorer, pack_rows
from areal.trainer.loss import grpo_loss
from areal.protocol import TokenRow, Trajectory
torch.set_num_threads(1)
V, ROWS, T, PROMPT = 151936, 16, 512, int(sys.argv[2])
cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=T, tie_word_embeddings=True)
model = Qwen2ForCausalLM(cfg).eval()
rng = np.random.default_rng(0)
trajs = []
for i in range(ROWS):
    ids = rng.integers(0, V, T).astype(np.int32)
    mask = np.r_[np.zeros(PROMPT), np.ones(T - PROMPT)].astype(np.uint8)
    row = TokenRow(ids, mask, np.full(T, -12.0, np.float32) * mask, np.where(mask == 1, 0, -1).astype(np.int32), 0.0)
    trajs.append(Trajectory.from_rows(episode_id=str(i), group_id="g", group_size=ROWS, reward=float(i % 2),
                                      status="ok", rows=[row]))
scorer = PolicyScorer(model, 1.0)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
total, scored = ROWS * (T - PROMPT), 0
for mb in pack_rows(trajs, torch.tensor([1.0, -1.0] * (ROWS // 2)), micro_batch_tokens=int(sys.argv[1])):
    lp, ent = scorer(mb)
    loss, st = grpo_loss(lp, mb.behaviour, mb.advantages, torch.ones_like(lp), 0.2)
    (loss * st["tokens"] / total).backward()
    scored += int(st["tokens"])
assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.parameters())
print(scored, base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_memory_is_flat_in_vocabulary_16x512_tokens_151936_vocab(tmp_path):
    """Peak RSS of forward+backward of the GRPO loss over a packed 16 x 512-token batch with
    Qwen2.5's vocabulary, every token scored: each row is one prompt token and 511 sampled ones
    (the first token of a row has no state before it to be scored from), 8,176 scored in all.
    Full (tokens, vocab) logits would be 8176 * 151936 * 4 B = 5.0 GB, doubled by their gradient;
    the chunked, recomputing head (areal/trainer/loss.py) must stay far below the 3 GB bound. The hidden
    size is tiny: the head's memory is set by the vocabulary, and its time stays ~15 s of CPU."""
    script = tmp_path / "mem.py"
    script.write_text(MEMORY_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), "1024", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    scored, base_kib, peak_kib = map(int, out.stdout.split()[-3:])
    assert scored == 16 * 511
    assert peak_kib < 3 * 1024 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
    assert peak_kib - base_kib < 600 * 1024, f"training added {(peak_kib - base_kib) / 1024:.0f} MiB over the model"


# ---- golden loss trace --------------------------------------------------------------------------

GOLDEN = SUPPORT / "golden" / "trainer_loss_trace.json"


def test_golden_loss_trace(tmp_path):
    """A fixed tiny model and fixed trajectories, 4 steps of each loss: losses and grad norms must
    match the checked-in trace. Regenerate (after an intended change) with AREAL_REGEN_GOLDEN=1."""
    from areal.trainer.packing import PolicyScorer
    from areal.trainer.step import train_step

    model_dir = tmp_path / "m"
    model = make_model(model_dir, with_tokenizer=False)
    rng = np.random.default_rng(123)
    steps = [make_group(model, f"s{i}a", rng) + make_group(model, f"s{i}b", rng) for i in range(4)]
    trace = {}
    for loss in ("grpo", "ppo"):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        config = TrainerConfig(
            steps=4,
            lr=3e-3,
            micro_batch_tokens=32,
            loss=loss,
            minibatches=2 if loss == "ppo" else 1,
            dual_clip=3.0,
            behav_weight_cap=4.0 if loss == "ppo" else None,
            kl_coef=0.05,
        )
        reference = PolicyScorer(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(), TEMPERATURE)
        opt = torch.optim.AdamW(m.parameters(), lr=config.lr)
        rows = [train_step(PolicyScorer(m, TEMPERATURE), opt, trajs, config, version=0, reference=reference) for trajs in steps]
        trace[loss] = [{k: r[k] for k in ("loss", "grad_norm", "clip_frac", "entropy", "ref_kl")} for r in rows]
    if os.environ.get("AREAL_REGEN_GOLDEN"):
        GOLDEN.write_text(json.dumps(trace, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert golden.keys() == trace.keys()
    for loss in golden:
        assert trace[loss][-1]["loss"] < trace[loss][0]["loss"]  # it learns on these groups
        for i, (want, got) in enumerate(zip(golden[loss], trace[loss], strict=True)):
            for k in want:
                assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), (loss, i, k, got, want)

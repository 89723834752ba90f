"""The lean forward (areal/engine/model.py) against HF's forward, and the sampler's stream.

Equivalence: prefill and decode logits ≡ HF's full forward of the same tokens (to 1e-4), through
slot moves, cache growth and weight updates; an in-process ``Engine`` with the lean forward
decodes greedily exactly what ``generate`` does and what the HF-forward engine does. Unit: the
sampler draws each token with its distribution's frequency; a row's uniform stream does not
depend on the block size it is drawn in.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import tiny_qwen2
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2ForCausalLM

from areal.engine.batch import Engine, GenerationRequest
from areal.engine.model import LeanForward, SlotBatch, lean_unsupported
from areal.engine.sampling import RowRandom, SamplingParams, sample_next
from areal.kernels import onednn_available

TOL = 1e-4


@pytest.fixture(autouse=True)
def one_thread():
    # As the engine runs: on a loaded 2-core machine, OpenMP hand-offs on tiny tensors cost ms each.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _qwen2(tie: bool = True, **over: object) -> Qwen2ForCausalLM:
    return tiny_qwen2(
        **{"intermediate_size": 96, "max_position_embeddings": 96, "tie_word_embeddings": tie, "initializer_range": 0.2, **over}
    )


def _reference(model: torch.nn.Module, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, -1]  # (V,)


def _row(rid: str, ids: list[int], **sp: object) -> GenerationRequest:
    return GenerationRequest(rid=rid, input_ids=ids, params=SamplingParams(**{"max_new_tokens": 8, **sp}), return_logprob=True)


def _kernels(monkeypatch: pytest.MonkeyPatch, onednn: bool) -> None:
    """The linears on oneDNN's packed weights, or on the weights themselves (AREAL_ONEDNN=0)."""
    if onednn and not onednn_available(torch.device("cpu"), torch.float32):
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setenv("AREAL_ONEDNN", "1" if onednn else "0")


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("tie", [True, False])
def test_prefill_and_decode_logits_match_hf(tie: bool, onednn: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    _kernels(monkeypatch, onednn)
    model = _qwen2(tie)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (5, 11, 1)]
    with torch.inference_mode():
        lean = LeanForward(model, slots=4)
        assert lean.onednn == onednn and lean.lm_head.packed == onednn
        batch = SlotBatch(lean)
        logits = batch.prefill(model, [_row(str(i), s) for i, s in enumerate(seqs)])
        for _ in range(6):
            for i, s in enumerate(seqs):
                assert (logits[i] - _reference(model, s)).abs().max() < TOL
            nxt = logits.argmax(-1).tolist()
            for s, t in zip(seqs, nxt):
                s.append(t)
            batch.set_next(0, nxt)
            logits = batch.decode(model)


def test_a_shared_prefix_is_prefilled_once_with_the_same_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rows joining a running batch share a prefix (a system prompt); one row is nothing but the
    # prefix plus one token; the rows' own parts differ in length (packed, no padding computed).
    model = _qwen2()
    lean = LeanForward(model, slots=6)
    passes: list[int] = []
    forward = lean.forward
    monkeypatch.setattr(lean, "forward", lambda ids, *a: passes.append(ids.numel()) or forward(ids, *a))
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(3, 300, (12,), generator=g).tolist()
    seqs = [prefix + torch.randint(3, 300, (n,), generator=g).tolist() for n in (1, 7, 3)]
    running = torch.randint(3, 300, (5,), generator=g).tolist()
    with torch.inference_mode():
        batch = SlotBatch(lean)
        batch.prefill(model, [_row("r", running)])
        logits = batch.prefill(model, [_row(str(i), s) for i, s in enumerate(seqs)])
        assert passes[1:] == [12, 3 * 7], "the prefix once, then each row's own tokens (padded to the longest)"
        everyone = [running, *seqs]
        batch.set_next(0, [0] * 4)
        for s in everyone:
            s.append(0)
        for i, s in enumerate(seqs):
            assert (logits[i] - _reference(model, s[:-1])).abs().max() < TOL
        decoded = batch.decode(model)
        for i, s in enumerate(everyone):
            assert (decoded[i] - _reference(model, s)).abs().max() < TOL


def test_rows_leave_and_join_without_disturbing_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("areal.engine.model.INITIAL_ROWS", 1)  # the cache grows rows as they join
    model = _qwen2()
    seqs = {"a": [5, 6, 7], "b": [9] * 9, "c": [20, 21], "d": [40, 41, 42, 43]}
    with torch.inference_mode():
        lean = LeanForward(model, slots=3)
        batch = SlotBatch(lean)
        rows = {k: _row(k, v) for k, v in seqs.items()}

        def step(logits: torch.Tensor, first: int, members: list[GenerationRequest]) -> None:
            for i, r in enumerate(members):
                seq = seqs[r.rid]
                assert (logits[i] - _reference(model, seq)).abs().max() < TOL, r.rid
                tok = int(logits[i].argmax())
                seq.append(tok)
                r.output_ids.append(tok)
            batch.set_next(first, [seqs[r.rid][-1] for r in members])

        step(batch.prefill(model, [rows["a"], rows["b"], rows["c"]]), 0, [rows["a"], rows["b"], rows["c"]])
        step(batch.decode(model), 0, list(batch.rows))
        gone = batch.remove(lambda r: r.rid == "a")  # slot 0 is refilled by the last row ("c")
        assert [r.rid for r in gone] == ["a"] and [r.rid for r in batch.rows] == ["c", "b"]
        step(batch.decode(model), 0, list(batch.rows))
        step(batch.prefill(model, [rows["d"]]), 2, [rows["d"]])
        for _ in range(3):
            step(batch.decode(model), 0, list(batch.rows))
        batch.remove(lambda r: r.rid in ("b", "c"))
        step(batch.decode(model), 0, list(batch.rows))
        assert [r.rid for r in batch.rows] == ["d"] and lean.rows_allocated == 3


def test_cache_grows_past_its_initial_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("areal.engine.model.INITIAL_CAPACITY", 4)
    monkeypatch.setattr("areal.engine.model.INITIAL_ROWS", 1)
    model = _qwen2()
    seq = [7, 8, 9]
    with torch.inference_mode():
        lean = LeanForward(model, slots=2)
        batch = SlotBatch(lean)
        logits = batch.prefill(model, [_row("x", list(seq))])
        for _ in range(12):
            assert (logits[0] - _reference(model, seq)).abs().max() < TOL
            seq.append(int(logits[0].argmax()))
            batch.set_next(0, seq[-1:])
            logits = batch.decode(model)
        assert lean.capacity >= len(seq) and lean.capacity <= 96 and lean.rows_allocated == 1


@pytest.mark.parametrize("onednn", [True, False])
def test_refresh_follows_in_place_weight_updates(onednn: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    _kernels(monkeypatch, onednn)  # packed weights are copies: refresh() must remake them
    model, other = _qwen2(), _qwen2(initializer_range=0.3)
    with torch.inference_mode():
        lean = LeanForward(model, slots=1)
        with torch.no_grad():
            for name, t in other.state_dict().items():
                model.state_dict()[name].copy_(t)
        lean.refresh()
        logits = lean.forward(torch.tensor([[3, 4, 5]]), torch.arange(3)[None], 0, torch.tensor([2]))
        assert (logits[0] - _reference(other, [3, 4, 5])).abs().max() < TOL


def test_llama_is_served_and_unsupported_models_say_why() -> None:
    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=200,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            max_position_embeddings=64,
            initializer_range=0.2,
            attention_bias=True,
            mlp_bias=True,
        )
    ).eval()
    assert lean_unsupported(llama) is None and llama.model.layers[0].mlp.down_proj.bias is not None
    with torch.no_grad():  # nonzero biases everywhere (q/k/v/o and MLP), so every bias path counts
        for name, p in llama.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    with torch.inference_mode():
        logits = LeanForward(llama, slots=1).forward(torch.tensor([[1, 2, 3, 4]]), torch.arange(4)[None], 0, torch.tensor([3]))
        assert (logits[0] - _reference(llama, [1, 2, 3, 4])).abs().max() < TOL
    assert "sliding" in (lean_unsupported(_qwen2(use_sliding_window=True, sliding_window=8)) or "")
    assert "silu" in (lean_unsupported(_qwen2(hidden_act="gelu")) or "")
    with pytest.raises(ValueError, match="sliding"):
        LeanForward(_qwen2(use_sliding_window=True, sliding_window=8), slots=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lean") / "model"
    model = _qwen2()
    model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    return path


def _serve(engine: Engine, prompts: list[list[int]], **sp: object) -> list[GenerationRequest]:
    rows = [_row(f"r{i}", p, ignore_eos=True, **sp) for i, p in enumerate(prompts)]
    futures = [engine.submit(r) for r in rows]
    return [f.result(timeout=60) for f in futures]


def test_engine_lean_greedy_equals_generate_and_hf_engine(model_dir: Path) -> None:
    prompts = [[5, 6, 7, 8], [100, 200], [3, 1, 4, 1, 5, 9, 2, 6]]
    lean = Engine(str(model_dir), max_batch=4, weight_version="v", forward="lean")
    hf = Engine(str(model_dir), max_batch=4, weight_version="v", forward="hf")
    try:
        assert lean.forward == "lean" and hf.forward == "hf"
        a = _serve(lean, prompts, temperature=0.0, max_new_tokens=12)
        b = _serve(hf, prompts, temperature=0.0, max_new_tokens=12)
        seeded_a = _serve(lean, prompts, temperature=1.0, max_new_tokens=12, sampling_seed=3)
        seeded_b = _serve(hf, prompts, temperature=1.0, max_new_tokens=12, sampling_seed=3)
    finally:
        lean.shutdown()
        hf.shutdown()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for prompt, ra, rb in zip(prompts, a, b):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert ra.output_ids == ref[0, len(prompt) :].tolist() == rb.output_ids
        assert max(abs(x - y) for x, y in zip(ra.logprobs, rb.logprobs)) < TOL
    # Same seed, same tokens whichever forward computed the logits.
    assert [r.output_ids for r in seeded_a] == [r.output_ids for r in seeded_b]


def test_engine_refuses_lean_for_an_unsupported_model(tmp_path: Path) -> None:
    _qwen2(use_sliding_window=True, sliding_window=8).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="forward"):
        Engine(str(tmp_path), max_batch=2, weight_version="v", forward="lean")


def test_sampler_frequencies_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = torch.log(probs)[None].expand(4, 5).contiguous()  # (4, V): 4 rows, one distribution
    params = [
        SamplingParams(max_new_tokens=1),
        SamplingParams(max_new_tokens=1, top_k=2),
        SamplingParams(max_new_tokens=1, top_p=0.7),
        SamplingParams(max_new_tokens=1, temperature=0.0),
    ]
    streams = [RowRandom(i) for i in range(4)]
    counts = torch.zeros(4, 5)
    draws = 4000
    for _ in range(draws):
        s = sample_next(logits, params, [r.draw() for r in streams])
        counts[torch.arange(4), torch.tensor(s.tokens)] += 1
    freq = counts / draws
    assert (freq[0] - probs).abs().max() < 0.03 and freq[0, 4] == 0  # a zero-mass token never comes out
    assert (freq[1, :2] - torch.tensor([0.625, 0.375])).abs().max() < 0.03 and freq[1, 2:].sum() == 0
    assert (freq[2, :2] - torch.tensor([0.625, 0.375])).abs().max() < 0.03 and freq[2, 2:].sum() == 0  # top-p 0.7
    assert freq[3, 0] == 1.0  # greedy


def test_row_random_is_one_stream_per_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    a = [RowRandom(5).draw() for _ in range(1)]
    whole = RowRandom(5)
    firsts = [whole.draw() for _ in range(3 * RowRandom.BLOCK)]
    assert a[0] == firsts[0] and len(set(firsts)) == len(firsts) and all(0 <= u < 1 for u in firsts)
    monkeypatch.setattr(RowRandom, "BLOCK", 8)  # a smaller block: the same stream
    small = RowRandom(5)
    assert [small.draw() for _ in range(3 * 64)] == firsts
    assert RowRandom(6).draw() != firsts[0]


def _reference_keep(logprobs: torch.Tensor, p: SamplingParams) -> set[int]:
    """Tokens SGLang's torch sampler keeps for one row: rank the whole vocabulary."""
    lp, order = logprobs.sort(descending=True)
    probs = lp.exp()
    keep = ((probs.cumsum(0) - probs) <= p.top_p) & (torch.arange(len(lp)) < p.top_k) & (probs >= probs[0] * p.min_p)
    return set(order[keep].tolist())


def test_candidate_ranking_truncates_exactly_as_a_full_sort() -> None:
    torch.manual_seed(3)
    vocab = 500
    logits = torch.cat([torch.randn(3, vocab) * 4, torch.zeros(1, vocab) + torch.randn(1, vocab) * 1e-3])  # row 3: flat
    params = [
        SamplingParams(max_new_tokens=1, top_p=0.8),
        SamplingParams(max_new_tokens=1, top_k=100),
        SamplingParams(max_new_tokens=1, min_p=0.05, top_p=0.95),
        SamplingParams(max_new_tokens=1, top_p=0.9),
    ]
    streams = [RowRandom(i) for i in range(4)]
    seen: list[set[int]] = [set() for _ in params]
    lp = torch.log_softmax(logits, dim=-1)
    kept = [_reference_keep(lp[i], p) for i, p in enumerate(params)]
    assert len(kept[3]) > 64 and len(kept[1]) == 100  # the flat row needs the full-sort fallback
    for _ in range(300):
        for i, tok in enumerate(sample_next(logits, params, [r.draw() for r in streams]).tokens):
            seen[i].add(tok)
    for i in range(4):
        assert seen[i] <= kept[i], i  # never a token the full sort would drop
    assert len(seen[3]) > 64  # the flat row does sample past the 64 candidates


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_bfloat16_lean_is_as_close_to_fp32_as_hf_in_bfloat16(device: str) -> None:
    """Served in bfloat16 (cache, RoPE tables and mask in it; softmax in fp32, as HF), the lean
    forward strays from the fp32 logits no further than HF's own bfloat16 forward does."""
    model = _qwen2()
    half = _qwen2().to(torch.bfloat16)
    half.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    half.to(device)
    seq = [5, 17, 200, 3, 9, 41]
    with torch.inference_mode():
        lean = LeanForward(half, slots=2)
        assert lean.keys[0].dtype == torch.bfloat16 and lean.keys[0].device.type == device
        batch = SlotBatch(lean)
        logits = batch.prefill(half, [_row("x", list(seq))])
        for _ in range(5):
            assert logits.dtype == torch.float32 and logits.device.type == "cpu"  # sampled on the CPU
            exact = _reference(model, seq)
            hf_half = half(torch.tensor([seq], device=device)).logits[0, -1].float().cpu()
            assert (logits[0] - exact).abs().max() <= 2 * (hf_half - exact).abs().max() + 1e-2
            seq.append(int(exact.argmax()))
            batch.set_next(0, seq[-1:])
            logits = batch.decode(half)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_engine_serves_on_its_device_what_it_serves_on_the_cpu(model_dir: Path, device: str) -> None:
    """An engine on ``device`` in fp32 decodes greedily the CPU engine's tokens, logprobs to 1e-4;
    a device this machine lacks is refused by name."""
    if device == "cpu" and not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA GPU"):
            Engine(str(model_dir), max_batch=2, weight_version="v", device="cuda")
    prompts = [[5, 6, 7, 8], [100, 200]]
    on_cpu = Engine(str(model_dir), max_batch=4, weight_version="v")
    on_dev = Engine(str(model_dir), max_batch=4, weight_version="v", device=device)
    try:
        assert on_dev.device.startswith(device) and on_dev.forward == "lean"
        a = _serve(on_cpu, prompts, temperature=0.0, max_new_tokens=10)
        b = _serve(on_dev, prompts, temperature=0.0, max_new_tokens=10)
    finally:
        on_cpu.shutdown()
        on_dev.shutdown()
    for ra, rb in zip(a, b):
        assert ra.output_ids == rb.output_ids
        assert max(abs(x - y) for x, y in zip(ra.logprobs, rb.logprobs)) < TOL

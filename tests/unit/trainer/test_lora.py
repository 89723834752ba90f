"""LoRA (trainer.lora, areal/trainer/lora.py): a whole run of `python -m areal.train` with
trainer.lora.rank=4 on the embedded model trains the adapters only, the engine serves the merged
weights (its logprobs agree with the adapted trainer's at every step), the published weights are
W + alpha/r · B @ A of the adapter saved beside them, and that adapter loads with peft's
PeftModel.from_pretrained. Two DDP ranks end where one rank does; the wrapped model's state dict
round-trips (what a checkpoint holds); adapter dropout acts in training forwards only; bad
settings are refused naming the key, from the dataclass, the command line and AReaL's spelling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from paths import ROOT
from peft import PeftModel
from run_checks import read_jsonl, run_ok, train_cmd
from safetensors.torch import load_file
from trainer_harness import RANK_JOB, TEMPERATURE, UPDATE_ATOL, Rings, make_group, make_model, run_ranks, trainer_job
from transformers import AutoModelForCausalLM

import areal.train  # noqa: F401  (registers the schema with Hydra's ConfigStore)
from areal.api.cli_args import GRPOConfig, load_expr_config
from areal.embedded import ensure_embedded_model
from areal.experimental.trainer import to_train_config
from areal.protocol import TrainerDone
from areal.trainer.config import LoraConfig, TrainerConfig
from areal.trainer.lora import ADAPTER_DIR, AdaptersOff, MergedWeights, attach_adapters, lora_layers
from areal.trainer.packing import PolicyScorer, pack_rows
from areal.trainer.rank import train
from areal.weights.collective import named_tensors_to_send

CONF = ROOT / "conf"
RANK, ALPHA = 4, 8.0
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # all-linear on Qwen2


def _expected_merge(base: dict[str, torch.Tensor], adapter_dir: Path) -> dict[str, torch.Tensor]:
    """base + alpha/r · B @ A, from the files peft wrote (its own key layout), by hand."""
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    ad = load_file(adapter_dir / "adapter_model.safetensors")
    out = dict(base)
    for key, a in ad.items():
        if key.endswith(".lora_A.weight"):
            module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = ad[key.replace(".lora_A.", ".lora_B.")]
            out[f"{module}.weight"] = base[f"{module}.weight"] + scale * (b @ a)
    return out


@pytest.mark.e2e
def test_a_lora_run_trains_adapters_and_publishes_merged_weights(tmp_path):
    model_dir = Path(ensure_embedded_model())
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir,
        "trainer.steps=3",
        "trainer.lr=1e-3",
        "trainer.kl_coef=0.01",
        f"trainer.lora.rank={RANK}",
        f"trainer.lora.alpha={ALPHA}",
        "rollout.groups_per_step=2",
        "rollout.n_samples=4",
        "rollout.max_head_offpolicyness=0",
        "rollout.openai.mode=inline",
        "data.eval_size=0",
    )
    run_ok(cmd, timeout_s=300)
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in steps] == [1, 2, 3] and any(m["adv_nonzero_frac"] > 0 for m in steps)
    # Step 1: B = 0, the adapted model is the base. Steps 2 and 3: the engine sampled with the
    # merged weights it was pushed, the trainer scored with base + adapters: the same model.
    assert all(m["logprob_max_diff"] < 1e-4 for m in steps), [m["logprob_max_diff"] for m in steps]
    assert abs(steps[0]["ref_kl"]) < 1e-6 < steps[-1]["ref_kl"], [m["ref_kl"] for m in steps]

    base = load_file(model_dir / "model.safetensors")
    final_dir = run_dir / "final"
    final = load_file(final_dir / "model.safetensors")
    assert set(final) == set(base)  # a plain HF model: the engine cannot tell it from full fine-tuning
    assert not (final_dir / "adapter_config.json").exists()  # would turn the dir into an adapter
    changed = {k for k in base if not torch.equal(base[k], final[k])}
    targeted = {k for k in base if k.endswith(".weight") and k.split(".")[-2] in TARGETS}
    assert changed == targeted, f"changed but frozen: {sorted(changed - targeted)}; unchanged: {sorted(targeted - changed)}"
    assert max(float((final[k] - base[k]).abs().max()) for k in changed) > 1e-4  # the adapters moved

    # What was pushed last (weights/v3, keep_versions=2 keeps v2 too) is base + B @ A of its adapter.
    for version in (2, 3):
        pushed_dir = run_dir / "weights" / f"v{version}"
        pushed = load_file(pushed_dir / "model.safetensors")
        want = _expected_merge(base, pushed_dir / ADAPTER_DIR)
        for k in base:
            torch.testing.assert_close(pushed[k], want[k], atol=1e-6, rtol=1e-6, msg=k)
    v3 = load_file(run_dir / "weights" / "v3" / "model.safetensors")
    assert all(torch.equal(v3[k], final[k]) for k in final)

    # peft's own loader reads the final adapter onto the base model, and merges to the same weights.
    config = json.loads((final_dir / ADAPTER_DIR / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (RANK, ALPHA, str(model_dir))
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), final_dir / ADAPTER_DIR)
    merged = peft_model.merge_and_unload().state_dict()
    for k in final:
        torch.testing.assert_close(merged[k], final[k], atol=1e-6, rtol=1e-6, msg=k)


@pytest.mark.e2e
def test_two_ddp_ranks_with_lora_match_one_rank(tmp_path):
    model_dir = tmp_path / "model"
    model = make_model(model_dir, with_tokenizer=False)
    rng = np.random.default_rng(5)
    groups = [make_group(model, f"g{i}", rng, size=2) for i in range(4)]
    lora = LoraConfig(rank=RANK, alpha=ALPHA, target_modules=["q_proj", "v_proj", "down_proj"])
    with Rings("lora", 3) as rings:
        rings.put(0, *groups)
        for i, g in enumerate(groups):  # rank r gets every other group: the same data, split
            rings.put(1 + i % 2, g)
        names = rings.names
        one = trainer_job(model_dir, names[0], tmp_path / "one", **RANK_JOB, lora=lora)
        two = trainer_job(model_dir, names[1], tmp_path / "two", ring_names=names[1:], **RANK_JOB, lora=lora)
        train(one, None)  # the one-rank reference, in this process (a subprocess costs its imports again)
        msgs_two = run_ranks(2, two, tmp_path)
    assert isinstance(msgs_two[-1], TrainerDone), msgs_two[-1:]
    initial = dict(model.state_dict())
    a = load_file(tmp_path / "one" / "final" / "model.safetensors")
    b = load_file(tmp_path / "two" / "final" / "model.safetensors")
    moved = {k for k in a if not torch.equal(a[k], initial[k])}
    assert moved == {k for k in a if k.endswith((".q_proj.weight", ".v_proj.weight", ".down_proj.weight"))}
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=UPDATE_ATOL, rtol=0, msg=k)
    for k in load_file(tmp_path / "one" / "final" / ADAPTER_DIR / "adapter_model.safetensors"):
        assert ".lora_A." in k or ".lora_B." in k


def _wrapped(model_dir: Path, **lora: object) -> tuple[torch.nn.Module, PeftModel]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, attach_adapters(model, LoraConfig(**{"rank": RANK, "alpha": ALPHA, **lora}))


def test_wrapped_state_dict_round_trips_and_only_adapters_are_trainable(tmp_path):
    model_dir = tmp_path / "model"
    make_model(model_dir, with_tokenizer=False)
    model, peft_model = _wrapped(model_dir)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert all(float(layer.lora_B["default"].weight.detach().abs().max()) == 0 for layer in lora_layers(model).values())
    torch.manual_seed(1)
    with torch.no_grad():
        for p in (p for n, p in model.named_parameters() if ".lora_B." in n):
            p.normal_(std=0.05)
    state = model.state_dict()  # what a checkpoint of the trainer's model holds
    again, peft_again = _wrapped(model_dir)
    again.load_state_dict(state)  # strict: the same keys, base and adapter
    want, got = MergedWeights(peft_model).state_dict(), MergedWeights(peft_again).state_dict()
    assert set(want) == set(AutoModelForCausalLM.from_pretrained(model_dir).state_dict())
    for k in want:
        assert torch.equal(want[k], got[k]), k


def test_adapter_dropout_acts_in_training_forwards_only(tmp_path):
    model_dir = tmp_path / "model"
    model0 = make_model(model_dir, with_tokenizer=False)
    rng = np.random.default_rng(0)
    mb = pack_rows(make_group(model0, "g", rng, size=2), [torch.tensor(1.0), torch.tensor(-1.0)], 4096)[0]
    model, _ = _wrapped(model_dir, dropout=0.5)
    with torch.no_grad():
        for p in (p for n, p in model.named_parameters() if ".lora_B." in n):
            p.normal_(std=0.5)
    scorer = PolicyScorer(model, TEMPERATURE)
    with torch.no_grad():
        first, second = scorer(mb)[0], scorer(mb)[0]
    assert torch.equal(first, second)  # no-grad passes (engine agreement, proximal) are deterministic
    trained = scorer(mb)[0]
    assert trained.requires_grad and not torch.allclose(trained, first, atol=1e-4)


def test_the_kl_reference_of_a_lora_run_is_the_base_model(tmp_path):
    model_dir = tmp_path / "model"
    base = make_model(model_dir, with_tokenizer=False)
    mb = pack_rows(make_group(base, "g", np.random.default_rng(1), size=2), [torch.tensor(1.0), torch.tensor(-1.0)], 4096)[0]
    model, peft_model = _wrapped(model_dir)
    with torch.no_grad():
        for p in (p for n, p in model.named_parameters() if ".lora_B." in n):
            p.normal_(std=0.5)
    scorer = PolicyScorer(model, TEMPERATURE)
    reference = AdaptersOff(scorer, peft_model)
    assert list(reference.parameters()) == []  # no copy of the weights
    with torch.no_grad():
        want = PolicyScorer(base, TEMPERATURE)(mb)[0]
        adapted = scorer(mb)[0]
    got = reference(mb)[0]
    assert not got.requires_grad
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(adapted, want, atol=1e-3)  # the adapters were on before, and are on again
    torch.testing.assert_close(scorer(mb)[0].detach(), adapted)


@pytest.mark.parametrize(
    "lora,named",
    [
        ({"rank": -1}, "trainer.lora.rank must be an integer >= 0"),
        ({"rank": 2.5}, "trainer.lora.rank must be an integer"),
        ({"rank": 4, "alpha": 0}, "trainer.lora.alpha must be a number > 0"),
        ({"rank": 4, "dropout": 1.0}, r"trainer.lora.dropout must be in \[0, 1\)"),
        ({"rank": 4, "target_modules": []}, "trainer.lora.target_modules must be a non-empty list"),
        ({"rank": 4, "target_modules": ["q_proj", ""]}, "trainer.lora.target_modules must be a non-empty list"),
        ({"rank": 4, "target_modules": ["all-linear", "q_proj"]}, "stands alone"),
        ({"rank": 4, "target_modules": ["lm_head"]}, "cannot carry adapters"),
    ],
)
def test_bad_lora_settings_are_refused_naming_the_key(lora, named):
    with pytest.raises(ValueError, match=named):
        LoraConfig(**lora)


def test_lora_is_refused_with_fsdp2_and_on_modules_the_model_lacks(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.lora \(rank=4\) is supported with trainer.parallel=ddp only"):
        TrainerConfig(parallel="fsdp2", lora=LoraConfig(rank=4))
    TrainerConfig(parallel="fsdp2")  # LoRA off: FSDP2 as before
    assert LoraConfig(rank=4, target_modules="all-linear").target_modules == ["all-linear"]  # peft's spelling
    model_dir = tmp_path / "model"
    make_model(model_dir, with_tokenizer=False)
    with pytest.raises(ValueError, match=r"trainer.lora.target_modules=\['qkv'\]"):
        _wrapped(model_dir, target_modules=["qkv"])


def test_lora_keys_from_the_command_line_and_from_areal():
    with initialize_config_dir(str(CONF), version_base=None):
        config = OmegaConf.to_object(
            compose(
                config_name="config",
                overrides=["trainer.lora.rank=8", "trainer.lora.alpha=32", "trainer.lora.target_modules=[q_proj,v_proj]"],
            )
        )
        assert config.trainer.lora == LoraConfig(rank=8, alpha=32.0, target_modules=["q_proj", "v_proj"])
        assert OmegaConf.to_object(compose(config_name="config")).trainer.lora.rank == 0  # off by default
        with pytest.raises(ValueError, match="trainer.lora.dropout"):
            OmegaConf.to_object(compose(config_name="config", overrides=["trainer.lora.rank=8", "trainer.lora.dropout=1.5"]))
    areal, _ = load_expr_config(
        ["actor.use_lora=true", "actor.lora_rank=16", "actor.lora_alpha=32", "actor.target_modules=[q_proj,v_proj]"], GRPOConfig
    )
    assert to_train_config(areal, None, 10, 0, True).trainer.lora == LoraConfig(rank=16, alpha=32.0, target_modules=["q_proj", "v_proj"])
    plain, _ = load_expr_config(["actor.lora_rank=16"], GRPOConfig)  # AReaL: rank is read only with use_lora
    assert to_train_config(plain, None, 10, 0, True).trainer.lora.rank == 0
    with pytest.raises(ValueError, match="actor.peft_type"):
        load_expr_config(["actor.peft_type=ia3"], GRPOConfig)


def test_a_lora_model_and_its_optimizer_round_trip_through_distributed_checkpoint(tmp_path):
    """What a torch.distributed.checkpoint of the trainer's (model, AdamW) holds for LoRA: base and
    adapter tensors under peft's names, AdamW state for the adapters only; loaded into a model
    wrapped with the same settings it restores both."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_dir = tmp_path / "model"
    make_model(model_dir, with_tokenizer=False)

    def build() -> tuple[torch.nn.Module, PeftModel, torch.optim.Optimizer]:
        model, peft_model = _wrapped(model_dir)
        return model, peft_model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)

    model, peft_model, optimizer = build()
    for _ in range(2):
        optimizer.zero_grad()
        model(input_ids=torch.arange(16)[None]).logits.square().mean().backward()
        optimizer.step()
    model_state, optim_state = get_state_dict(model, optimizer)
    assert set(optim_state["state"]) == {n for n, p in model.named_parameters() if p.requires_grad}
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp_path / "ckpt")
    again, peft_again, optimizer_again = build()
    state = dict(zip(("model", "optim"), get_state_dict(again, optimizer_again)))
    dcp.load(state, checkpoint_id=tmp_path / "ckpt")
    set_state_dict(again, optimizer_again, model_state_dict=state["model"], optim_state_dict=state["optim"])
    want, got = MergedWeights(peft_model).state_dict(), MergedWeights(peft_again).state_dict()
    assert any(not torch.equal(want[k], v) for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items())
    for k in want:
        assert torch.equal(want[k], got[k]), k
    for p, q in zip(optimizer.param_groups[0]["params"], optimizer_again.param_groups[0]["params"]):
        assert torch.equal(optimizer.state[p]["exp_avg_sq"], optimizer_again.state[q]["exp_avg_sq"])


def test_a_collective_push_sends_the_merged_weights_under_the_base_names_tied_ones_once():
    model_dir = Path(ensure_embedded_model())  # ties its lm head to its embeddings
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert plain.config.tie_word_embeddings
    model, peft_model = _wrapped(model_dir)
    with torch.no_grad():
        for p in (p for n, p in model.named_parameters() if ".lora_B." in n):
            p.normal_(std=0.05)
    sent = named_tensors_to_send(MergedWeights(peft_model))
    assert [n for n, _ in sent] == [n for n, _ in named_tensors_to_send(plain)]
    merged = MergedWeights(peft_model).state_dict()
    for name, tensor in sent:
        assert tensor is merged[name] or torch.equal(tensor, merged[name])

"""The run's configuration: every YAML in conf/ composes over the registered schema into a
valid TrainConfig; wrong types and unknown keys fail at composition, naming the key; the key
listing shows every field with its type; the trainer's config exists once."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from paths import ROOT

import areal.train  # noqa: F401  (registers the schema with Hydra's ConfigStore)
from areal.config import TrainConfig, describe
from areal.trainer.config import TrainerConfig

CONF = ROOT / "conf"


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF.glob("*.yaml")))
def test_every_yaml_composes_into_a_valid_train_config(name):
    with initialize_config_dir(str(CONF), version_base=None):
        config = OmegaConf.to_object(compose(config_name=name))
    assert isinstance(config, TrainConfig) and isinstance(config.trainer, TrainerConfig)


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF.glob("*.yaml")))
def test_a_yaml_holds_only_what_differs_from_what_it_overlays(name):
    """A default is written once, in its dataclass: each value a run's YAML sets differs from the
    one it overlays (the schema's default, or the composed config a file builds on: agentic.yaml
    on config.yaml). Keys inside a free-form mapping (rollout.agent_kwargs) have no default."""
    raw = OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))
    bases = [d for d in raw.get("defaults", []) if d not in ("train_schema", "_self_")]
    with initialize_config_dir(str(CONF), version_base=None):
        base = OmegaConf.to_container(compose(config_name=bases[0])) if bases else dataclasses.asdict(TrainConfig())

    def restated(section: dict, under: dict, prefix: str) -> list[str]:
        out = []
        for key, value in section.items():
            if key not in under:
                continue
            if isinstance(value, dict) and isinstance(under[key], dict) and value:
                out += restated(value, under[key], f"{prefix}{key}.")
            elif value == under[key]:
                out.append(f"{prefix}{key}={value!r}")
        return out

    overlay = {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}
    assert restated(overlay, base, "") == [], f"{name}.yaml restates defaults"


@pytest.mark.parametrize(
    "override,named",
    [("trainer.steps=abc", "trainer.steps"), ("trainer.stpes=3", "stpes"), ("rollout.reward_range=5", "rollout.reward_range")],
)
def test_wrong_types_and_unknown_keys_fail_at_composition(override, named):
    with initialize_config_dir(str(CONF), version_base=None), pytest.raises(ConfigCompositionException) as e:
        compose(config_name="config", overrides=[override])
    assert named in str(e.value) + str(e.value.__cause__)


def test_a_bad_value_is_refused_by_its_dataclass_naming_the_field():
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = compose(config_name="config", overrides=["trainer.loss=foo"])
    with pytest.raises(ValueError, match="trainer.loss must be one of"):
        OmegaConf.to_object(cfg)


@pytest.mark.e2e
def test_the_key_listing_names_every_field_with_its_type():
    lines = describe()
    assert "trainer.lr: float = 3e-05" in lines and "engine.launch.command: str = ''" in lines
    assert "trainer.dual_clip: float | None = None" in lines
    # A nested section (trainer.lora) lists each of its own fields.
    hints = typing.get_type_hints(TrainerConfig)
    leaves = sum(
        len(dataclasses.fields(hints[f.name])) if dataclasses.is_dataclass(hints[f.name]) else 1 for f in dataclasses.fields(TrainerConfig)
    )
    assert sum(1 for line in lines if line.startswith("trainer.")) == leaves
    out = subprocess.run([sys.executable, "-m", "areal.config"], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == lines


def test_the_trainer_config_is_defined_once():
    """The run's `trainer:` section is the trainer process's own TrainerConfig, not a copy."""
    assert {f.name: f.type for f in dataclasses.fields(TrainConfig)}["trainer"] in ("TrainerConfig", TrainerConfig)
    assert TrainConfig().trainer == TrainerConfig()


@pytest.mark.parametrize(
    "gpus, ranks, named",
    [([0, 0], 2, "distinct"), ([0], 2, "one per rank"), ([-1], 1, "integers >= 0"), ([True], 1, "integers >= 0")],
)
def test_trainer_gpus_must_name_one_distinct_gpu_per_rank(gpus, ranks, named):
    with pytest.raises(ValueError, match=f"trainer.gpus .*{named}|trainer.gpus must list {ranks} distinct"):
        TrainerConfig(gpus=gpus, ranks=ranks)
    assert TrainerConfig(gpus=list(range(ranks)), ranks=ranks).gpus == list(range(ranks))


def test_the_trainer_process_sees_the_configured_gpus(tmp_path):
    """``trainer.gpus`` becomes the trainer's CUDA_VISIBLE_DEVICES, read from the live process."""
    from trainer_harness import make_job

    from areal.process import stop_group
    from areal.trainer.launch import start_trainer

    job = make_job(
        model_path=str(tmp_path / "no-model"),
        ring_name="areal-test-no-ring",
        engine_urls=[],
        report_addr="ipc:///nonexistent",
        run_dir=str(tmp_path),
        groups_per_step=1,
        gpus=[3],
    )
    proc = start_trainer(job, tmp_path)
    try:
        environ = dict(v.split("=", 1) for v in Path(f"/proc/{proc.pid}/environ").read_text().split("\0") if "=" in v)
    finally:
        stop_group(proc, 5.0)
    assert environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert json.loads((tmp_path / "trainer_config.json").read_text())["trainer"]["gpus"] == [3]


def test_engine_launch_gpus_are_split_evenly_over_the_servers():
    from areal.engine.config import EngineLaunchConfig

    launch = EngineLaunchConfig(command="x", count=2, gpus=[4, 5, 6, 7])
    assert [launch.gpus_of(0), launch.gpus_of(1)] == [[4, 5], [6, 7]]
    assert EngineLaunchConfig(command="x", count=2).gpus_of(1) == []
    for bad in ([4, 5, 6], [4, 4], [-1, 0]):
        with pytest.raises(ValueError, match="engine.launch.gpus"):
            EngineLaunchConfig(command="x", count=2, gpus=bad)


def test_engine_device_and_dtype_are_the_embedded_engines_and_checked():
    from areal.engine.config import EngineConfig, EngineLaunchConfig

    assert (EngineConfig(device="cuda:1", dtype="bfloat16").device, EngineConfig().dtype) == ("cuda:1", "float32")
    for bad in ({"device": "gpu"}, {"device": "cuda:x"}, {"dtype": "float16"}):
        with pytest.raises(ValueError, match="engine.d"):
            EngineConfig(**bad)
    with pytest.raises(ValueError, match="engine.launch.command"):  # a server's own flags say it
        EngineConfig(kind="sglang", launch=EngineLaunchConfig(command="x"), dtype="bfloat16")

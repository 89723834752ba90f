"""Sweeps on clusters: ``hydra/launcher=slurm`` (submitit) and ``hydra/launcher=ray_cluster``
(Hydra's Ray launcher) compose over the run's config with the settings an areal run needs.

A launcher's config composes only with its plugin installed: submitit's is in requirements.lock;
Hydra's Ray launcher is not (its boto3 needs python-dateutil<3, docs/cluster.md), so without it
the file's keys are checked against the plugin's schema (``RayLauncherConf``: ``ray.init``,
``ray.remote``) as written in the YAML.
"""

from __future__ import annotations

import importlib.util

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from paths import ROOT

import areal.train  # noqa: F401  (registers the train_schema the config composes over)

CONF = ROOT / "conf"
LAUNCHERS = CONF / "hydra" / "launcher"


def _compose_launcher(name: str) -> dict:
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = compose("config", overrides=[f"hydra/launcher={name}", "hydra.sweep.dir=/shared/sweep"], return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=False)


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None, reason="hydra-submitit-launcher")
def test_slurm_launcher_composes_one_job_per_run():
    launcher = _compose_launcher("slurm")
    assert launcher["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    # One controller per Slurm job (it starts torchrun, the engine and the sandboxes itself).
    assert launcher["nodes"] == 1 and launcher["tasks_per_node"] == 1
    assert launcher["submitit_folder"] == "${hydra.sweep.dir}/.submitit/%j"
    assert launcher["max_num_timeout"] == 0 and launcher["cpus_per_task"] >= 2
    # The plugin's own name still works, and a cluster setting goes through an override.
    assert _compose_launcher("submitit_slurm")["_target_"] == launcher["_target_"]
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = compose("config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], return_hydra_config=True)
    assert cfg.hydra.launcher.partition == "gpu"
    # Per-run isolation: every job of a sweep has its own run dir under the sweep dir.
    assert OmegaConf.to_container(cfg.hydra.sweep)["subdir"] == "${hydra.job.num}"


def test_ray_launcher_config_gives_each_run_a_fresh_worker():
    if importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is not None:
        launcher = _compose_launcher("ray_cluster")
        assert launcher["_target_"] == "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    else:
        launcher = yaml.safe_load((LAUNCHERS / "ray_cluster.yaml").read_text())
        assert launcher["defaults"] == ["ray", "_self_"]  # the plugin's config, ours on top
        assert set(launcher) == {"defaults", "ray"} and set(launcher["ray"]) == {"init", "remote"}
    assert launcher["ray"]["init"]["address"] is None
    assert launcher["ray"]["remote"]["max_calls"] == 1  # no module state shared between runs
    assert launcher["ray"]["remote"]["num_cpus"] >= 1

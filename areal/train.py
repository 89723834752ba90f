"""Entry point: `python -m areal.train [key=value ...]` (Hydra; `-m` for sweeps).

Composes `conf/config.yaml`, converts it at once into the typed `TrainConfig`, saves the resolved
config as JSON in the run directory, and runs the loop of `areal.controller`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from areal.config import TrainConfig, from_dict, to_dict
from areal.controller import train


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> dict:
    config = from_dict(TrainConfig, OmegaConf.to_container(cfg, resolve=True))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per agent request otherwise
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    summary = asyncio.run(train(config, run_dir))
    _print_summary(summary)
    return summary


def _print_summary(s: dict) -> None:
    print(f"\nrun directory: {s['run_dir']}")
    print(f"final model:   {s['final_model']}")
    t = s["reward_trend"]
    print(f"batch reward:  first {t['window']} steps {t['first_mean']:.3f} -> last {t['window']} steps {t['last_mean']:.3f} "
          f"({t['diff']:+.3f}, permutation p={t['p_value']:.4f})")
    b, a = s["eval_before"], s["eval_after"]
    if b and a:
        print(f"held-out ({a['n']} problems x {a['samples']} samples): sampled {b['sampled_acc']:.3f} -> {a['sampled_acc']:.3f} "
              f"(paired sign-flip p={s['eval_test']['p_value']:.4f}), greedy {b['greedy_acc']:.3f} -> {a['greedy_acc']:.3f}")


if __name__ == "__main__":
    main()

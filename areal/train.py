"""Entry point: `python -m areal.train [key=value ...]` (Hydra; `-m` for sweeps).

Composes `conf/config.yaml` (``conf_dir()``) over the `TrainConfig` schema (registered with Hydra's ConfigStore:
an unknown key or a wrong type fails at composition, and `--cfg job` prints every key), converts
it at once into the typed `TrainConfig` (`OmegaConf.to_object`), saves the resolved
config as JSON in the run directory, and runs the loop of `areal.controller.loop`. In a multirun
(`-m`), the sweep's runs share one tracker group (`tracker.wandb.group`, by default
`<experiment_name>/<sweep dir name>`), and each run then rebuilds the sweep summary
(`areal.sweep`) in the sweep directory. Runs are
isolated by construction: the controller names sockets and shared memory by a per-run id and
takes its ports from bind(0).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from areal.aio import run as run_loop
from areal.aio import until_signalled
from areal.config import TrainConfig, conf_dir, register_schema, to_dict
from areal.controller.loop import train

register_schema()


@hydra.main(config_path=str(conf_dir()), config_name="config", version_base=None)
def main(cfg: DictConfig) -> dict:
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, TrainConfig)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per agent request otherwise
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if hydra_cfg.mode == RunMode.MULTIRUN:  # a sweep's runs are one group in the trackers
        w = config.tracker.wandb
        w.group = w.group or f"{config.experiment_name}/{_sweep_dir(run_dir).name}"
    elif config.recover.mode == "auto" and not any(o.startswith("hydra.run.dir=") for o in hydra_cfg.overrides.hydra):
        run_dir = _killed_run_of_this_command(run_dir, config)
    (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    try:
        summary = run_loop(until_signalled(train(config, run_dir)))
    except (asyncio.CancelledError, KeyboardInterrupt):
        # Every child (engine, trainer, sandboxes) was stopped on the way out; say where things are.
        print(f"\nrun interrupted; partial results in {run_dir}", file=sys.stderr)
        raise SystemExit(130) from None
    _print_summary(summary)
    if hydra_cfg.mode == RunMode.MULTIRUN:  # every run rebuilds the sweep's table and plot from disk
        from areal.sweep import write_sweep_summary

        sweep_dir = _sweep_dir(run_dir)
        rows = write_sweep_summary(sweep_dir)
        print(f"sweep summary: {sweep_dir / 'sweep_summary.md'} ({len(rows)} finished runs)")
    return summary


def _killed_run_of_this_command(run_dir: Path, config: TrainConfig) -> Path:
    """Hydra made a new time-stamped ``run_dir`` for this command: where an earlier start of the
    same command was killed (same resolved config, no summary), the run continues there instead
    (``recover.mode=auto``, areal/controller/recovery.py), and the new directory is removed."""
    from areal.controller.recovery import find_unfinished, holds_run

    if holds_run(run_dir):
        return run_dir
    killed = find_unfinished(run_dir, json.loads(json.dumps(to_dict(config))))
    if killed is None:
        return run_dir
    print(f"[resume] this command's run in {killed} was killed: continuing it there (recover.mode=off starts afresh)", file=sys.stderr)
    shutil.rmtree(run_dir, ignore_errors=True)
    return killed


def _sweep_dir(run_dir: Path) -> Path:
    """The sweep directory of a multirun's run: the run dir is <sweep dir>/<subdir>; going up from
    it (not re-reading sweep.dir, which may interpolate ${now:...}) names the one it really lives in."""
    return run_dir.parents[len(Path(str(HydraConfig.get().sweep.subdir)).parts) - 1]


def _print_summary(s: dict) -> None:
    print(f"\nrun directory: {s['run_dir']}")
    print(f"final model:   {s['final_model']}")
    t = s["reward_trend"]
    if t["steps"] < 4:  # a trend needs at least 4 steps (areal.controller.evaluation.reward_trend)
        print(f"batch reward:  {t['steps']} step(s), too few for a trend test (4 or more)")
    else:
        print(
            f"batch reward:  linear trend {t['fit_start']:.3f} -> {t['fit_end']:.3f} over {t['steps']} steps "
            f"(permutation p={t['p_value']:.4f}); first {t['window']} steps {t['first_mean']:.3f} -> last {t['window']} "
            f"{t['last_mean']:.3f} ({t['diff']:+.3f}, p={t['window_p_value']:.4f})"
        )
    b, a = s["eval_before"], s["eval_after"]
    if b and a:
        who = " agent" if a.get("mode") == "agent" else ""
        print(
            f"held-out{who} ({a['n']} problems x {a['samples']} samples): sampled {b['sampled_acc']:.3f} -> {a['sampled_acc']:.3f} "
            f"(paired sign-flip p={s['eval_test']['p_value']:.4f}), greedy {b['greedy_acc']:.3f} -> {a['greedy_acc']:.3f}"
        )
        if a.get("mode") == "agent":  # data.eval_mode=agent: the run's agent, and its tool use
            print(
                "held-out tool use per episode: "
                + ", ".join(
                    f"{k} {b[k]:.2f} -> {a[k]:.2f}"
                    for k in ("calls_per_episode", "tool_calls_per_episode", "malformed_tool_calls_per_episode")
                )
                + f"; answers using a tool result {b['used_tool_result_share']:.2f} -> {a['used_tool_result_share']:.2f}"
            )


# Asked only for help or the composed config, a run starts nothing: no fork server to warm up.
_NO_RUN = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "--shell-completion", "-sc", "--resolve")

if __name__ == "__main__":
    if not any(a in _NO_RUN or a.startswith("--cfg=") for a in sys.argv[1:]):
        from areal import forkserver

        forkserver.start()  # now, while this process has one thread: the run's engine and trainer fork from it
    main()

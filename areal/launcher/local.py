"""``python3 -m areal.launcher.local <script> --config <yaml> [key=value ...]``: AReaL's local launcher.

    launcher ─► reads experiment_name / trial_name / cluster.fileroot (YAML ⊕ overrides, unvalidated:
       │        the script's own config class validates, and may add keys)
       │ env: AREAL_LAUNCHER=local, AREAL_EXPERIMENT_NAME, AREAL_TRIAL_NAME, AREAL_RUN_DIR,
       │      the single-process torch.distributed variables (RANK=0, WORLD_SIZE=1, MASTER_*),
       │      PYTHONPATH += the working directory, then the project root
       ▼
    python3 <script> --config <yaml> key=value ... scheduler.type=local   (own process group)

The script is what AReaL's guides write (``load_expr_config(sys.argv[1:], ...)`` then
``PPOTrainer``); it starts the inference engine, gateway, sandbox and trainer itself, so the
launcher only prepares the environment and supervises: SIGINT/SIGTERM are forwarded to the
script's process group, and the launcher exits with the script's status.

Not covered: multi-node launches and starting SGLang servers (start them yourself and set
``rollout.backend=sglang rollout.server_urls=[...]``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from areal.engine.launch import free_port

PROJECT_ROOT = Path(__file__).resolve().parents[2]
USAGE = "usage: python3 -m areal.launcher.local <script.py> --config <file.yaml> [key=value ...]"


def launch_env(argv: list[str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the script runs in (see the module docstring)."""
    env = dict(os.environ if base is None else base)
    names = _peek_names(argv)
    env.update(
        AREAL_LAUNCHER="local",
        AREAL_EXPERIMENT_NAME=names["experiment_name"],
        AREAL_TRIAL_NAME=names["trial_name"],
        AREAL_RUN_DIR=str(Path(names["fileroot"]) / names["experiment_name"] / names["trial_name"]),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    # the user's working directory first: their examples.* / agents shadow this project's own
    paths = [os.getcwd(), str(PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _peek_names(argv: list[str]) -> dict[str, str]:
    cfg = OmegaConf.create({})
    overrides = []
    it = iter(argv)
    for arg in it:
        if arg == "--config":
            cfg = OmegaConf.load(next(it))
        elif arg.startswith("--config="):
            cfg = OmegaConf.load(arg.split("=", 1)[1])
        elif "=" in arg and not arg.startswith("-"):
            overrides.append(arg.lstrip("+"))
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    return {
        "experiment_name": str(OmegaConf.select(cfg, "experiment_name", default="areal")),
        "trial_name": str(OmegaConf.select(cfg, "trial_name", default="trial0")),
        "fileroot": str(OmegaConf.select(cfg, "cluster.fileroot", default="runs")),
    }


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or not argv[0].endswith(".py"):
        print(USAGE, file=sys.stderr)
        return 2
    script, rest = argv[0], argv[1:]
    if not Path(script).is_file():
        print(f"launcher: script {script} does not exist\n{USAGE}", file=sys.stderr)
        return 2
    if not any(a.startswith("scheduler.type=") for a in rest):
        rest = rest + ["scheduler.type=local"]
    proc = subprocess.Popen([sys.executable, script, *rest], env=launch_env(rest), start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        os.killpg(proc.pid, signum)  # the script's group; the script stops the processes it started

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

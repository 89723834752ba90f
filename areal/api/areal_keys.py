"""AReaL's ``config.yaml`` files read as they are: every key honoured, mapped, or named in ONE warning.

    AReaL dict ─► map_areal_keys(data, cls) ─► (dict in the schema of ``cls``, ignored {key: why})
                    1. renames: rollout.agent → rollout.openai, allocation_mode / "sglang:d4p1t1" → backend,
                       actor.kl_ctl → actor.kl_ctl ... (each MAPPED entry moves one value)
                    2. every key the schema lacks is removed and listed with the reason for its group

``load_expr_config`` warns once with the list (``AReaLKeysIgnored``), so a key that would have
changed training in AReaL never disappears silently. Keys the schema has are honoured by
``PPOTrainer``'s translation (``areal.experimental.trainer.to_train_config``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

# AReaL key (dotted) -> this schema's key; the value moves as is.
MAPPED = {
    "rollout.agent": "rollout.openai",  # AReaL's current name of the section
}

UNKNOWN_KEY = "no counterpart in this system"

# Why a group of keys has no effect here (longest matching prefix wins).
REASONS = {
    "": UNKNOWN_KEY,
    "cluster": "one machine; processes are placed by the run itself",
    "launcher": "processes are launched by the run itself (python -m areal.launcher.local)",
    "scheduler": "one machine (scheduler.type local)",
    "sglang": "SGLang server arguments: start servers yourself and give rollout.server_urls",
    "vllm": "vLLM server arguments: vLLM is not selectable for a run",
    "saver": "the trained model is saved at the end (final/); checkpoints: trainer.checkpoint_every",
    "recover": "recover.mode and recover.freq_steps are honoured (areal/controller/recovery.py); the rest has no counterpart",
    "recover.freq_epochs": "checkpoints are taken every recover.freq_steps steps",
    "recover.freq_secs": "checkpoints are taken every recover.freq_steps steps",
    "recover.retries": "a killed run continues when its command runs again (recover.mode=auto)",
    "evaluator": "evaluation during training is counted in steps (evaluator.freq_steps: data.eval_every); before and after training it always runs",
    "stats_logger.wandb.wandb_api_key": "W&B reads its key from the environment (WANDB_API_KEY)",
    "stats_logger.wandb.wandb_base_url": "W&B reads its server from the environment (WANDB_BASE_URL)",
    "stats_logger.wandb.config": "the W&B run's config is the run's resolved config",
    "stats_logger.wandb.id_suffix": "W&B draws the run id once per run directory (kept in wandb_run_id; a resumed run continues it)",
    "stats_logger.swanlab": "no SwanLab tracker: W&B (stats_logger.wandb) or TensorBoard (stats_logger.tensorboard)",
    "stats_logger": "metrics go to metrics.jsonl in the run directory, and to W&B or TensorBoard when configured",
    "perf_tracer": "no tracer",
    "memory_profiler": "no profiler",
    "ref": "the reference model is the initial weights (actor.kl_ctl > 0)",
    "critic": "GRPO/decoupled PPO without a critic",
    "enable_offload": "no offloading on this system",
    "actor.backend": "the trainer is torch DDP/FSDP2 (trainer.parallel)",
    "actor.experiment_name": "one run, one name: the top-level experiment_name",
    "actor.trial_name": "one run, one name: the top-level trial_name",
    "actor.init_from_scratch": "training starts from the weights at actor.path",
    "actor.disable_dropout": "dropout is always off (the trainer's logprobs must match the engine's)",
    "actor.group_size": "a group is the gconfig.n_samples samples of one prompt",
    "actor.scheduling_spec": "processes are placed by the run itself",
    "actor.scheduling_strategy": "processes are placed by the run itself",
    "actor.dtype": "weights are held in float32",
    "actor.temperature": "the trainer scores tokens at the agents' sampling temperature (gconfig.temperature, workflow_kwargs)",
    "actor.max_new_tokens": "gconfig.max_new_tokens is the one limit",
    "actor.gradient_checkpointing": "small models: no activation checkpointing",
    "actor.reward_scaling": "no effect: advantages are normalised per group",
    "actor.reward_bias": "no effect: advantages are normalised per group",
    "actor.adv_norm": "advantages are normalised per group of one prompt (mean and std), always",
    "actor.reward_norm": "advantages are normalised per group of one prompt",
    "actor.optimizer.min_lr_ratio": "the linear and cosine schedules decay to 0 (transformers' get_scheduler)",
    "actor.optimizer.type": "the optimizer is AdamW",
    "actor.optimizer.beta1": "AdamW's default betas (0.9, 0.999)",
    "actor.optimizer.beta2": "AdamW's default betas (0.9, 0.999)",
    "actor.optimizer.eps": "AdamW's default eps (1e-8)",
    "actor.rejection_sampling": "no rejection sampling: decoupled PPO clips the behaviour weight (actor.behav_imp_weight_cap)",
    "actor.recompute_logprob": "proximal logprobs are recomputed whenever the loss needs them (use_decoupled_loss)",
    "actor.weight_update_mode": "weights go by disk, or trainer.weight_sync=collective",
    "rollout.use_lora": "the engines load merged weights (actor.use_lora trains the adapters and publishes W + B @ A)",
    "rollout.openai.scheduling_spec": "processes are placed by the run itself",
    "rollout.scheduling_spec": "processes are placed by the run itself",
    "rollout.experiment_name": "one run, one name: the top-level experiment_name",
    "rollout.trial_name": "one run, one name: the top-level trial_name",
    "rollout.fileroot": "the run directory is under the top-level cluster.fileroot",
    "rollout.tokenizer_path": "the gateway renders prompts with the model's own tokenizer (actor.path)",
    "rollout.queue_size": "episodes are admitted under rollout.max_concurrent_rollouts and the staleness bound",
    "rollout.consumer_batch_size": "a step trains train_dataset.batch_size groups",
    "rollout.enable_rollout_tracing": "no tracer",
    "rollout.dump_to_file": "trajectories are saved with save_trajectories=true of the main CLI",
    "train_dataset.pin_memory": "rows are dicts, not tensors",
    "train_dataset.num_workers": "rows are read in the controller",
    "valid_dataset.pin_memory": "rows are dicts, not tensors",
    "valid_dataset.num_workers": "rows are read in the controller",
}


def map_areal_keys(data: dict[str, Any], cls: type) -> tuple[dict[str, Any], dict[str, str]]:
    """``(data in cls's schema, {ignored dotted key: reason})``; ``data`` is not modified."""
    data = _copy(data)
    for old, new in MAPPED.items():
        value = _pop(data, old)
        if value is not _MISSING:
            if isinstance(value, dict) and isinstance(_get(data, new), dict):
                value = {**_get(data, new), **value}  # an AReaL file with both: the new name wins
            _put(data, new, value)
    ignored: dict[str, str] = {}
    _map_backend(data, ignored)
    _prune(data, cls, "", ignored)
    return data, ignored


def _map_backend(data: dict[str, Any], ignored: dict[str, str]) -> None:
    """``allocation_mode: sglang:d4p1t1+...`` and ``rollout.backend: "sglang:d4p1t1"``: the
    inference backend is the part before ``:``; the parallel layout after it is AReaL's."""
    alloc = data.pop("allocation_mode", None)
    rollout = data.setdefault("rollout", {})
    backend = rollout.get("backend") or (alloc.split("+")[0] if isinstance(alloc, str) else None)
    if backend is None:
        return
    name, _, layout = str(backend).partition(":")
    if name in ("sglang", "vllm") and not rollout.get("server_urls"):
        name = "embedded"  # no servers given: the embedded engine serves
        ignored["rollout.backend"] = f"{backend!r} read as 'embedded': no rollout.server_urls to reach, and servers are not launched here"
    elif layout:
        ignored["rollout.backend"] = f"the parallel layout {layout!r}: each server at rollout.server_urls is one replica"
    if alloc is not None:
        ignored["allocation_mode"] = f"{alloc!r}: the backend is rollout.backend; placement is the run's own"
    rollout["backend"] = name


def _prune(data: dict[str, Any], cls: type, prefix: str, ignored: dict[str, str]) -> None:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in list(data):
        path = f"{prefix}{key}"
        if key not in names:
            ignored[path] = _reason(path)
            del data[key]
            continue
        sub = _dataclass_of(hints[key])
        if sub is not None and isinstance(data[key], dict):
            _prune(data[key], sub, path + ".", ignored)


def _dataclass_of(hint: Any) -> type | None:
    for h in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(h):
            return h
    return None


def _reason(path: str) -> str:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in REASONS:
            return REASONS[".".join(parts[:i])]
    return REASONS[""]


_MISSING = object()


def _copy(x: Any) -> Any:
    return {k: _copy(v) for k, v in x.items()} if isinstance(x, dict) else x


def _get(data: dict[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _pop(data: dict[str, Any], path: str) -> Any:
    *head, last = path.split(".")
    node = _get(data, ".".join(head)) if head else data
    return node.pop(last, _MISSING) if isinstance(node, dict) else _MISSING


def _put(data: dict[str, Any], path: str, value: Any) -> None:
    *head, last = path.split(".")
    node = data
    for part in head:
        node = node.setdefault(part, {})
    node[last] = value

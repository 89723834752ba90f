"""FSDP2 for the trainer: shard the policy over the ranks, gather full weights where whole ones are needed.

    PolicyScorer(HF causal LM)
      --shard_policy--> fully_shard(each decoder layer), then fully_shard(scorer)   (the root holds
                        embeddings, final norm and lm head; every parameter is a DTensor, Shard(0))
      train_step: forward all-gathers a layer's shard group, backward reduce-scatters its grads
      publish / checkpoint (every rank calls, a collective):
        get_model_state_dict(full_state_dict, cpu_offload) --> rank 0: full CPU tensors
          --> FullWeights.replica (an unsharded copy, rank 0 only) --> save_pretrained / NCCL push
          --> FullState.state_dict() --> areal/trainer/checkpoint.py writes model.pt / optimizer.pt

Chosen with ``trainer.parallel = "fsdp2"`` (areal/trainer/rank.py); ``"ddp"`` replicates the weights.

Invariants:
- Sharding is applied per decoder layer first and to the ``PolicyScorer`` last: the scorer is
  the module whose ``forward`` the trainer calls, so its root hooks gather the embeddings and the
  lm head (which ``PolicyScorer`` reads directly, bypassing the HF model's own ``forward``).
- Every rank must run the same number of forwards and backwards per update (each one is a
  collective); the trainer pads short ranks with zero-weight micro-batches.
- Gradients are reduced in float32 whatever the parameter dtype; the optimizer steps on the
  float32 shards (``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=float32)``).
- Gathered state dicts use the HF model's own parameter names, so a checkpoint's ``model.pt``
  has the same keys as a DDP run's and ``FullWeights.replica`` loads it with ``load_state_dict``.
- ``FullState.state_dict()`` hands out what the last ``gather()`` collected, once: a stale state
  can never be written into a later checkpoint.

Not covered: resuming an FSDP2 checkpoint with DDP or another world size (optimizer keys are
parameter names here, indices there); CPU offload of the shards; tensor/pipeline parallelism;
models whose decoder layers are not at ``model.base_model.layers``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

PARAM_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Gathered to rank 0 only, on the CPU: the other ranks get an empty dict and keep no full copy.
_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
# Every rank loads the same full state (each read the checkpoint file) and keeps its own shard.
_SCATTER = StateDictOptions(full_state_dict=True)


def is_sharded(module: torch.nn.Module) -> bool:
    """True when ``module`` was wrapped by ``fully_shard`` (FSDP2)."""
    return isinstance(module, FSDPModule)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of an HF causal LM (``model.base_model.layers``), each sharded on its own."""
    layers = getattr(model.base_model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"{type(model).__name__}: no decoder layers at model.base_model.layers to shard")
    return list(layers)


def shard_policy(scorer: torch.nn.Module, device: str, param_dtype: str = "float32") -> torch.nn.Module:
    """``fully_shard`` each decoder layer of ``scorer.model``, then ``scorer`` itself; returns ``scorer``.

    The process group must be initialised (every rank calls this). ``device`` is ``"cpu"``
    (gloo) or ``"cuda"`` (NCCL): the shards move to it. Build the optimizer afterwards, over the
    sharded parameters.
    """
    if param_dtype not in PARAM_DTYPES:
        raise ValueError(f"param_dtype must be one of {tuple(PARAM_DTYPES)}, got {param_dtype!r}")
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=PARAM_DTYPES[param_dtype], reduce_dtype=torch.float32)
    for layer in decoder_layers(scorer.model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    # torch's default leaves the root unsharded between forward and backward (needed again at once).
    fully_shard(scorer, mesh=mesh, mp_policy=policy)
    return scorer


def set_gradient_sync(module: torch.nn.Module, sync: bool) -> None:
    """Accumulate unreduced gradients (``sync=False``) until the last micro-batch of an update."""
    module.set_requires_gradient_sync(sync)


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> float:
    """Clip the global gradient norm in place and return it; works on plain tensors and DTensors.

    On DTensor shards ``clip_grad_norm_`` all-reduces the partial norms itself and returns a
    replicated DTensor; ``full_tensor`` turns it into an ordinary scalar on every rank.
    """
    norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm, error_if_nonfinite=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


class FullWeights:
    """Rank 0's unsharded copy of the model, refreshed from the shards before each publish.

    Create it before sharding (it deep-copies the still-whole model on rank 0). ``gather`` is a
    collective: every rank calls it; rank 0 gets the refreshed replica, the others None.
    """

    def __init__(self, model: torch.nn.Module, rank: int) -> None:
        if is_sharded(model) or any(isinstance(p, DTensor) for p in model.parameters()):
            raise ValueError("FullWeights must be created before the model is sharded")
        self.replica = copy.deepcopy(model).requires_grad_(False).cpu() if rank == 0 else None

    def gather(self, sharded_model: torch.nn.Module) -> torch.nn.Module | None:
        full = get_model_state_dict(sharded_model, options=_GATHER)
        if self.replica is None:
            return None
        self.replica.load_state_dict(full)
        return self.replica


class FullState:
    """Gathered model or optimizer state in the shape areal/trainer/checkpoint.py expects.

    ``checkpoint.save_checkpoint`` calls ``state_dict()`` on rank 0 only and
    ``load_checkpoint`` calls ``load_state_dict`` on every rank, so the collective half of a save
    (``gather``) is done beforehand by every rank.
    """

    def __init__(self, get: Callable[[], dict], put: Callable[[dict], None], what: str) -> None:
        self._get, self._put, self._what = get, put, what
        self._full: dict | None = None

    def gather(self) -> None:
        self._full = self._get()

    def state_dict(self) -> dict:
        if self._full is None:
            raise RuntimeError(f"FullState({self._what}): state_dict() before gather() (or twice after one)")
        full, self._full = self._full, None
        return full

    def load_state_dict(self, state: dict) -> None:
        self._put(state)


def checkpoint_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[FullState, FullState]:
    """(model state, optimizer state) of a sharded ``model`` (the HF model inside the scorer).

    Keys are HF parameter names; the optimizer's per-parameter state is keyed by name as well.
    """
    model_state = FullState(
        lambda: get_model_state_dict(model, options=_GATHER),
        lambda sd: set_model_state_dict(model, sd, options=_SCATTER),
        "model",
    )
    optim_state = FullState(
        lambda: get_optimizer_state_dict(model, optimizer, options=_GATHER),
        lambda sd: set_optimizer_state_dict(model, optimizer, sd, options=_SCATTER),
        "optimizer",
    )
    return model_state, optim_state

"""``cluster``: where the run's processes go. Importing this module does not import Ray."""

from __future__ import annotations

from dataclasses import dataclass, field

CLUSTER_KINDS = ("local", "ray")


@dataclass
class ClusterConfig:
    kind: str = "local"  # local: every process on this host | ray: the trainer (and rollout_workers) on Ray nodes
    # ray: the cluster to join (``auto``: the one `ray start` runs on this host; ``host:6379``;
    # ``ray://host:10001`` is refused: the controller must run on a node). Empty: start Ray on this host.
    address: str = ""
    # ray: the resources of the trainer's placement-group bundle (one bundle, STRICT_PACK: all ranks on
    # one node). GPU nodes: {GPU: 1} per rank, Ray sets CUDA_VISIBLE_DEVICES (leave trainer.gpus empty);
    # a custom resource pins a node, e.g. {CPU: 1, trainer: 1} with `ray start --resources '{"trainer": 1}'`.
    trainer_resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    placement_timeout_s: float = 120.0  # until the cluster has a node with those resources free
    hop_window: int = 64  # unacked trajectories in flight per trainer rank (TrajectorySender's window)
    # ray: sandboxed episodes on this many rollout workers on Ray nodes (areal/cluster/ray_rollout.py), each
    # a zygote whose agents reach the controller's gateway over TCP. 0: every episode on the controller's host.
    rollout_workers: int = 0
    # ray: the resources of each worker's bundle (one per worker, SPREAD: on different nodes where possible);
    # a custom resource picks the nodes, e.g. {CPU: 1, rollout: 1} with `ray start --resources '{"rollout": 1}'`.
    worker_resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    slots_per_worker: int = 8  # episodes one worker runs at once; admission waits while every worker is full

    def __post_init__(self) -> None:
        if self.kind not in CLUSTER_KINDS:
            raise ValueError(f"cluster.kind must be one of {CLUSTER_KINDS}, got {self.kind!r}")
        if self.address.startswith("ray://"):
            raise ValueError(
                f"cluster.address={self.address!r}: Ray Client is not supported; run the controller on a node of the "
                "cluster (its trajectories and reports travel over ZeroMQ TCP between nodes) and use auto or host:port"
            )
        if not self.trainer_resources or any(not (v > 0) for v in self.trainer_resources.values()):
            raise ValueError(f"cluster.trainer_resources must name resources with amounts > 0, got {self.trainer_resources!r}")
        if not self.placement_timeout_s > 0:
            raise ValueError(f"cluster.placement_timeout_s must be > 0, got {self.placement_timeout_s!r}")
        if self.hop_window < 1:
            raise ValueError(f"cluster.hop_window must be >= 1, got {self.hop_window!r}")
        if self.rollout_workers < 0:
            raise ValueError(f"cluster.rollout_workers must be >= 0 (0: episodes on the controller's host), got {self.rollout_workers!r}")
        if self.rollout_workers and self.kind != "ray":
            raise ValueError(f"cluster.rollout_workers={self.rollout_workers} places workers on Ray nodes: it needs cluster.kind=ray")
        if not self.worker_resources or any(not (v > 0) for v in self.worker_resources.values()):
            raise ValueError(f"cluster.worker_resources must name resources with amounts > 0, got {self.worker_resources!r}")
        if self.slots_per_worker < 1:
            raise ValueError(f"cluster.slots_per_worker must be >= 1, got {self.slots_per_worker!r}")

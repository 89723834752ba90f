"""``cluster``: where the run's processes go. Importing this module does not import Ray."""

from __future__ import annotations

from dataclasses import dataclass, field

CLUSTER_KINDS = ("local", "ray")
GATEWAY_PLACES = ("worker", "controller")  # cluster.gateway: whose gateway the rollout workers' agents call


@dataclass
class ClusterConfig:
    kind: str = "local"  # local: every process on this host | ray: the trainer (and rollout_workers) on Ray nodes
    # ray: the cluster to join (``auto``: the one `ray start` runs on this host; ``host:6379``;
    # ``ray://host:10001`` is refused: the controller must run on a node). Empty: start Ray on this host.
    address: str = ""
    # ray: the resources of the trainer's placement-group bundle (one bundle, STRICT_PACK: all ranks on
    # one node; with trainer_nodes > 1, one node's bundle, one per node). GPU nodes: {GPU: 1} per rank of
    # the node, Ray sets CUDA_VISIBLE_DEVICES (leave trainer.gpus empty);
    # a custom resource pins a node, e.g. {CPU: 1, trainer: 1} with `ray start --resources '{"trainer": 1}'`.
    trainer_resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    placement_timeout_s: float = 120.0  # until the cluster has a node with those resources free
    # ray: the trainer's ranks split evenly over this many nodes (trainer.ranks divisible by it), one torchrun
    # per node joined by a rendezvous on the first; trainer_resources is then ONE node's bundle (STRICT_SPREAD).
    trainer_nodes: int = 1
    hop_window: int = 64  # unacked trajectories in flight per trainer rank (TrajectorySender's window)
    # ray: CURVE on the ZeroMQ TCP hops (trajectories to the trainer's nodes, the trainer's reports back):
    # encrypted, and only the run's own peers admitted (areal/curve.py). false: in clear (a trusted network)
    encrypt: bool = True
    # ray: sandboxed episodes on this many rollout workers on Ray nodes (areal/cluster/ray_rollout.py), each
    # a zygote whose agents reach the controller's gateway over TCP. 0: every episode on the controller's host.
    rollout_workers: int = 0
    # ray: the resources of each worker's bundle (one per worker, SPREAD: on different nodes where possible);
    # a custom resource picks the nodes, e.g. {CPU: 1, rollout: 1} with `ray start --resources '{"rollout": 1}'`.
    worker_resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    slots_per_worker: int = 8  # episodes one worker runs at once; admission waits while every worker is full
    # ray, rollout workers: whose gateway their agents call. worker: each worker's own (it calls the engines
    # from its node and records its sessions; the controller gets each episode's record back); controller:
    # the controller's, over TCP (every LLM call of every worker goes through the controller's one process).
    gateway: str = "worker"
    # ray, rollout workers: how many lost workers a run replaces (a new worker in the lost one's bundle, once
    # Ray places the bundle again, waited for up to placement_timeout_s); 0: a lost worker is not replaced
    max_worker_replacements: int = 8
    # ray: each inference server the run launches (engine.replicas embedded engines, or engine.launch.count
    # SGLang/vLLM commands) on a Ray node (areal/cluster/ray_engines.py): one bundle of these resources per
    # server (SPREAD), e.g. {GPU: 1} (Ray sets CUDA_VISIBLE_DEVICES; leave engine.launch.gpus empty) or
    # {CPU: 1, engine: 1} with `ray start --resources '{"engine": 1}'`. Empty: on the controller's host.
    engine_resources: dict[str, float] = field(default_factory=dict)

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
        if isinstance(self.trainer_nodes, bool) or not isinstance(self.trainer_nodes, int) or self.trainer_nodes < 1:
            raise ValueError(f"cluster.trainer_nodes must be an integer >= 1, got {self.trainer_nodes!r}")
        if self.trainer_nodes > 1 and self.kind != "ray":
            raise ValueError(
                f"cluster.trainer_nodes={self.trainer_nodes} places the trainer's ranks on Ray nodes: it needs cluster.kind=ray"
            )
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
        if self.max_worker_replacements < 0:
            raise ValueError(f"cluster.max_worker_replacements must be >= 0, got {self.max_worker_replacements!r}")
        if self.gateway not in GATEWAY_PLACES:
            raise ValueError(f"cluster.gateway must be one of {GATEWAY_PLACES}, got {self.gateway!r}")
        if self.slots_per_worker < 1:
            raise ValueError(f"cluster.slots_per_worker must be >= 1, got {self.slots_per_worker!r}")
        if self.engine_resources and self.kind != "ray":
            raise ValueError(f"cluster.engine_resources={self.engine_resources} places the engines on Ray nodes: it needs cluster.kind=ray")
        if any(not (v > 0) for v in self.engine_resources.values()):
            raise ValueError(f"cluster.engine_resources must name resources with amounts > 0 (or be empty), got {self.engine_resources!r}")

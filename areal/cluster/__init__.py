"""Where a run's processes are placed: this host (``cluster.kind=local``) or the nodes of a Ray
cluster (``cluster.kind=ray``: the trainer, ``areal/cluster/ray_trainer.py``; sandboxed rollout
workers, ``areal/cluster/ray_rollout.py``; engine servers, ``areal/cluster/ray_engines.py``; what
they share, ``areal/cluster/placement.py``).
docs/cluster.md is the guide."""

from areal.cluster.config import ClusterConfig

__all__ = ["ClusterConfig"]

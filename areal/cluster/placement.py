"""What the Ray placements of a run share (the trainer's, the engines', the rollout workers'):
joining Ray once, an actor's options in a bundle of a placement group, and the teardown."""

from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from areal.cluster.config import ClusterConfig


def join_ray(config: ClusterConfig) -> bool:
    """Join ``cluster.address`` (or start Ray on this host) unless this process runs in Ray
    already (an earlier placement of the run, or a job of the Ray sweep launcher); whether this
    call started it (then the placement that did shuts it down)."""
    if ray.is_initialized():
        return False
    ray.init(address=config.address or None, include_dashboard=False, log_to_driver=False)
    return True


def bundle_options(resources: dict[str, float], pg: Any, bundle: int, concurrency: int) -> dict[str, Any]:
    """``.options()`` of an actor holding ``resources`` in bundle ``bundle`` of ``pg``."""
    return {
        "num_cpus": resources.get("CPU", 0),
        "num_gpus": resources.get("GPU", 0),
        "resources": {k: v for k, v in resources.items() if k not in ("CPU", "GPU")},
        "max_concurrency": concurrency,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle),
    }


def release(actors: list[Any], pg: Any | None, started_ray: bool) -> None:
    """Kill ``actors``, remove ``pg``, and shut Ray down if this placement started it."""
    for actor in actors:
        ray.kill(actor)
    if pg is not None:
        remove_placement_group(pg)
    if started_ray:
        ray.shutdown()

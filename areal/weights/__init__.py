"""How weights travel from the trainer to the engines, both ends of each transport in one module.

    disk.py         through the file system (``trainer.weight_sync=disk``, the default): the
                    trainer saves a version whole and pushes it (``save_atomically``,
                    ``push_weights``), each engine loads it by its own route
                    (``update_weights_from_disk_sync``: SGLang's protocol; ``vllm_update_weights_sync``)
    collective.py   over a collective (SGLang's NCCL protocol; gloo on CPU): the trainer's push
                    (``CollectiveWeightPush``) and the engine's side (``join_weight_group``)

Either way an engine that does not confirm a version is a ``WeightUpdateError``. This package
imports no torch (``collective`` does, imported only by who broadcasts).
"""


class WeightUpdateError(RuntimeError):
    """An engine did not confirm a weight update (from disk or over the collective)."""

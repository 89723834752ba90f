"""How weights travel from the trainer to the engines, both ends of each transport in one module.

    collective.py   over a collective (SGLang's NCCL protocol; gloo on CPU): the trainer's push
                    (``CollectiveWeightPush``) and the engine's side (``join_weight_group``)

From disk (``trainer.weight_sync=disk``, the default): the trainer saves a version
(areal/trainer/publish.py) and each engine loads it with ``/update_weights_from_disk``
(areal/engine/client.py, areal/engine/vllm.py).
"""

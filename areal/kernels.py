"""fp32 linear layers on oneDNN, for the engine's lean forward and the trainer's model on the CPU.

torch's CPU wheels run an fp32 ``F.linear`` / ``torch.mm`` through MKL, which does not use an AMD
processor's AVX-512 (``MKL_VERBOSE=1`` names no AVX-512 code path on this project's AMD EPYC
machines). oneDNN, built into the same wheels, uses it: on one core of
this project's AMD EPYC machines a 1024x1024 product runs at about 240 GFLOP/s against MKL's
100, and the linears of a SmolLM2 decode step or training micro-batch 2 to 2.5x faster
(benchmarks/README.md). The results are fp32 products summed in another order: they differ
from MKL's by float rounding only (tests/unit/engine/test_engine_lean.py, tests/unit/trainer/test_kernels.py).

    PackedLinear(weight, bias)     inference: the weight reordered once into oneDNN's blocked
                                   layout (remade after each weight update: the engine's refresh())
    linear(x, weight, bias)        differentiable: oneDNN forward, and both backward products
    use_onednn_linears(model)      every fp32 CPU ``nn.Linear`` of a model runs ``linear``

``AREAL_ONEDNN=0`` turns all of it off (MKL's ``F.linear`` everywhere).
"""

from __future__ import annotations

import os
import types

import torch
import torch.nn.functional as F


def onednn_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether linears on ``device`` in ``dtype`` may run on oneDNN: fp32 on a CPU whose torch has
    it (the x86 and arm64 wheels), unless ``AREAL_ONEDNN=0``."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and os.environ.get("AREAL_ONEDNN", "1") != "0"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` by oneDNN (``weight`` dense or packed)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class PackedLinear:
    """``linear(x, weight, bias)`` on a copy of ``weight`` made for the kernel that runs it: oneDNN's
    blocked layout where ``packed``, else the weight itself and ``F.linear``."""

    __slots__ = ("weight", "bias", "packed")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool) -> None:
        self.bias = bias
        self.packed = packed
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None) if packed else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _product(x, self.weight, self.bias) if self.packed else F.linear(x, self.weight, self.bias)


class _Linear(torch.autograd.Function):
    """y = x W^T + b; dx = dy W, dW = dy^T x, db = sum(dy): each product by oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        dy = grad.reshape(-1, grad.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _product(dy, weight.t().contiguous(), None).view(x.shape)
        if ctx.needs_input_grad[1]:
            dw = _product(dy.t().contiguous(), x.reshape(-1, x.shape[-1]).t().contiguous(), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(0)
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` on oneDNN, differentiable in all three arguments."""
    return _Linear.apply(x, weight, bias)


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, self.weight, self.bias)


def use_onednn_linears(model: torch.nn.Module) -> int:
    """Make every ``nn.Linear`` of ``model`` whose weight is fp32 on the CPU run ``linear``
    (its parameters, state dict and hooks unchanged); how many. None where oneDNN is off."""
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and onednn_available(module.weight.device, module.weight.dtype):
            module.forward = types.MethodType(_forward, module)
            count += 1
    return count

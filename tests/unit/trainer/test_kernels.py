"""areal/kernels.py: oneDNN's fp32 linear against torch's ``F.linear`` (MKL): the same products
and gradients to float rounding, on a bare layer and through a whole model, and switched off by
AREAL_ONEDNN=0."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_qwen2

from areal.kernels import PackedLinear, linear, onednn_available, use_onednn_linears

pytestmark = pytest.mark.skipif(not onednn_available(torch.device("cpu"), torch.float32), reason="this torch has no oneDNN")


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() <= 1e-5 * max(1.0, float(b.abs().max())))


@pytest.mark.parametrize("bias", [True, False])
def test_linear_and_its_gradients_equal_f_linear(bias: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 24, generator=g, requires_grad=True)
    w = torch.randn(40, 24, generator=g, requires_grad=True)
    b = torch.randn(40, generator=g, requires_grad=True) if bias else None
    up = torch.randn(2, 7, 40, generator=g)
    ours = linear(x, w, b)
    (ours * up).sum().backward()
    got = [t.grad.clone() for t in (x, w, b) if t is not None]
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    ref = F.linear(x, w, b)
    (ref * up).sum().backward()
    assert _close(ours, ref)
    assert all(_close(a, t.grad) for a, t in zip(got, [t for t in (x, w, b) if t is not None]))
    assert _close(PackedLinear(w, b, packed=True)(x.detach().reshape(-1, 24)), ref.detach().reshape(-1, 40))


def test_a_model_with_onednn_linears_gives_the_same_loss_and_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_qwen2(initializer_range=0.2)
    ours = copy.deepcopy(model)
    count = use_onednn_linears(ours)
    assert count == sum(type(m) is torch.nn.Linear for m in model.modules()) and count > 0
    ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    losses = []
    for m in (model, ours):
        loss = m(ids, labels=ids).loss
        loss.backward()
        losses.append(loss)
    assert _close(losses[1], losses[0])
    for (name, a), b in zip(ours.named_parameters(), model.parameters()):
        assert _close(a.grad, b.grad), name
    monkeypatch.setenv("AREAL_ONEDNN", "0")
    assert use_onednn_linears(copy.deepcopy(model)) == 0

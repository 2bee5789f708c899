"""An op the lowering does not know fails loudly, naming the ATen op, the module and the line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from arkinfer import ir, models
from arkinfer.models.configs import tiny_config


class CumsumMLP(nn.Module):
    """A user's experimental MLP: a running sum over the sequence (not in the IR's op set)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(self.inner(x), dim=1)


class LearnedScale(nn.Module):
    def __init__(self, inner: nn.Module, width: int) -> None:
        super().__init__()
        self.inner, self.gain = inner, nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.gain


def user_model(replace) -> nn.Module:
    model = models.build_model(models.parse_config(tiny_config("llama"))).eval()
    layer = model.model.layers[1]
    layer.mlp = replace(layer.mlp)
    return model


def test_unknown_aten_op_names_op_module_and_line():
    with pytest.raises(ir.UnsupportedOpError) as err:
        ir.trace(user_model(CumsumMLP))
    message = str(err.value)
    assert "aten.cumsum" in message
    assert "model.layers.1.mlp" in message and "CumsumMLP" in message
    assert "test_unsupported.py" in message and "torch.cumsum(self.inner(x), dim=1)" in message
    assert "hint:" in message and "HANDLERS" in message


def test_parameter_outside_a_weighted_op_is_reported():
    with pytest.raises(ir.UnsupportedOpError) as err:
        ir.trace(user_model(lambda mlp: LearnedScale(mlp, 128)))
    message = str(err.value)
    assert "aten.mul.Tensor" in message and "model.layers.1.mlp.gain" in message
    assert "LearnedScale" in message

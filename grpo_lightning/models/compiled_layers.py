"""The decoder layers of the log-prob passes compiled regionally: one layer's call compiled once and
run for every layer (the layers share their code and differ only in their weights, which the compiled
code takes as inputs), so compile time does not grow with depth."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn


def repeated_layers(model: nn.Module) -> nn.ModuleList | None:
    """The decoder layers of a Hugging Face model (``model.base_model.layers``), where they are one
    class repeated; ``None`` otherwise."""
    layers = getattr(getattr(model, "base_model", model), "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers) or len({type(layer) for layer in layers}) != 1:
        return None
    return layers


def checkpoints_activations(model: nn.Module) -> bool:
    """Whether ``model`` recomputes its layers in the backward pass (transformers' gradient, or
    from 5.x activation, checkpointing)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # the newer name first
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def _call_layer(layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return layer._call_impl(*args, **kwargs)


@functools.cache
def _compiled_layer_call() -> Callable:
    return torch.compile(_call_layer)


@contextlib.contextmanager
def layers_compiled(layers: nn.ModuleList) -> Iterator[None]:
    """Calls of ``layers`` (forward, and so backward) run one compiled function, traced once and
    shared by every layer and every model of the same layer class, for as long as the context lasts
    (``nn.Module.compile``'s hook, undone on exit)."""
    compiled = _compiled_layer_call()
    before = [layer._compiled_call_impl for layer in layers]
    for layer in layers:
        layer._compiled_call_impl = functools.partial(compiled, layer)
    try:
        yield
    finally:
        for layer, hook in zip(layers, before, strict=True):
            layer._compiled_call_impl = hook

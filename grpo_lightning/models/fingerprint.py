"""A fingerprint of a base model's weights, so that a checkpoint is only ever combined with the base it
was trained from.

A checkpoint does not hold everything it needs: the frozen reference model, and under LoRA the frozen
base weights, are reloaded from ``model`` when a fit resumes, and the export merges the adapters into
the base it loads. Where ``model`` now names other weights (a hub model with a new revision, a local
folder rebuilt), the resumed fit would pull towards another reference and the export would merge the
adapters into another model, silently. The fingerprint is recorded in every checkpoint
(:data:`CHECKPOINT_KEY`) and checked where a checkpoint meets its base again (:func:`check_same_base`).

It reads a fixed sample of each tensor (up to :data:`SAMPLE` values, evenly spaced), rounded to
bfloat16 so that the same weights loaded in float32 or bfloat16 agree, with every tensor's name and
shape: a pass over a few thousand values a tensor, not over the weights.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from grpo_lightning.errors import ConfigError

#: Where a checkpoint holds the fingerprint of the base its policy was loaded from.
CHECKPOINT_KEY = "base_model_fingerprint"
#: Values read from each tensor.
SAMPLE = 4096


def weights_fingerprint(model: nn.Module) -> str | None:
    """A hex digest of ``model``'s parameters: names, shapes and a strided sample of each, in
    bfloat16. Call it on the model as loaded, before adapters or sharding; ``None`` (not checked)
    where some weights are not loaded yet (an empty-weights init on the meta device)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.named_parameters()):
        if tensor.is_meta:
            return None
        digest.update(f"{name}:{tuple(tensor.shape)}".encode())
        flat = tensor.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // SAMPLE)][:SAMPLE]
        if sample.is_floating_point():
            sample = sample.to(torch.bfloat16).view(torch.int16)
        digest.update(sample.cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def check_same_base(recorded: str | None, loaded: str | None, model: str, where: str, fix: str) -> None:
    """Raise :class:`ConfigError` when the base ``model`` names now (fingerprint ``loaded``) is not
    the one the checkpoint recorded; ``where`` names the checkpoint, ``fix`` how to point at the
    right base. Checkpoints written before the fingerprint (``recorded`` None) pass."""
    if recorded is None or loaded is None or recorded == loaded:
        return
    raise ConfigError(
        f"{where}: the base model {model!r} now holds other weights than the run was trained from (fingerprint "
        f"{loaded}, the checkpoint's {recorded}): the reference model and LoRA's base weights come from it, so the "
        f"result would silently differ. {fix}"
    )

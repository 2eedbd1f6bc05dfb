"""The static buffers of a decode step: every value a step reads or writes, on the device.

A CUDA graph replays the step on these very tensors, so they are allocated once per cache layout and
only ever updated in place. They are allocated outside inference mode, whatever the caller's mode:
a tensor made under ``torch.inference_mode`` cannot be updated in place outside it, and the same
generator serves validation (which Lightning may run under inference mode) and training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_lightning.rollout.types import as_ids


def stop_ids(eos_token_id: int | Sequence[int] | None, pad_token_id: int | None) -> tuple[list[int], int]:
    """``(eos_ids, pad)``: the ids that end a completion, as a list, and the id written after one
    (``pad_token_id``, else the first EOS id, else 0)."""
    eos_ids = as_ids(eos_token_id)
    return eos_ids, pad_token_id if pad_token_id is not None else (eos_ids[0] if eos_ids else 0)


@dataclass
class DecodeBuffers:
    """Buffers of ``batch`` rows and a cache of ``cache_len`` slots (see :meth:`allocate`)."""

    tokens: Tensor  # [B, 1] the token fed to the next decode step
    positions: Tensor  # [B, 1] its position id (prompt length + tokens so far - 1)
    cache_position: Tensor  # [1] its slot in the cache
    step: Tensor  # [1] index of the completion token the next step samples
    min_new: Tensor  # [1] EOS is blocked before this many tokens
    pad: Tensor  # [1] the token written after a row's EOS
    finished: Tensor  # [B] whether the row has sampled an EOS
    key_valid: Tensor  # [B, L] cache slots a query may attend to
    out: Tensor  # [B, L] the sampled tokens
    logprobs: Tensor  # [B, L] fp32 log-probabilities of the sampled tokens
    eos: Tensor  # [V] whether a token ends a completion
    row_keys: Tensor  # [B] keyed sampling: each row's key
    arange: Tensor  # [L] 0, 1, ..., L - 1

    @classmethod
    def allocate(cls, batch: int, cache_len: int, vocab: int, device: torch.device) -> DecodeBuffers:
        """Zeroed buffers, made outside inference mode (see the module docstring)."""
        with torch.inference_mode(False):

            def zeros(*shape: int, dtype: torch.dtype = torch.long) -> Tensor:
                return torch.zeros(shape, dtype=dtype, device=device)

            return cls(
                tokens=zeros(batch, 1),
                positions=zeros(batch, 1),
                cache_position=zeros(1),
                step=zeros(1),
                min_new=zeros(1),
                pad=zeros(1),
                finished=zeros(batch, dtype=torch.bool),
                key_valid=zeros(batch, cache_len, dtype=torch.bool),
                out=zeros(batch, cache_len),
                logprobs=zeros(batch, cache_len, dtype=torch.float32),
                eos=zeros(vocab, dtype=torch.bool),
                row_keys=zeros(batch),
                arange=torch.arange(cache_len, device=device),
            )

    def set_stop_tokens(self, eos_ids: list[int], pad: int, min_new_tokens: int) -> None:
        """Mark ``eos_ids`` as ends of completions, padded with ``pad``, none before ``min_new_tokens``."""
        self.eos.zero_()
        if eos_ids:
            self.eos[torch.tensor(eos_ids, device=self.eos.device)] = True
        self.pad.fill_(pad)
        self.min_new.fill_(min_new_tokens)

    def completions(self, rows: int, steps: int, with_logprobs: bool) -> tuple[Tensor, Tensor | None]:
        """Copies of the first ``rows`` completions of ``steps`` tokens, cut after the longest one's
        EOS, and (``with_logprobs``) of their log-probabilities, else ``None``."""
        out = self.out[:rows, :steps]
        is_eos = self.eos[out]
        lengths = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, steps)
        width = int(lengths.max())
        logprobs = self.logprobs[:rows, :width].clone() if with_logprobs else None
        return out[:, :width].clone(), logprobs

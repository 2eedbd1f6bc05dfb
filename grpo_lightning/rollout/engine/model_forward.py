"""The model's passes over the static cache: one forward with a ready 4-D mask, the prefill and the decode step.

The names of the cache argument and of the optional ones differ between transformers releases and
models: only those the model's ``forward`` takes are passed.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import Tensor, nn

from grpo_lightning.algorithms.functional import position_ids_from_mask
from grpo_lightning.rollout.engine.cache import distinct_rows, shared_prefill_cache
from grpo_lightning.rollout.engine.compilation import compiled_step_candidates, default_compile_options, first_working_step
from grpo_lightning.rollout.engine.fused_decode import FusedDecoder
from grpo_lightning.rollout.engine.graphs import capture_step_graphs
from grpo_lightning.rollout.engine.kernel_choice import slots_in_use
from grpo_lightning.rollout.engine.sampling import draw_tokens, keyed_uniforms
from grpo_lightning.rollout.types import SamplingParams


class StaticCacheForward:
    """``model``'s forward over a cache, returning the logits ``[B, V]`` of the last position.

    ``boolean_mask``: the model's attention takes a boolean mask (SDPA); else an additive float one
    (eager attention)."""

    def __init__(self, model: nn.Module, boolean_mask: bool) -> None:
        self.model = model
        self.boolean_mask = boolean_mask
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._pass_cache_position = "cache_position" in parameters
        self._pass_logits_to_keep = "logits_to_keep" in parameters

    def mask(self, allowed: Tensor) -> Tensor:
        """``allowed`` (``True`` may attend) as the model's attention takes it."""
        if self.boolean_mask:
            return allowed
        return torch.zeros(allowed.shape, device=allowed.device).masked_fill_(~allowed, torch.finfo(torch.float32).min)

    def __call__(self, cache: Any, input_ids: Tensor, allowed: Tensor, position_ids: Tensor, cache_position: Tensor) -> Tensor:
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": self.mask(allowed),
            "position_ids": position_ids,
            self._cache_argument: cache,
            "use_cache": True,
        }
        if self._pass_cache_position:
            kwargs["cache_position"] = cache_position
        if self._pass_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.model(**kwargs).logits[:, -1]


class ModelPasses:
    """The prefill and the decode step of :class:`~grpo_lightning.rollout.engine.StaticCacheGenerator`
    (a mixin: they run on its cache, buffers and settings)."""

    def _decode_forward(
        self, input_ids: Tensor, allowed: Tensor, position_ids: Tensor, cache_position: Tensor, layer_step=None
    ) -> Tensor:
        """The forward pass of a decode step: with fused projections when they apply, each layer
        through ``layer_step`` (:meth:`FusedDecoder.decode_layer` by default)."""
        if self._decoder is None:
            return self._forward(self._cache, input_ids, allowed, position_ids, cache_position)
        return self._decoder(input_ids, self._forward.mask(allowed), position_ids, self._cache, cache_position, layer_step)

    def _prefill(self, prompt_ids: Tensor, prompt_mask: Tensor) -> Tensor:
        """Reset the cache, run the prompts through it and set up the decode buffers.

        A GRPO batch holds each prompt ``group_size`` times: only its distinct prompts run through
        the model, and each layer's keys and values are written to every row of the same prompt
        (:func:`~grpo_lightning.rollout.engine.cache.shared_prefill_cache`).
        """
        self._cache.reset()
        b, prompt_len = self._buffers, prompt_ids.size(1)
        positions = b.arange[:prompt_len]
        b.key_valid.zero_()
        b.key_valid[:, :prompt_len] = prompt_mask.bool()
        causal = b.arange.unsqueeze(0) <= positions.unsqueeze(1)  # [S, L]
        allowed = causal.unsqueeze(0) & b.key_valid.unsqueeze(1)  # [B, S, L]
        # A padding query attends to itself, so no row of the mask is empty.
        allowed[:, positions, positions] = True
        logits = None
        distinct, inverse = distinct_rows(torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1))
        layers = len(getattr(self._cache, "layers", ()))
        if self._prefills_compiled():
            logits = self._compiled_prefill(prompt_ids, prompt_mask, allowed, distinct, inverse)
        elif len(distinct) < len(prompt_ids) and layers:
            written: set[int] = set()
            logits = self._forward(
                shared_prefill_cache(self._cache, distinct, inverse, written),
                prompt_ids[distinct],
                allowed[distinct].unsqueeze(1),
                position_ids_from_mask(prompt_mask[distinct]),
                positions,
            )[inverse]
            if len(written) != layers:  # a model that writes its cache another way: prefill every row
                self._cache.reset()
                logits = None
        if logits is None:
            logits = self._forward(self._cache, prompt_ids, allowed.unsqueeze(1), position_ids_from_mask(prompt_mask), positions)
        b.positions.copy_(prompt_mask.long().sum(-1, keepdim=True))
        b.cache_position.fill_(prompt_len)
        b.step.zero_()
        b.finished.zero_()
        return logits

    def _prefills_compiled(self) -> bool:
        """Whether the prompts go through the compiled :meth:`FusedDecoder.prefill`: with fused
        projections, ``compile_prefill`` (``None``: ``compile`` on CUDA) and a cache that a first,
        eager prefill has allocated."""
        wanted = self.compile and self._buffers.out.device.type == "cuda" if self.compile_prefill is None else self.compile_prefill
        if not wanted or self._decoder is None or self._compiled_prefills.failed:
            return False
        return all(isinstance(getattr(layer, "keys", None), Tensor) for layer in getattr(self._cache, "layers", [None]))

    def _compiled_prefill(
        self, prompt_ids: Tensor, prompt_mask: Tensor, allowed: Tensor, distinct: Tensor, inverse: Tensor
    ) -> Tensor | None:
        """The logits ``[B, V]`` of the prompts' last position from the compiled prefill of the
        distinct prompts, which writes the keys and values of every row; ``None`` if the compiler
        fails (:class:`~grpo_lightning.rollout.engine.compilation.CompiledPrefill`): the caller prefills eagerly."""
        prompt_len = prompt_ids.size(1)
        logits = self._compiled_prefills(
            self._decoder,
            self._inductor_options(),
            prompt_ids[distinct],
            self._forward.mask(allowed[distinct, :, :prompt_len]).unsqueeze(1),
            position_ids_from_mask(prompt_mask[distinct]),
            self._cache,
            self._buffers.arange[:prompt_len],
            inverse,
        )
        if logits is None:
            self._cache.reset()
            return None
        return logits[inverse]

    def _emit(self, logits: Tensor, sampling: SamplingParams) -> None:
        """Sample the token of the current step, store it and feed it to the next step."""
        b = self._buffers
        uniforms = keyed_uniforms(b.row_keys, b.step) if self._keyed else None
        untruncated = sampling.temperature > 0 and not 0 < sampling.top_k < logits.size(-1) and sampling.top_p >= 1.0
        if self._sampling_ops is not None and untruncated:
            if uniforms is None:
                uniforms = torch.rand(logits.size(0), device=logits.device)
            token, logprob = self._sampling_ops.sample_by_blocks(
                logits, uniforms, float(sampling.temperature), b.eos, b.step < b.min_new, self._record_logprobs
            )
        else:
            blocked = b.eos & (b.step < b.min_new)
            token, logprob = draw_tokens(logits.float(), blocked, sampling, uniforms, self._record_logprobs)
        token = torch.where(b.finished, b.pad, token)
        b.out.index_copy_(1, b.step, token.unsqueeze(1))
        if self._record_logprobs:
            b.logprobs.index_copy_(1, b.step, logprob.masked_fill(b.finished, 0.0).unsqueeze(1))
        b.finished |= b.eos[token]
        b.tokens.copy_(token.unsqueeze(1))
        b.step.add_(1)

    def _decode_step(self, sampling: SamplingParams, forward=None) -> None:
        """One token for every row; only in-place updates of static buffers (CUDA-graph safe)."""
        b = self._buffers
        b.key_valid.index_fill_(1, b.cache_position, True)
        logits = (forward or self._decode_forward)(b.tokens, b.key_valid[:, None, None, :], b.positions, b.cache_position)
        self._emit(logits, sampling)
        b.positions.add_(1)
        b.cache_position.add_(1)

    def _capture(self, sampling: SamplingParams, limits: list[int]) -> dict[int, torch.cuda.CUDAGraph]:
        """Warm up and capture ``_decode_step`` once for each bound on the cache slots it reads
        (``limits``); leaves the cache and buffers to be prefilled again."""
        device = self._buffers.out.device
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()  # shared by the graphs of one set of weights
        if self._capture_stream is None:
            # Its own capture stream, hence its own cuBLAS workspace: graphs captured on one stream
            # share one, and two engines' graphs replayed at once on two streams would both use it.
            self._capture_stream = torch.cuda.Stream(device)
        return capture_step_graphs(
            lambda: functools.partial(self._first_working_step(sampling), sampling),
            [self._buffers.positions, self._buffers.cache_position, self._buffers.step],
            limits,
            [self.max_cache_len] * self.warmup_steps,
            functools.partial(slots_in_use, cache_len=self.max_cache_len),
            self._graph_pool,
            self._capture_stream,
        )

    def _inductor_options(self) -> dict[str, Any]:
        """The options of this engine's compilations: ``compile_options``, or the defaults for its device."""
        return self.compile_options if self.compile_options is not None else default_compile_options(self._buffers.out.device)

    def _first_working_step(self, sampling: SamplingParams):
        """The decode step to use, after running it once: with ``compile``, its layers compiled
        (fused projections on a cache with ``layers``), else the whole step compiled, else its
        model forward compiled, else eager (:mod:`grpo_lightning.rollout.engine.compilation`)."""
        if self._compile_candidates is None:
            self._compile_candidates = []
            if self.compile:
                regional = self._decoder is not None and getattr(self._cache, "layers", None) is not None
                self._compile_candidates = compiled_step_candidates(
                    self._decode_step, self._decode_forward, self._inductor_options(),
                    layer_step=FusedDecoder.decode_layer if regional else None,
                )  # fmt: skip
        return first_working_step(self._compile_candidates, self._decode_step, sampling)

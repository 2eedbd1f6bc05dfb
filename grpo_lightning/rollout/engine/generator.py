"""Rollout generation on a preallocated static KV cache, with the decode step as a CUDA graph.

``StaticCacheGenerator`` samples completions like ``model.generate``, built for the GRPO loop where
the same policy generates batches of one shape again and again, so that the host, not the GPU, is
what a small model's decode step would otherwise wait on:

* the KV cache is allocated once and reset between rollouts; each distinct prompt is prefilled once
  (:mod:`grpo_lightning.rollout.engine.cache`);
* every later token is one *decode step* on static buffers (the token fed, its position and cache
  slot, the key-validity mask, the step counter, the ``finished`` flags, the output) updated in
  place, with sampling inside the step (:mod:`grpo_lightning.rollout.engine.sampling`, or the Triton draw
  of ``kernels.sampling``) and no host synchronisation;
* on CUDA the step is captured as a CUDA graph per sampling setting and replayed once per token
  (:mod:`grpo_lightning.rollout.engine.graphs`); the host checks every ``check_every`` steps whether all rows
  have finished. On a CPU the same step runs eagerly;
* grouped-query attention reads each key/value head once (:mod:`grpo_lightning.rollout.engine.attention`);
  with the Triton attention kernel a step reads only the cache slots in use so far, rounded up to
  one of a few bounds (:func:`~grpo_lightning.rollout.engine.cache.slot_limits`), one graph each.

Weights are shared with the policy, not copied: a graph reads the parameters at their addresses, so
it sees in-place updates (``optimizer.step()``). The generator compares a fingerprint of those
addresses before each rollout and captures again when a parameter was replaced. A sharded model
(FSDP, ZeRO-3) gathers parameters inside ``forward``, which a graph cannot follow: give the
generator an unsharded copy (``grpo_lightning.runtime.strategies.RolloutReplica``).

Rows are padded up to ``max_batch_size`` (copies of the first prompt), so each cache and graph has
one batch shape; larger calls run in chunks. Rollouts run in the parameters' dtype with autocast
off, and outside inference mode whatever the caller's mode: the cache, buffers and graphs persist
between calls, and a tensor made under ``torch.inference_mode`` cannot be updated in place outside
it (``trainer.validate`` runs under inference mode, training does not). Masks are ready 4-D masks
over the whole cache: models with ``"sdpa"`` or ``"eager"`` attention and full attention in every
layer (:func:`~grpo_lightning.rollout.engine.cache.static_cache_attention`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from grpo_lightning.rollout.engine.attention import check_decode_attention, decode_attention, grouped_query_attention
from grpo_lightning.rollout.engine.buffers import DecodeBuffers, stop_ids
from grpo_lightning.rollout.engine.cache import (
    SLOT_LIMIT_BLOCK,
    grown_cache_len,
    new_static_cache,
    slot_limits,
    static_cache_attention,
)
from grpo_lightning.rollout.engine.compilation import CompiledPrefill
from grpo_lightning.rollout.engine.episodes import EpisodeLayout, EpisodeTurns
from grpo_lightning.rollout.engine.fused_decode import FusedDecoder, FusedLayer, fuse_projections
from grpo_lightning.rollout.engine.graphs import weights_fingerprint
from grpo_lightning.rollout.engine.kernel_choice import (
    check_fused_settings,
    fused_decoder,
    reads_slots_in_use,
    sampling_kernels,
    slots_in_use,
)
from grpo_lightning.rollout.engine.model_forward import ModelPasses, StaticCacheForward
from grpo_lightning.rollout.types import SamplingParams

def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter."""
    return next(model.parameters()).device


class StaticCacheGenerator(ModelPasses, EpisodeTurns):
    """Samples completions on a reusable ``transformers.StaticCache``; see the module docstring.
    Multi-turn episodes: :meth:`start_episodes`, then :meth:`sample_turn` per turn (:mod:`~grpo_lightning.rollout.engine.episodes`).
    The prefill and the decode step: :class:`~grpo_lightning.rollout.engine.model_forward.ModelPasses`.

    Args:
        model: a causal LM (``transformers`` decoder-only model); its weights are used in place.
        max_batch_size: rows of the cache; size it to the rollout batch (prompts x group size).
        max_cache_len: tokens per row of the cache, at least the longest prompt plus
            ``max_new_tokens`` (it grows when a call needs more).
        use_cuda_graph: capture the decode step as a CUDA graph; ``None``: when the model is on CUDA,
            decided at each call (so the generator can be built before the model is moved).
        check_every: decode steps between checks that every row has finished (a host
            synchronisation on CUDA); ``None``: 16 on CUDA, 1 elsewhere.
        warmup_steps: eager decode steps, on a side stream, before a capture.
        compile: compile the decode step with ``torch.compile``, which fuses the many small kernels
            a small model's step is bound by. The first rollout pays for the compilation. If the
            whole step fails to compile, only its forward is compiled, else none (with a warning).
        compile_options: Inductor options of that compilation; ``None``: :func:`default_compile_options`.
        decode_attention: how a decode step's attention is computed, one of
            ``attention.DECODE_ATTENTION_KINDS`` (described there). The prefill always uses SDPA.
        fuse_projections: decode with each layer's q/k/v and gate/up products as one product each
            (``grpo_lightning.rollout.engine.fused_decode``, ``FUSED_MODEL_TYPES``; others decode as usual).
            The parameters become views of one buffer per layer: same objects and values, no copy.
        qkv_kernel: with ``fuse_projections``, each decode layer's norm, q/k/v product, rotary
            embedding and cache write as one Triton kernel (``kernels.qkv``). ``None``: where it runs
            and the model qualifies (``fused_decode.qkv_kernel_applies``); ``True`` raises elsewhere.
        sampling_kernel: draw tokens with the Triton kernels of ``kernels.sampling`` when the
            temperature is positive and neither top-k nor top-p truncates; else
            :func:`~grpo_lightning.rollout.engine.sampling.sample_tokens`. ``None``: where Triton runs;
            ``True`` raises elsewhere.
        attend_slots_in_use: with the Triton attention kernel, read only the cache slots in use,
            rounded up to one of a few bounds (one CUDA graph each); ``False``: the whole cache.
        compile_prefill: with ``fuse_projections``, run the prompts through
            :meth:`FusedDecoder.prefill` compiled, instead of the model's eager ``forward`` whose
            many small kernel launches cost host time. The first prefill of a cache runs eagerly
            (it allocates the cache). ``None``: when ``compile`` is on and the model is on CUDA. If
            the compiler fails, prefills run eagerly from then on (with a warning).
        down_parts: with ``fuse_projections``, compute each decode layer's down product as this many
            fp32 products over slices of its input, added up in the residual sum
            (``fused_decode.residual_plus_parts``). ``None``: ``kernel_choice.DOWN_PARTS`` on CUDA
            for bf16 or fp16 weights whose input size it divides, else 1.
    """

    def __init__(
        self,
        model: nn.Module,
        max_batch_size: int,
        max_cache_len: int,
        use_cuda_graph: bool | None = None,
        check_every: int | None = None,
        warmup_steps: int = 2,
        compile: bool = False,
        decode_attention: str = "auto",
        fuse_projections: bool = False,
        compile_options: dict[str, Any] | None = None,
        qkv_kernel: bool | None = None,
        sampling_kernel: bool | None = None,
        attend_slots_in_use: bool = True,
        compile_prefill: bool | None = None,
        down_parts: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if max_cache_len < 2:
            raise ValueError(f"max_cache_len must be at least 2, got {max_cache_len}")
        if check_every is not None and check_every < 1:
            raise ValueError(f"check_every must be at least 1, got {check_every}")
        check_decode_attention(decode_attention)
        check_fused_settings(fuse_projections, down_parts, compile_prefill, qkv_kernel)
        attention = static_cache_attention(model)
        self.model = model
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        self.use_cuda_graph = use_cuda_graph
        self.check_every = check_every
        self.warmup_steps = warmup_steps
        self.compile = compile
        self.compile_options = compile_options
        self.decode_attention = decode_attention
        self.fuse_projections = fuse_projections
        self.qkv_kernel = qkv_kernel
        self.sampling_kernel = sampling_kernel
        self.attend_slots_in_use = attend_slots_in_use
        self.compile_prefill = compile_prefill
        self.down_parts = down_parts
        self._sampling_ops = None  # grpo_lightning.rollout.engine.kernels.sampling where it draws, resolved per call
        self._fused: list[FusedLayer] | None = None
        self._decoder: FusedDecoder | None = None
        self._compile_candidates = None
        self._forward = StaticCacheForward(model, boolean_mask=attention == "sdpa")
        self._layout: tuple | None = None
        self._cache = None
        self._graphs: dict[tuple, dict[int, torch.cuda.CUDAGraph]] = {}  # sampling setting -> slot limit -> graph
        self._graph_pool = None
        self._capture_stream = None
        self._weights: tuple[int, ...] | None = None
        self._record_logprobs = False
        self._keyed = False
        self._compiled_prefills = CompiledPrefill()
        self._episodes: EpisodeLayout | None = None  # multi-turn rollouts (start_episodes)

    # ----------------------------------------------------------------------------------- public

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        sampling: SamplingParams,
        eos_token_id: int | Sequence[int] | None,
        pad_token_id: int | None,
        row_keys: Tensor | None = None,
        return_logprobs: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Completions ``[N, T]`` for left-padded ``prompt_ids``/``prompt_mask`` ``[N, S]``.

        ``T <= sampling.max_new_tokens`` is the length of the longest completion (up to and
        including its first EOS), as ``model.generate`` returns it; tokens after a row's EOS are
        ``pad_token_id`` (the first EOS id when it is ``None``).

        ``row_keys`` ``[N]`` (int64) makes sampling *keyed*: token ``t`` of row ``n`` is drawn with
        ``keyed_uniforms(row_keys[n], t)`` instead of the global generator, so a row's completion
        depends on its prompt and key alone, not on the batch it is in, how the batch is chunked, or
        on which device (up to the floating-point differences of other batch shapes).

        ``return_logprobs``: also return ``[N, T]`` fp32 log-probabilities of the sampled tokens under
        ``softmax(logits / temperature)`` (``temperature`` 1 when greedy), before top-k, top-p and
        the EOS block: what a teacher-forced forward pass of the completions computes (0 after EOS).
        """
        eos_ids, pad = stop_ids(eos_token_id, pad_token_id)
        rows = prompt_ids.size(0)
        if rows == 0 or sampling.max_new_tokens < 1:
            empty = prompt_ids.new_full((rows, 0), pad)
            return (empty, empty.float()) if return_logprobs else empty
        with self._rolling_out():
            parts = [
                self._generate_batch(
                    prompt_ids[start : start + self.max_batch_size],
                    prompt_mask[start : start + self.max_batch_size],
                    sampling,
                    eos_ids,
                    pad,
                    None if row_keys is None else row_keys[start : start + self.max_batch_size],
                    return_logprobs,
                )
                for start in range(0, rows, self.max_batch_size)
            ]
        width = max(tokens.size(1) for tokens, _ in parts)
        tokens = torch.cat([nn.functional.pad(t, (0, width - t.size(1)), value=pad) for t, _ in parts])
        if not return_logprobs:
            return tokens
        return tokens, torch.cat([nn.functional.pad(lp, (0, width - lp.size(1))) for _, lp in parts])

    def clear(self) -> None:
        """Free the cache, the buffers and the captured graphs (they are rebuilt on the next call)."""
        self._layout = None
        self._cache = None
        self._graphs.clear()
        self._graph_pool = None
        self._capture_stream = None
        self._weights = None

    # -------------------------------------------------------------------------------- one batch

    def _generate_batch(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        sampling: SamplingParams,
        eos_ids: list[int],
        pad: int,
        row_keys: Tensor | None,
        record_logprobs: bool,
    ) -> tuple[Tensor, Tensor | None]:
        rows, prompt_len = prompt_ids.shape
        self._episodes = None  # this batch overwrites the cache that episodes would continue
        use_graph = self._begin(prompt_len + sampling.max_new_tokens, sampling, eos_ids, pad, row_keys, record_logprobs)
        prompt_ids, prompt_mask = self._filled(prompt_ids, prompt_mask)
        logits = self._prefill(prompt_ids, prompt_mask)
        limits = self._slot_limits(prompt_len + 1, prompt_len + sampling.max_new_tokens - 1)
        graphs, captured = self._step_graphs(sampling, limits, use_graph)
        if captured:
            logits = self._prefill(prompt_ids, prompt_mask)  # the warm-up steps used the cache
        steps = self._decode(logits, sampling, rows, prompt_len, limits, graphs)
        return self._buffers.completions(rows, steps, self._record_logprobs)

    @contextlib.contextmanager
    def _rolling_out(self) -> Iterator[None]:
        """The model in eval mode, autocast and inference mode off, the engine's attention on.

        Autocast is off: the rollout runs in the parameters' dtype. Under autocast the keys (fp32
        from the rotary embedding) and the values (bf16) differ in dtype, which the StaticCache of
        some releases cannot hold. Inference mode is off (grad stays off): the cache, buffers and
        graphs persist between calls made in either mode."""
        was_training = self.model.training
        self.model.eval()
        try:
            with (
                torch.inference_mode(False),
                torch.no_grad(),  # leaving inference mode turns gradients back on
                torch.autocast(model_device(self.model).type, enabled=False),
                grouped_query_attention(self.model),
                decode_attention(self.decode_attention),
            ):
                yield
        finally:
            self.model.train(was_training)

    def _begin(
        self, needed_len: int, sampling: SamplingParams, eos_ids: list[int], pad: int, row_keys: Tensor | None,
        record_logprobs: bool,
    ) -> bool:  # fmt: skip
        """Set up the cache (``needed_len`` slots at least), the fused layers and the per-call
        settings; whether the decode steps run as CUDA graphs."""
        device = model_device(self.model)
        use_graph = device.type == "cuda" if self.use_cuda_graph is None else self.use_cuda_graph
        if use_graph and device.type != "cuda":
            raise ValueError(f"use_cuda_graph=True needs the model on CUDA, it is on {device}")
        self._prepare(device, needed_len)
        if self.fuse_projections:  # before the weights' addresses are read: it may move them
            fused = fuse_projections(self.model, self._fused)
            if fused is not self._fused or fused is None:
                self._fused = fused
                self._decoder = fused_decoder(self.model, fused, device, self.qkv_kernel, self.down_parts)
        self._buffers.set_stop_tokens(eos_ids, pad, sampling.min_new_tokens)
        self._sampling_ops = sampling_kernels(device, self.sampling_kernel)
        # Per-call settings read by _emit; a captured graph bakes them in, so they are part of its key.
        self._keyed = row_keys is not None
        self._record_logprobs = record_logprobs
        if row_keys is not None:
            self._buffers.row_keys[: len(row_keys)] = row_keys.to(device)
            self._buffers.row_keys[len(row_keys) :] = 0
        return use_graph

    def _filled(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """``ids`` and ``mask`` on the device, with copies of their first row up to ``max_batch_size`` rows."""
        device = model_device(self.model)
        ids, mask, filler = ids.to(device), mask.to(device), self.max_batch_size - ids.size(0)
        if filler > 0:
            ids, mask = torch.cat([ids, ids[:1].expand(filler, -1)]), torch.cat([mask, mask[:1].expand(filler, -1)])
        return ids, mask

    def _slot_limits(self, first: int, last: int) -> list[int]:
        """The bounds on the cache slots read by decode steps that use from ``first`` to ``last`` slots:
        a few (:func:`slot_limits`) where the attention kernel reads only the slots in use, else the whole cache."""
        if reads_slots_in_use(self.attend_slots_in_use, self.decode_attention, self._buffers.out.device) and last >= first:
            return slot_limits(first, last, self.max_cache_len, SLOT_LIMIT_BLOCK)
        return [self.max_cache_len]

    def _step_graphs(self, sampling: SamplingParams, limits: list[int], use_graph: bool) -> tuple[dict | None, bool]:
        """The CUDA graphs of the decode step for ``limits`` (``None`` without graphs), and whether
        some were captured now, after which the cache must be prefilled again."""
        if not use_graph:
            return None, False
        fingerprint = weights_fingerprint(self.model)
        if fingerprint != self._weights:
            # Graphs read the old addresses: drop them, and their memory pool with them.
            self._graphs.clear()
            self._graph_pool = None
            self._weights = fingerprint
        key = (sampling.temperature, sampling.top_k, sampling.top_p, self._keyed, self._record_logprobs)
        graphs = self._graphs.setdefault(key, {})
        missing = [limit for limit in limits if limit not in graphs]
        if missing:
            graphs.update(self._capture(sampling, missing))
        return graphs, bool(missing)

    def _decode(
        self, logits: Tensor, sampling: SamplingParams, rows: int, first_slot: int, limits: list[int], graphs: dict | None
    ) -> int:
        """Sample from ``logits``, then decode until every one of the first ``rows`` rows has finished
        or ``sampling.max_new_tokens`` tokens; the first decode step writes cache slot ``first_slot``.
        Returns the number of tokens sampled."""
        self._emit(logits, sampling)
        check_every = self.check_every or (16 if self._buffers.out.device.type == "cuda" else 1)
        steps, eager_step = 1, None
        bound = 0  # index in limits of the bound of the current step
        while steps < sampling.max_new_tokens:
            while limits[bound] < first_slot + steps:  # this step uses first_slot + steps slots
                bound += 1
            if graphs is not None:
                graphs[limits[bound]].replay()
            else:
                with slots_in_use(limits[bound], self.max_cache_len):
                    if eager_step is None:
                        eager_step = self._first_working_step(sampling)  # runs this step
                    else:
                        eager_step(sampling)
            steps += 1
            if steps % check_every == 0 and steps < sampling.max_new_tokens and bool(self._buffers.finished[:rows].all()):
                break
        return steps

    def _prepare(self, device: torch.device, needed_len: int) -> None:
        """(Re)allocate the cache and the step buffers when the device, dtype or length changed."""
        cache_len = grown_cache_len(self.max_cache_len, needed_len)
        layout = (device, next(self.model.parameters()).dtype, cache_len)
        if layout == self._layout:
            return
        self.clear()
        self.max_cache_len = cache_len
        batch, model = self.max_batch_size, self.model
        dtype = next(model.parameters()).dtype
        self._cache = new_static_cache(model.config, batch, cache_len, device, dtype)
        vocab = model.get_output_embeddings().weight.size(0)
        self._buffers = DecodeBuffers.allocate(batch, cache_len, vocab, device)
        self._layout = layout

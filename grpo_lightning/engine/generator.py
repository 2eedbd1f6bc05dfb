"""Rollout generation on a preallocated static KV cache, with the decode step as a CUDA graph.

``StaticCacheGenerator`` samples completions like ``model.generate`` but is built for the GRPO loop,
where the same policy generates a batch of the same shape again and again:

* the KV cache (``transformers.StaticCache``, ``max_batch_size x max_cache_len``) is allocated once
  and reset between rollouts;
* the prompt is prefilled each distinct prompt once (a GRPO batch holds every prompt
  ``group_size`` times; its keys and values are written to all rows of that prompt), eagerly or,
  with fused projections, compiled (``compile_prefill``); every later token is one *decode step* on
  static-shaped buffers:
  the token fed, its position id, its cache slot, the key-validity mask over the whole cache, the step
  counter, the ``finished`` flags and the output row all live on the device and are updated in place;
* sampling (temperature, top-k, nucleus top-p, greedy when ``temperature == 0``, EOS blocked before
  ``min_new_tokens``) runs inside the step with no host synchronisation. On CUDA, a draw that
  neither top-k nor top-p truncates runs on two Triton kernels (``grpo_lightning.engine.kernels.sampling``):
  one uniform number per row is located in the cumulative distribution, block by block of the
  vocabulary. Otherwise a draw on CUDA is ``argmax(probs / E)`` with ``E ~ Exponential(1)`` noise,
  which picks token ``i`` with probability ``probs[i]`` (the Gumbel-max trick in another form); on a
  CPU, where random numbers cost more than a scan, one uniform per row is located in the
  cumulative distribution;
* *keyed* sampling (``row_keys``): each row draws its tokens by inverse-CDF sampling from
  counter-based random numbers, a hash of its key and the token's index (:func:`keyed_uniforms`), so
  a row's completion does not depend on the other rows of the batch nor on the device it runs on;
* grouped-query attention reads each key/value head once (``grpo_lightning.engine.attention``) instead of
  copying the cache to one copy per query head at every step;
* on CUDA the decode step is captured once per sampling setting as a ``torch.cuda.CUDAGraph`` and
  replayed once per token; the host only checks whether every row has finished every
  ``check_every`` steps. On CPU the same step runs eagerly;
* with the Triton attention kernel a step reads only the cache slots in use so far, rounded up to
  one of at most ``MAX_SLOT_LIMITS`` bounds (:func:`slot_limits`, multiples of 64 slots at W1's
  shape): the graph is captured once per bound (``decode_kernel.slots_in_use``), one compiled step
  for all, and the host replays the graph of the current step's bound. The other slots are masked
  anyway, so the tokens are the same.

Weights are shared with the policy, not copied. A captured graph reads the parameters through their
device addresses, so it stays valid while they are updated in place (``optimizer.step()`` does that)
and sees every update. If a parameter is replaced by a new tensor (``model.to(...)``, loading a state
dict with ``assign=True``, FSDP re-sharding), the addresses change: the generator compares a cheap
fingerprint of the parameter and buffer addresses before each rollout and captures again when it
differs. A sharded model (FSDP, DeepSpeed ZeRO-3) gathers parameters inside ``forward``, which a
CUDA graph cannot follow: give the generator an unsharded copy instead
(``grpo_lightning.strategies.RolloutReplica``, refreshed in place after each optimizer step).

Rows of a call are padded up to ``max_batch_size`` (copies of the first prompt, dropped from the
output), so each cache and graph has one batch shape; calls with more rows run in chunks of
``max_batch_size``. ``max_cache_len`` grows (to a multiple of 64) when a prompt plus
``max_new_tokens`` does not fit, which allocates a new cache and captures the graphs again.

Rollouts run in the parameters' dtype with autocast turned off (load the policy in bf16 for bf16
rollouts; under autocast the cached keys and values would differ in dtype).

Attention masks are passed to the model as ready 4-D masks over the whole cache, so the path works
with the ``"sdpa"`` and ``"eager"`` attention implementations of decoder-only models whose layers all
use full attention (Qwen2, Llama, Mistral without a sliding window, ...).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import transformers
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from grpo_lightning.engine.attention import (
    TRITON_INTERPRETED,
    check_decode_attention,
    decode_attention,
    grouped_query_attention,
    resolve_decode_kind,
)
from grpo_lightning.engine.fused_decode import (
    FUSED_MODEL_TYPES,
    QKV_KERNEL_MODEL_TYPES,
    FusedDecoder,
    FusedLayer,
    down_parts_apply,
    fuse_projections,
    qkv_kernel_applies,
)
from grpo_lightning.logprobs import position_ids_from_mask
from grpo_lightning.rollout import SamplingParams

_CACHE_LEN_MULTIPLE = 64
_SUPPORTED_ATTENTION = ("sdpa", "eager")


def new_static_cache(config: Any, batch_size: int, max_cache_len: int, device: torch.device, dtype: torch.dtype):
    """A ``transformers.StaticCache`` for ``batch_size`` rows of ``max_cache_len`` tokens.

    The constructor differs between transformers releases: older ones take the batch size, device and
    dtype and allocate at once; newer ones take only ``(config, max_cache_len)`` and allocate on the
    first update, from the shapes and dtypes of the first keys and values. Only the arguments the
    installed constructor names are passed.
    """
    parameters = inspect.signature(transformers.StaticCache.__init__).parameters
    kwargs: dict[str, Any] = {"config": config, "max_cache_len": max_cache_len}
    for name in ("max_batch_size", "batch_size"):
        if name in parameters:
            kwargs[name] = batch_size
            break
    if "device" in parameters:
        kwargs["device"] = device
    if "dtype" in parameters:
        kwargs["dtype"] = dtype
    return transformers.StaticCache(**kwargs)


def sample_tokens(
    logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, uniforms: Tensor | None = None
) -> Tensor:
    """One token per row of ``logits`` ``[B, V]``; no host synchronisation, safe inside a CUDA graph.

    ``temperature == 0`` is greedy (argmax). Otherwise the distribution is ``softmax(logits /
    temperature)`` restricted to the ``top_k`` most likely tokens (``0`` keeps all; ties at the
    k-th value are kept) and then to the nucleus: the most likely tokens whose preceding mass is below
    ``top_p`` (the most likely token is always kept).

    Without ``uniforms`` the draw uses the default generator of the device, so ``torch.manual_seed``
    makes it reproducible: exponential races on CUDA, one uniform per row and the cumulative
    distribution on a CPU. With ``uniforms`` ``[B]`` in ``[0, 1)`` (e.g. :func:`keyed_uniforms`) row
    ``b`` takes the token where ``uniforms[b]`` falls in the cumulative distribution (inverse-CDF
    sampling): the token of a row then depends on that row alone.
    """
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    if temperature != 1.0:
        logits = logits / temperature
    if 0 < top_k < logits.size(-1):
        kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if uniforms is not None:
        return inverse_cdf_sample(logits.softmax(dim=-1), uniforms)
    if logits.device.type == "cpu":
        # One uniform per row: Inductor's CPU code draws random numbers slowly, and a race needs
        # one per token (benchmarks/RESULTS.md: W0's compiled rollout, 18.4 against 19.7 ms).
        return cumulative_count_sample(logits, torch.rand(logits.size(0), device=logits.device))
    return exponential_race_sample(logits)


def exponential_race_sample(logits: Tensor) -> Tensor:
    """One token per row of ``softmax(logits)`` ``[B, V]`` by exponential races: ``argmax(p / E)``
    with ``E ~ Exponential(1)`` draws from ``p``. As ``p`` is proportional to ``exp(logits)``, that is
    ``argmax(logits - log E)``: one pass over the logits, no softmax. ``E = -log(U)``,
    ``U ~ Uniform[0, 1)`` (several times faster than ``exponential_`` on a CPU); ``U = 0`` gives
    ``E = inf``, a score of ``-inf``, never NaN."""
    noise = torch.rand_like(logits).log_().neg_()
    return (logits - noise.log_()).argmax(dim=-1)


def cumulative_count_sample(logits: Tensor, uniforms: Tensor) -> Tensor:
    """Row ``b`` of ``logits`` ``[B, V]`` takes the token where ``uniforms[b]`` (in ``[0, 1)``) falls in
    the cumulative distribution of ``softmax(logits)``: the number of tokens whose cumulative
    (unnormalised) mass is at most the target. One pass and one short scan over the vocabulary; for
    a CPU (on CUDA, :func:`inverse_cdf_sample` splits the scan in blocks that Inductor can generate).
    A token of probability zero is never drawn."""
    weights = (logits - logits.amax(dim=-1, keepdim=True)).exp()
    cdf = weights.cumsum(dim=-1)
    target = uniforms.to(cdf.dtype).unsqueeze(1) * cdf[:, -1:]
    return torch.minimum((cdf <= target).sum(dim=-1), _last_positive(weights))


#: Tokens per block of :func:`inverse_cdf_sample`'s first level.
INVERSE_CDF_BLOCK = 1024


def _last_positive(values: Tensor) -> Tensor:
    """Index of the last entry > 0 along the last dimension (0 if there is none)."""
    positive = (values > 0).flip(-1).int()
    return values.size(-1) - 1 - positive.argmax(dim=-1)


def inverse_cdf_sample(probs: Tensor, uniforms: Tensor, block: int = INVERSE_CDF_BLOCK) -> Tensor:
    """Row ``b`` of ``probs`` ``[B, V]`` takes the token where ``uniforms[b]`` (in ``[0, 1)``) falls in
    its cumulative distribution, found in two levels: the block of ``block`` tokens whose cumulative
    mass crosses the target, then the token inside that block. The same draw as one cumulative
    sum over the whole vocabulary (up to rounding), but every scan is short: Inductor cannot
    generate code for a scan over a 151936-token vocabulary (torch 2.11), so a compiled decode step
    with keyed sampling fell back to running its sampling uncompiled. A token of probability zero
    is never drawn, even where rounding puts the target at or past the total mass.
    """
    rows, vocab = probs.shape
    blocks = -(-vocab // block)
    per_block = torch.nn.functional.pad(probs, (0, blocks * block - vocab)).view(rows, blocks, block)
    block_mass = per_block.sum(dim=-1)  # [B, blocks]
    block_cdf = block_mass.cumsum(dim=-1)
    target = uniforms.to(probs.dtype) * block_cdf[:, -1]
    # The first block whose cumulative mass exceeds the target (never one of zero mass) ...
    chosen = torch.searchsorted(block_cdf, target.unsqueeze(1), right=True).squeeze(1)
    chosen = torch.minimum(chosen, _last_positive(block_mass))
    before = (block_cdf - block_mass).gather(1, chosen.unsqueeze(1)).squeeze(1)
    inside = per_block.gather(1, chosen.view(rows, 1, 1).expand(rows, 1, block)).squeeze(1)  # [B, block]
    # ... then the first token in it whose cumulative mass exceeds the target.
    cdf = inside.cumsum(dim=-1) + before.unsqueeze(1)
    token = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
    return chosen * block + torch.minimum(token, _last_positive(inside))


_MASK32 = 0xFFFFFFFF


def _mul32(x: Tensor, factor: int) -> Tensor:
    """``x * factor mod 2**32`` for ``x`` in ``[0, 2**32)`` held in int64, without int64 overflow."""
    low = x * (factor & 0xFFFF)
    high = ((x * (factor >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) with good avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keyed_uniforms(keys: Tensor, counter: Tensor) -> Tensor:
    """``[B]`` numbers in ``(0, 1)``, a hash of each row's 64-bit ``keys`` ``[B]`` and ``counter``
    (e.g. the index of the token being sampled): counter-based random numbers, the same for a row
    whatever the other rows of the batch are."""
    h = _mix32(keys & _MASK32)
    h = _mix32(h ^ ((keys >> 32) & _MASK32))
    h = _mix32(h ^ (counter & _MASK32))
    return ((h >> 8).float() + 0.5) / 2**24


def distinct_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """``(distinct, inverse)`` for ``rows`` ``[N, K]``: the index of one occurrence of each distinct
    row and, for each row, the position of its own in ``distinct``: ``rows[distinct][inverse]``
    equals ``rows``."""
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    order = torch.arange(len(rows), device=rows.device)
    distinct = torch.full((len(unique),), len(rows), device=rows.device).scatter_reduce_(0, inverse, order, "amin")
    return distinct, inverse


def _shared_prefill_cache(cache: Any, distinct: Tensor, inverse: Tensor, written: set[int]) -> Any:
    """``cache`` for a forward pass of the rows ``distinct`` of a batch: a shallow copy (the same
    layers and buffers) whose ``update`` writes each layer's keys and values to every row of the
    batch (row ``i`` gets those of ``distinct[inverse[i]]``), adds the layer's index to ``written``
    and returns the distinct rows' view of the cache to attend over."""
    shared = copy.copy(cache)

    def update(key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        keys, values = cache.update(key_states[inverse], value_states[inverse], layer_idx, *args, **kwargs)
        written.add(layer_idx)
        return keys[distinct], values[distinct]

    shared.update = update
    return shared


def _imports(module: str) -> bool:
    """Whether ``module`` imports (Triton is not a dependency of the package)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _weights_fingerprint(model: nn.Module) -> tuple[int, ...]:
    """Addresses of every parameter and buffer: a CUDA graph reads them at these addresses."""
    return tuple(t.data_ptr() for t in model.parameters()) + tuple(t.data_ptr() for t in model.buffers())


def default_compile_options(device: torch.device) -> dict[str, Any]:
    """Inductor options for the decode step on ``device``. On CUDA, ``combo_kernels`` launches
    independent small kernels of the step together, as one kernel: 1.51 against 1.60 ms per W1
    decode step on an H200 (``benchmarks/RESULTS.md``)."""
    from torch._inductor import config

    return {"combo_kernels": True} if device.type == "cuda" and hasattr(config, "combo_kernels") else {}


#: Parts of a decode step's down product on CUDA by default (``down_parts``): at W1's shape on an
#: H100 the product with its residual sum took 9.1 us in 2 parts, 12.0 in 4, against 12.4 us for
#: cuBLAS's own split and reduction followed by the residual kernel (``benchmarks/down_split.py``).
DOWN_PARTS = 2

#: Most CUDA graphs captured per sampling setting, one for each bound on the cache slots read.
MAX_SLOT_LIMITS = 8
#: The bounds are multiples of this many slots: a block of the attention kernel's loop.
SLOT_LIMIT_BLOCK = 64


def slot_limits(
    first: int, last: int, cache_len: int, block: int = SLOT_LIMIT_BLOCK, most: int = MAX_SLOT_LIMITS
) -> list[int]:
    """Increasing bounds on the cache slots that decode steps read, for steps that use from ``first``
    to ``last`` slots (the prompt and the tokens so far): the multiples of one width from the first
    ``>= first`` to the first ``>= last``, the width the smallest multiple of ``block`` that gives
    at most ``most`` of them; the last one lowered to ``cache_len`` if it is above. A step that uses
    ``n`` slots reads up to the first bound ``>= n``."""
    if not 1 <= first <= last <= cache_len or most < 2:
        raise ValueError(
            f"slot_limits needs 1 <= first <= last <= cache_len and most >= 2, got {first}, {last}, {cache_len}, {most}"
        )
    width = block
    while -(-last // width) - -(-first // width) + 1 > most:
        width += block
    bounds = [k * width for k in range(-(-first // width), -(-last // width) + 1)]
    bounds[-1] = min(bounds[-1], cache_len)
    return bounds


class StaticCacheGenerator:
    """Samples completions on a reusable ``transformers.StaticCache``; see the module docstring.

    Args:
        model: a causal LM (``transformers`` decoder-only model); its weights are used in place.
        max_batch_size: rows of the cache; size it to the rollout batch (prompts x group size).
        max_cache_len: tokens per row of the cache, at least the longest prompt plus
            ``max_new_tokens`` (it grows when a call needs more).
        use_cuda_graph: capture the decode step as a CUDA graph; ``None`` means "when the model is on
            CUDA", decided at each call (so the generator can be built before the model is moved).
        check_every: decode steps between checks that every row has finished (each check is a host
            synchronisation on CUDA); ``None`` means 16 on CUDA and 1 elsewhere.
        warmup_steps: eager decode steps, on a side stream, before a capture.
        compile: compile the decode step with ``torch.compile`` (Inductor) before capturing it.
            The model's many small element-wise kernels (normalisation, rotary embedding,
            activations, sampling) are fused, which matters because a decode step of a small model
            is bound by the number of kernels it launches. The first rollout pays for the
            compilation (tens of seconds). If compiling the whole step fails, only its model
            forward is compiled; if that fails too, the step runs uncompiled (with a warning each
            time). Without a CUDA graph (on a CPU) the compiled step runs as it is.
        compile_options: Inductor options of that compilation (``torch.compile(options=...)``);
            ``None`` means :func:`default_compile_options`.
        decode_attention: how the decode step's attention (one query per row over the cache) is
            computed, one of ``attention.DECODE_ATTENTION_KINDS``: ``"auto"`` (``"triton"`` on CUDA
            when Triton is installed, ``"math"`` on a CPU, else ``"sdpa"``), ``"sdpa"`` (PyTorch's
            choice of SDPA kernel), ``"efficient"`` (SDPA's memory-efficient kernel on CUDA),
            ``"math"`` (matmuls around an fp32 softmax, fused by ``compile``) or ``"triton"`` (one
            Triton kernel). The prefill always uses SDPA.
        fuse_projections: decode with each layer's q/k/v and gate/up products as one matrix
            product each (``grpo_lightning.engine.fused_decode``), for the model types of
            ``fused_decode.FUSED_MODEL_TYPES`` (others decode as usual). The model's q/k/v and
            gate/up parameters become views of one buffer per layer: same objects and values, no
            copy of the weights.
        qkv_kernel: with ``fuse_projections``, compute each decode layer's norm, q/k/v product,
            rotary embedding and cache write as one Triton kernel (``grpo_lightning.engine.kernels.qkv``).
            ``None`` (the default): on CUDA when Triton is installed and the model qualifies
            (``fused_decode.qkv_kernel_applies``); ``True`` raises where it cannot run.
        sampling_kernel: draw each token with the Triton kernels of ``grpo_lightning.engine.kernels.sampling``
            (inverse-CDF sampling in two passes over the vocabulary) whenever the temperature is
            positive and neither top-k nor top-p truncates the distribution; other settings use
            :func:`sample_tokens`. ``None`` (the default): on CUDA when Triton is installed;
            ``True`` raises where it cannot run.
        attend_slots_in_use: with the Triton attention kernel, read only the cache slots in use at
            each step, rounded up to one of at most ``MAX_SLOT_LIMITS`` bounds (one CUDA graph each;
            see the module docstring); ``False`` reads the whole cache at every step.
        compile_prefill: with ``fuse_projections`` (for the model types it fuses; others prefill
            through their ``forward``), run the prompts through
            :meth:`FusedDecoder.prefill` compiled with ``torch.compile`` (shapes made dynamic after a
            first change) instead of the model's eager ``forward``, which launched about 1,500 small
            kernels from Python, about 40 ms of host time per W1 rollout. The first
            prefill of a cache runs eagerly (it allocates the cache); the next one compiles. ``None``
            (the default): where ``compile`` is on and the model is on CUDA. If the compiler fails,
            prefills run eagerly from then on (with a warning).
        down_parts: with ``fuse_projections``, compute each decode layer's down product as this many
            fp32 products over slices of its input, added up in the residual sum
            (``fused_decode.residual_plus_parts``), instead of cuBLAS splitting it and adding the
            parts in a kernel of its own. ``None`` (the default): ``DOWN_PARTS`` on CUDA for bf16 or
            fp16 weights whose down input size it divides, else 1 (the model's own product).
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
        if down_parts is not None and down_parts < 1:
            raise ValueError(f"down_parts must be at least 1 (or None), got {down_parts}")
        if check_every is not None and check_every < 1:
            raise ValueError(f"check_every must be at least 1, got {check_every}")
        check_decode_attention(decode_attention)
        if down_parts not in (None, 1) and not fuse_projections:
            raise ValueError(f"down_parts={down_parts} splits the fused decoder's down product: set fuse_projections=True too")
        if compile_prefill and not fuse_projections:
            raise ValueError("compile_prefill=True compiles the fused layers' prefill: set fuse_projections=True too")
        if qkv_kernel and not fuse_projections:
            raise ValueError("qkv_kernel=True computes the fused projections: set fuse_projections=True too")
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        attention = getattr(config, "_attn_implementation", None) or "eager"
        if attention not in _SUPPORTED_ATTENTION:
            raise ValueError(
                f"StaticCacheGenerator supports attn_implementation {_SUPPORTED_ATTENTION}, the model uses "
                f"{attention!r}: load it with attn_implementation='sdpa'."
            )
        layer_types = getattr(config, "layer_types", None) or ()
        if any(kind != "full_attention" for kind in layer_types) or getattr(config, "use_sliding_window", False):
            raise ValueError("StaticCacheGenerator supports models whose layers all use full attention.")
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
        self._sampling_ops = None  # grpo_lightning.engine.kernels.sampling where it draws, resolved per call
        self._fused: list[FusedLayer] | None = None
        self._decoder: FusedDecoder | None = None
        self._compile_candidates = None
        self._boolean_mask = attention == "sdpa"
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._pass_cache_position = "cache_position" in parameters
        self._pass_logits_to_keep = "logits_to_keep" in parameters
        self._layout: tuple | None = None
        self._cache = None
        self._graphs: dict[tuple, dict[int, torch.cuda.CUDAGraph]] = {}  # sampling setting -> slot limit -> graph
        self._graph_pool = None
        self._capture_stream = None
        self._weights: tuple[int, ...] | None = None
        self._record_logprobs = False
        self._keyed = False
        self._prefill_step: tuple[FusedDecoder, Any] | None = None  # (decoder, its compiled prefill)
        self._prefill_failed = False

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
        if eos_token_id is None:
            eos_ids = []
        else:
            eos_ids = [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(i) for i in eos_token_id]
        pad = pad_token_id if pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
        rows = prompt_ids.size(0)
        if rows == 0 or sampling.max_new_tokens < 1:
            empty = prompt_ids.new_full((rows, 0), pad)
            return (empty, empty.float()) if return_logprobs else empty
        was_training = self.model.training
        self.model.eval()
        # Autocast is turned off: the rollout runs in the parameters' dtype (load the policy in bf16
        # for bf16 rollouts). Under autocast the keys (promoted to fp32 by the rotary embedding) and
        # the values (bf16) differ in dtype, which the StaticCache of some releases cannot hold.
        # Attention reads grouped KV heads in place instead of repeating the cache for every query
        # head (``attention.grouped_query_attention``); it takes the boolean or the float mask.
        try:
            with (
                torch.autocast(_model_device(self.model).type, enabled=False),
                grouped_query_attention(self.model),
                decode_attention(self.decode_attention),
            ):
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
        finally:
            self.model.train(was_training)
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
        device = _model_device(self.model)
        use_graph = device.type == "cuda" if self.use_cuda_graph is None else self.use_cuda_graph
        if use_graph and device.type != "cuda":
            raise ValueError(f"use_cuda_graph=True needs the model on CUDA, it is on {device}")
        self._prepare(device, prompt_len + sampling.max_new_tokens)
        if self.fuse_projections:  # before the weights' addresses are read: it may move them
            fused = fuse_projections(self.model, self._fused)
            if fused is not self._fused or fused is None:
                self._fused, self._decoder = fused, self._fused_decoder(fused, device)
        prompt_ids = prompt_ids.to(device)
        prompt_mask = prompt_mask.to(device)
        if rows < self.max_batch_size:
            filler = self.max_batch_size - rows
            prompt_ids = torch.cat([prompt_ids, prompt_ids[:1].expand(filler, -1)])
            prompt_mask = torch.cat([prompt_mask, prompt_mask[:1].expand(filler, -1)])
        self._set_stop_tokens(eos_ids, pad, sampling.min_new_tokens)
        self._sampling_ops = self._sampling_kernel_module(device)
        # Per-call settings read by _emit; a captured graph bakes them in, so they are part of its key.
        keyed = self._keyed = row_keys is not None
        self._record_logprobs = record_logprobs
        if keyed:
            self._row_keys[:rows] = row_keys.to(device)
            self._row_keys[rows:] = 0

        logits = self._prefill(prompt_ids, prompt_mask)
        limits = [self.max_cache_len]
        if self._reads_slots_in_use(device) and sampling.max_new_tokens > 1:
            last = prompt_len + sampling.max_new_tokens - 1  # slots the last decode step uses
            limits = slot_limits(prompt_len + 1, last, self.max_cache_len, SLOT_LIMIT_BLOCK)
        graphs = None
        if use_graph:
            fingerprint = _weights_fingerprint(self.model)
            if fingerprint != self._weights:
                # Graphs read the old addresses: drop them, and their memory pool with them.
                self._graphs.clear()
                self._graph_pool = None
                self._weights = fingerprint
            key = (sampling.temperature, sampling.top_k, sampling.top_p, keyed, record_logprobs)
            graphs = self._graphs.setdefault(key, {})
            missing = [limit for limit in limits if limit not in graphs]
            if missing:
                graphs.update(self._capture(sampling, missing))
                logits = self._prefill(prompt_ids, prompt_mask)  # the warm-up steps used the cache
        self._emit(logits, sampling)

        check_every = self.check_every or (16 if device.type == "cuda" else 1)
        steps = 1
        eager_step = None
        bound = 0  # index in limits of the bound of the current step
        while steps < sampling.max_new_tokens:
            while limits[bound] < prompt_len + steps:  # this step uses prompt_len + steps slots
                bound += 1
            if graphs is not None:
                graphs[limits[bound]].replay()
            else:
                with self._slots_in_use(limits[bound]):
                    if eager_step is None:
                        eager_step = self._first_working_step(sampling)  # runs this step
                    else:
                        eager_step(sampling)
            steps += 1
            if steps % check_every == 0 and steps < sampling.max_new_tokens and bool(self._finished[:rows].all()):
                break
        return self._collect(rows, steps)

    def _prepare(self, device: torch.device, needed_len: int) -> None:
        """(Re)allocate the cache and the step buffers when the device, dtype or length changed."""
        cache_len = self.max_cache_len
        if needed_len > cache_len:
            cache_len = -(-needed_len // _CACHE_LEN_MULTIPLE) * _CACHE_LEN_MULTIPLE
        layout = (device, next(self.model.parameters()).dtype, cache_len)
        if layout == self._layout:
            return
        self.clear()
        self.max_cache_len = cache_len
        batch, model = self.max_batch_size, self.model
        dtype = next(model.parameters()).dtype
        self._cache = new_static_cache(model.config, batch, cache_len, device, dtype)
        vocab = model.get_output_embeddings().weight.size(0)

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self._tokens = zeros(batch, 1)  # the token fed to the next decode step
        self._positions = zeros(batch, 1)  # its position id (prompt length + tokens so far - 1)
        self._cache_position = zeros(1)  # its slot in the cache
        self._step = zeros(1)  # index of the completion token the next step samples
        self._min_new = zeros(1)
        self._pad = zeros(1)
        self._finished = zeros(batch, dtype=torch.bool)
        self._key_valid = zeros(batch, cache_len, dtype=torch.bool)  # cache slots a query may attend to
        self._out = zeros(batch, cache_len)
        self._logprobs = zeros(batch, cache_len, dtype=torch.float32)  # of the sampled tokens
        self._eos = zeros(vocab, dtype=torch.bool)
        self._row_keys = zeros(batch)  # keyed sampling: each row's key
        self._arange = torch.arange(cache_len, device=device)
        self._layout = layout

    def _set_stop_tokens(self, eos_ids: list[int], pad: int, min_new_tokens: int) -> None:
        self._eos.zero_()
        if eos_ids:
            self._eos[torch.tensor(eos_ids, device=self._eos.device)] = True
        self._pad.fill_(pad)
        self._min_new.fill_(min_new_tokens)

    # ------------------------------------------------------------------------------ the model

    def _fused_decoder(self, fused: list[FusedLayer] | None, device: torch.device) -> FusedDecoder | None:
        """The decoder of fused projections, on the q/k/v kernel where it runs (see ``__init__``)."""
        if fused is None:
            if self.qkv_kernel:
                raise ValueError(
                    f"qkv_kernel=True: {type(self.model).__name__} has no fused decode step (model types "
                    f"{FUSED_MODEL_TYPES}); set qkv_kernel to None or False"
                )
            return None
        kernel = self.qkv_kernel
        runs_here = (device.type == "cuda" or TRITON_INTERPRETED) and qkv_kernel_applies(self.model, fused)
        if kernel is None:
            kernel = runs_here and _imports("grpo_lightning.engine.kernels.qkv")
        elif kernel and not runs_here:
            raise ValueError(
                f"qkv_kernel=True needs a CUDA device (or TRITON_INTERPRET=1) and a model of "
                f"fused_decode.QKV_KERNEL_MODEL_TYPES {QKV_KERNEL_MODEL_TYPES} with a head dimension of 32 to "
                f"256; this one is a {self.model.config.model_type} model on {device}. Set qkv_kernel to None "
                "or False."
            )
        parts = self.down_parts
        if parts is None:
            parts = DOWN_PARTS if device.type == "cuda" and down_parts_apply(fused, DOWN_PARTS) else 1
        return FusedDecoder(self.model, fused, qkv_kernel=bool(kernel), down_parts=parts)

    def _sampling_kernel_module(self, device: torch.device) -> Any:
        """``grpo_lightning.engine.kernels.sampling`` where it draws the tokens (see ``__init__``), else ``None``."""
        if self.sampling_kernel is False:
            return None
        runs_here = device.type == "cuda" or TRITON_INTERPRETED
        if runs_here and _imports("grpo_lightning.engine.kernels.sampling"):
            return importlib.import_module("grpo_lightning.engine.kernels.sampling")
        if self.sampling_kernel:
            raise ValueError(
                f"sampling_kernel=True needs Triton and a CUDA device (or TRITON_INTERPRET=1); the model is on "
                f"{device}. Set sampling_kernel to None or False."
            )
        return None

    def _attention_mask(self, allowed: Tensor) -> Tensor:
        """A boolean mask for SDPA, an additive float one for eager attention."""
        if self._boolean_mask:
            return allowed
        return torch.zeros(allowed.shape, device=allowed.device).masked_fill_(~allowed, torch.finfo(torch.float32).min)

    def _forward(self, input_ids: Tensor, allowed: Tensor, position_ids: Tensor, cache_position: Tensor) -> Tensor:
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": self._attention_mask(allowed),
            "position_ids": position_ids,
            self._cache_argument: self._cache,
            "use_cache": True,
        }
        if self._pass_cache_position:
            kwargs["cache_position"] = cache_position
        if self._pass_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.model(**kwargs).logits[:, -1]

    def _decode_forward(self, input_ids: Tensor, allowed: Tensor, position_ids: Tensor, cache_position: Tensor) -> Tensor:
        """The forward pass of a decode step: with fused projections when they apply."""
        if self._decoder is None:
            return self._forward(input_ids, allowed, position_ids, cache_position)
        return self._decoder(input_ids, self._attention_mask(allowed), position_ids, self._cache, cache_position)

    def _prefill(self, prompt_ids: Tensor, prompt_mask: Tensor) -> Tensor:
        """Reset the cache, run the prompts through it and set up the decode buffers.

        A GRPO batch holds each prompt ``group_size`` times: only its distinct prompts run through
        the model, and each layer's keys and values are written to every row of the same prompt
        (:func:`_shared_prefill_cache`).
        """
        self._cache.reset()
        prompt_len = prompt_ids.size(1)
        positions = self._arange[:prompt_len]
        self._key_valid.zero_()
        self._key_valid[:, :prompt_len] = prompt_mask.bool()
        causal = self._arange.unsqueeze(0) <= positions.unsqueeze(1)  # [S, L]
        allowed = causal.unsqueeze(0) & self._key_valid.unsqueeze(1)  # [B, S, L]
        # A padding query attends to itself, so no row of the mask is empty.
        allowed[:, positions, positions] = True
        logits = None
        distinct, inverse = distinct_rows(torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1))
        layers = len(getattr(self._cache, "layers", ()))
        if self._prefills_compiled():
            logits = self._compiled_prefill(prompt_ids, prompt_mask, allowed, distinct, inverse)
        elif len(distinct) < len(prompt_ids) and layers:
            cache, written = self._cache, set()
            self._cache = _shared_prefill_cache(cache, distinct, inverse, written)
            try:
                logits = self._forward(
                    prompt_ids[distinct],
                    allowed[distinct].unsqueeze(1),
                    position_ids_from_mask(prompt_mask[distinct]),
                    positions,
                )[inverse]
            finally:
                self._cache = cache
            if len(written) != layers:  # a model that writes its cache another way: prefill every row
                self._cache.reset()
                logits = None
        if logits is None:
            logits = self._forward(prompt_ids, allowed.unsqueeze(1), position_ids_from_mask(prompt_mask), positions)
        self._positions.copy_(prompt_mask.long().sum(-1, keepdim=True))
        self._cache_position.fill_(prompt_len)
        self._step.zero_()
        self._finished.zero_()
        return logits

    def _prefills_compiled(self) -> bool:
        """Whether the prompts go through the compiled :meth:`FusedDecoder.prefill`: with fused
        projections, ``compile_prefill`` (``None``: ``compile`` on CUDA) and a cache that a first,
        eager prefill has allocated."""
        wanted = self.compile and self._out.device.type == "cuda" if self.compile_prefill is None else self.compile_prefill
        if not wanted or self._decoder is None or self._prefill_failed:
            return False
        return all(isinstance(getattr(layer, "keys", None), Tensor) for layer in getattr(self._cache, "layers", [None]))

    def _compiled_prefill(
        self, prompt_ids: Tensor, prompt_mask: Tensor, allowed: Tensor, distinct: Tensor, inverse: Tensor
    ) -> Tensor | None:
        """The logits ``[B, V]`` of the prompts' last position from the compiled prefill of the
        distinct prompts, which writes the keys and values of every row; ``None`` (after a warning,
        and for good) if the compiler fails: the caller prefills eagerly."""
        prompt_len = prompt_ids.size(1)
        if self._prefill_step is None or self._prefill_step[0] is not self._decoder:
            self._prefill_step = (self._decoder, torch.compile(self._decoder.prefill, options=self._inductor_options()))
        try:
            logits = self._prefill_step[1](
                prompt_ids[distinct],
                self._attention_mask(allowed[distinct, :, :prompt_len]).unsqueeze(1),
                position_ids_from_mask(prompt_mask[distinct]),
                self._cache,
                self._arange[:prompt_len],
                inverse,
            )
        except Exception as error:  # noqa: BLE001 - any compiler failure: prefill eagerly from now on
            warnings.warn(f"torch.compile of the prefill failed, prefilling eagerly: {error!r}", stacklevel=3)
            self._prefill_failed = True
            self._cache.reset()
            return None
        return logits[inverse]

    def _emit(self, logits: Tensor, sampling: SamplingParams) -> None:
        """Sample the token of the current step, store it and feed it to the next step."""
        uniforms = keyed_uniforms(self._row_keys, self._step) if self._keyed else None
        untruncated = sampling.temperature > 0 and not 0 < sampling.top_k < logits.size(-1) and sampling.top_p >= 1.0
        if self._sampling_ops is not None and untruncated:
            if uniforms is None:
                uniforms = torch.rand(logits.size(0), device=logits.device)
            token, logprob = self._sampling_ops.sample_by_blocks(
                logits, uniforms, float(sampling.temperature), self._eos, self._step < self._min_new, self._record_logprobs
            )
        else:
            token, logprob = self._draw(logits.float(), sampling, uniforms)
        token = torch.where(self._finished, self._pad, token)
        self._out.index_copy_(1, self._step, token.unsqueeze(1))
        if self._record_logprobs:
            self._logprobs.index_copy_(1, self._step, logprob.masked_fill(self._finished, 0.0).unsqueeze(1))
        self._finished |= self._eos[token]
        self._tokens.copy_(token.unsqueeze(1))
        self._step.add_(1)

    def _draw(self, logits: Tensor, sampling: SamplingParams, uniforms: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The draw in PyTorch (:func:`sample_tokens`) from fp32 ``logits``: the tokens, and their
        log-probabilities before top-k, top-p and the EOS block when they are recorded."""
        blocked = self._eos & (self._step < self._min_new)
        token = sample_tokens(
            logits.masked_fill(blocked, float("-inf")), sampling.temperature, sampling.top_k, sampling.top_p, uniforms
        )
        if not self._record_logprobs:
            return token, None
        tempered = logits if sampling.temperature in (0, 1) else logits / sampling.temperature
        return token, tempered.gather(1, token.unsqueeze(1)).squeeze(1) - tempered.logsumexp(dim=-1)

    def _decode_step(self, sampling: SamplingParams, forward=None) -> None:
        """One token for every row; only in-place updates of static buffers (CUDA-graph safe)."""
        self._key_valid.index_fill_(1, self._cache_position, True)
        allowed = self._key_valid[:, None, None, :]
        logits = (forward or self._decode_forward)(self._tokens, allowed, self._positions, self._cache_position)
        self._emit(logits, sampling)
        self._positions.add_(1)
        self._cache_position.add_(1)

    def _reads_slots_in_use(self, device: torch.device) -> bool:
        """Whether decode steps run the Triton attention kernel, which can read only the cache slots
        in use (``decode_kernel.slots_in_use``); other kinds read the whole cache."""
        if not self.attend_slots_in_use:
            return False
        triton_runs = (device.type == "cuda" or TRITON_INTERPRETED) and _imports("grpo_lightning.engine.kernels.decode_attention")
        return resolve_decode_kind(self.decode_attention, device, triton_runs) == "triton"

    def _slots_in_use(self, limit: int) -> Any:
        """``decode_kernel.slots_in_use(limit)`` for a bound below the cache's length (there are such
        bounds only where the kernel runs: :meth:`_reads_slots_in_use`), else a context that does
        nothing."""
        if limit >= self.max_cache_len:
            return contextlib.nullcontext()
        return importlib.import_module("grpo_lightning.engine.kernels.decode_attention").slots_in_use(limit)

    def _capture(self, sampling: SamplingParams, limits: list[int]) -> dict[int, torch.cuda.CUDAGraph]:
        """Warm up and capture ``_decode_step`` once for each bound on the cache slots it reads
        (``limits``); leaves the cache and buffers to be prefilled again.

        Each warm-up step is undone (positions and counters put back), so that they all write the
        cache slot of the first decode step, however many there are."""
        device = self._out.device
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()  # shared by the graphs of one set of weights
        counters = [self._positions, self._cache_position, self._step]
        start = [counter.clone() for counter in counters]

        def rewind() -> None:
            for counter, value in zip(counters, start):
                counter.copy_(value)

        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            step = self._first_working_step(sampling)
            rewind()
            for limit in [self.max_cache_len] * self.warmup_steps + limits:  # each limit's launch too
                with self._slots_in_use(limit):
                    step(sampling)
                rewind()
        torch.cuda.current_stream(device).wait_stream(side)
        if self._capture_stream is None:
            # Its own capture stream, hence its own cuBLAS workspace: graphs captured on one stream
            # share one, and two engines' graphs replayed at once on two streams would both use it.
            self._capture_stream = torch.cuda.Stream(device)
        graphs = {}
        for limit in limits:
            graph = graphs[limit] = torch.cuda.CUDAGraph()
            with self._slots_in_use(limit), torch.cuda.graph(graph, pool=self._graph_pool, stream=self._capture_stream):
                step(sampling)
        return graphs

    def _inductor_options(self) -> dict[str, Any]:
        """The options of this engine's compilations: ``compile_options``, or the defaults for its device."""
        return self.compile_options if self.compile_options is not None else default_compile_options(self._out.device)

    def _first_working_step(self, sampling: SamplingParams):
        """The decode step to use, after running it once: with ``compile``, the whole step
        compiled, else its model forward compiled (Inductor cannot generate code for every graph),
        else eager."""
        if self._compile_candidates is None:
            self._compile_candidates = []
            if self.compile:
                options = self._inductor_options()
                compiled_forward = torch.compile(self._decode_forward, dynamic=False, options=options)
                self._compile_candidates = [
                    ("the decode step", torch.compile(self._decode_step, dynamic=False, options=options)),
                    ("the decode step's forward", functools.partial(self._decode_step, forward=compiled_forward)),
                ]
        while self._compile_candidates:
            name, step = self._compile_candidates[0]
            try:
                step(sampling)
                return step
            except Exception as error:  # noqa: BLE001 - any compiler failure: try the next candidate
                warnings.warn(f"torch.compile of {name} failed, trying without it: {error!r}", stacklevel=3)
                self._compile_candidates.pop(0)
        self._decode_step(sampling)
        return self._decode_step

    def _collect(self, rows: int, steps: int) -> tuple[Tensor, Tensor | None]:
        """The first ``rows`` completions and (when recorded) their log-probs, cut after the longest
        one's EOS."""
        out = self._out[:rows, :steps]
        is_eos = self._eos[out]
        has_eos = is_eos.any(dim=1)
        lengths = torch.where(has_eos, is_eos.int().argmax(dim=1) + 1, steps)
        width = int(lengths.max())
        logprobs = self._logprobs[:rows, :width].clone() if self._record_logprobs else None
        return out[:, :width].clone(), logprobs


@torch.no_grad()
def fast_generate_group(
    generator: StaticCacheGenerator,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    group_size: int,
    sampling: SamplingParams,
    row_keys: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``generate_group`` on a ``StaticCacheGenerator``: same arguments (the generator in place of the
    model) and the same ``(prompt_ids [N, S], prompt_mask [N, S], completion_ids [N, T])``.
    ``row_keys`` ``[N]``: keyed sampling (``StaticCacheGenerator.generate``), one key per completion."""
    device = _model_device(generator.model)
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    prompt_ids = encoded["input_ids"].to(device).repeat_interleave(group_size, dim=0)
    prompt_mask = encoded["attention_mask"].to(device).repeat_interleave(group_size, dim=0)
    completion_ids = generator.generate(
        prompt_ids,
        prompt_mask,
        sampling,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        row_keys=row_keys,
    )
    return prompt_ids, prompt_mask, completion_ids

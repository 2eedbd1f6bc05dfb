"""Where does the NaN gradient come from? SDPA with fully masked query rows (left padding), bf16, by width and backend."""
import itertools, torch, sys
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
torch.manual_seed(0)
import os; dev = os.environ.get("DEV", "cuda")
print(torch.__version__, torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled())
def case(L, backends, compiled, pad=3, dtype=torch.bfloat16):
    B, H, D = 4, 9, 64
    q, k, v = (torch.randn(B, H, L, D, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    key_ok = torch.ones(B, L, dtype=torch.bool, device=dev); key_ok[0, :pad] = False; key_ok[1, -2:] = False
    causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    mask = causal[None, None] & key_ok[:, None, None, :]
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    if compiled: fn = torch.compile(fn)
    try:
        with sdpa_kernel(backends):
            out = fn(q, k, v, mask)
            # the loss ignores the padded queries, as the log-prob pass does
            w = key_ok[:, None, :, None].to(out.dtype)
            (out * w).float().sum().backward()
    except Exception as e:
        return f"error {type(e).__name__}: {str(e)[:80]}"
    return f"out_nan={out.isnan().any().item()} rows0_out={out[0,0,:pad,0].float().tolist()} grad_nan q/k/v={[t.grad.isnan().any().item() for t in (q,k,v)]}"
for L, name, compiled in itertools.product((63, 64, 80), ("default", "efficient", "cudnn", "math"), (False, True)):
    backends = {"default": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
                "efficient": [SDPBackend.EFFICIENT_ATTENTION], "cudnn": [SDPBackend.CUDNN_ATTENTION], "math": [SDPBackend.MATH]}[name]
    torch._dynamo.reset()
    print(f"L={L} {name:9s} compiled={compiled}: {case(L, backends, compiled)}", flush=True)

# The library's pass on a tiny Llama shaped like SmolLM2's attention, bf16 autocast, eager and compiled, two widths.
sys.path.insert(0, ".")
from transformers import LlamaConfig, LlamaForCausalLM
from grpo_lightning.models.logprobs import completion_logprobs
cfg = LlamaConfig(vocab_size=512, hidden_size=576, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256)
model = LlamaForCausalLM(cfg).to(dev)
for S, T, compiled in itertools.product((20,), (43, 44, 40), (False, True)):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    pi = torch.randint(0, 512, (8, S), generator=g).to(dev); pm = torch.ones_like(pi); pm[0, :5] = 0; pm[3, :2] = 0
    ci = torch.randint(0, 512, (8, T), generator=g).to(dev); cm = torch.ones_like(ci); cm[2, -7:] = 0
    model.zero_grad(set_to_none=True)
    with torch.autocast(dev, dtype=torch.bfloat16):
        logp, _ = completion_logprobs(model, pi, pm, ci, cm, compiled_model=compiled)
    logp.sum().backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    print(f"model S={S} T={T} width={S+T} compiled={compiled}: logp_nan={logp.isnan().any().item()} nonfinite grads={bad[:3]} ({len(bad)})", flush=True)
print("--- the same passes with cuDNN attention left out")
for S, T, compiled in itertools.product((20,), (44,), (False, True)):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    pi = torch.randint(0, 512, (8, S), generator=g).to(dev); pm = torch.ones_like(pi); pm[0, :5] = 0; pm[3, :2] = 0
    ci = torch.randint(0, 512, (8, T), generator=g).to(dev); cm = torch.ones_like(ci); cm[2, -7:] = 0
    model.zero_grad(set_to_none=True)
    with torch.autocast(dev, dtype=torch.bfloat16), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        logp, _ = completion_logprobs(model, pi, pm, ci, cm, compiled_model=compiled)
        logp.sum().backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    print(f"no-cudnn model S={S} T={T} compiled={compiled}: logp_nan={logp.isnan().any().item()} nonfinite grads={bad[:3]} ({len(bad)})", flush=True)

"""Batch-1 decoding speed and weight memory of a Llama-style model: float vs bitcompile-quantized.

    python examples/llm_decode.py                                   # small CPU default (fp32)
    python examples/llm_decode.py --device cuda --dim 4096 --layers 4 --tokens 128   # GPU (bf16)
    python examples/llm_decode.py --device cuda --dim 4096 --layers 4 --compile      # + CUDA graphs
    python examples/llm_decode.py --tiny                            # a seconds-long smoke run
    python examples/llm_decode.py --device cuda --dim 4096 --layers 4 --compile --profile  # kernels a token

What it shows: a Llama-style decoder (RMSNorm, rotary attention with a KV cache, SwiGLU MLP;
random weights, defined below) whose linear layers are converted in place with
`bitcompile.quantize_` to "binary_weight" (W1A16: +-alpha per row, 1 bit a weight) and to "apot4"
(4-bit APoT codes). The token embedding and the output head stay float. For each model it measures
greedy decoding of --tokens tokens after a short prompt, one token a step (batch 1, after a
warm-up), and prints tokens/s and the weight memory (bytes of the state dict: parameters and
buffers, not the KV cache). With --compile every model's forward runs under torch.compile with
mode="reduce-overhead" on CUDA (CUDA graphs), the default mode on CPU: the float model with inductor, the
quantized ones with backend="bitcompile" (which merges the packed linears that read the same input into one call).

The weights are random, so the generated tokens mean nothing; they only show that each model decodes.
"""

import argparse
import copy
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import bitcompile  # noqa: F401  (registers the bitcompile ops)
from bitcompile.quantize import quantize_  # SPEC: bitcompile.quantize_, not exported by __init__ yet


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=None, help="attention heads (default dim // 128)")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--prompt", type=int, default=8, help="prompt length in tokens")
    parser.add_argument("--tokens", type=int, default=64, help="tokens to decode (timed)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each model (mode='reduce-overhead' on CUDA)")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long smoke run")
    parser.add_argument("--profile", action="store_true",
                        help="print each model's kernels by time a decoded token (torch.profiler; CUDA)")
    parser.add_argument("--top", type=int, default=12, help="kernels --profile prints a model")
    args = parser.parse_args()
    if args.profile and not args.device.startswith("cuda"):
        parser.error("--profile times CUDA kernels: it needs --device cuda")
    if args.tiny:
        args.dim, args.layers, args.heads, args.vocab, args.prompt, args.tokens = 128, 2, 2, 512, 4, 8
    if args.heads is None:
        args.heads = max(1, args.dim // 128)
    return args


# ------------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def rotary_tables(head_dim, max_len, base=10000.0):
    """cos and sin of the rotation angles, [max_len, head_dim / 2] each."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(max_len).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """Rotate pairs (x[2i], x[2i+1]) of x [B, H, L, head_dim] by the angles of its positions."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim, heads, max_len):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        # The KV cache: buffers (fixed addresses for CUDA graphs), not saved in the state dict.
        self.register_buffer("k_cache", torch.zeros(1, heads, max_len, self.head_dim), persistent=False)
        self.register_buffer("v_cache", torch.zeros(1, heads, max_len, self.head_dim), persistent=False)

    def forward(self, x, positions, cos, sin, mask):
        batch, length, _ = x.shape
        q, k, v = (w(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        self.k_cache[:, :, positions] = k
        self.v_cache[:, :, positions] = v
        out = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, heads, hidden, max_len):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads, max_len)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x, positions, cos, sin, mask):
        x = x + self.attention(self.attention_norm(x), positions, cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab, dim, layers, heads, max_len):
        super().__init__()
        hidden = 256 * math.ceil(8 * dim / 3 / 256)  # Llama's SwiGLU width, rounded up to 256
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, hidden, max_len) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        cos, sin = rotary_tables(dim // heads, max_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, positions):
        """Logits of the last position, [B, vocab]. tokens [B, L] sit at `positions` [L]; the
        KV cache keeps the keys and values of earlier calls."""
        max_len = self.rope_cos.shape[0]
        mask = torch.arange(max_len, device=tokens.device)[None, :] <= positions[:, None]  # causal
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = self.tok_embeddings(tokens)
        for block in self.layers:
            x = block(x, positions, cos, sin, mask)
        return self.output(self.norm(x[:, -1]))


# ------------------------------------------------------------------------------------------------
# Decoding, timing, memory
# ------------------------------------------------------------------------------------------------
def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def greedy_decode(forward, prompt, n_tokens):
    """Prefill the prompt [1, P], then decode n_tokens one at a time. Returns (tokens, prompt logits,
    seconds spent decoding)."""
    device = prompt.device
    length = prompt.shape[1]
    logits = forward(prompt, torch.arange(length, device=device))
    prompt_logits = logits.clone()
    token = logits.argmax(-1, keepdim=True)
    generated = [token]
    # Every step's position made on the device up front: torch.tensor([p], device=...) a step is a copy from pageable
    # host memory, which the driver may stage by waiting for the stream, and then the host never runs ahead of the GPU.
    positions = torch.arange(length, length + n_tokens, device=device)
    synchronize(device)
    start = time.perf_counter()
    for i in range(n_tokens - 1):
        token = forward(token, positions[i:i + 1]).argmax(-1, keepdim=True)
        generated.append(token)
    synchronize(device)
    return torch.cat(generated, dim=1), prompt_logits, time.perf_counter() - start


def print_profile(name, forward, prompt, n_tokens, top):
    """Kernel time a decoded token by kernel name (torch.profiler, CUDA) against the wall time a token: where the
    kernels take much less than the wall time, the GPU waits for the host between them."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _, _, seconds = greedy_decode(forward, prompt, n_tokens)
    steps = n_tokens - 1
    times = {}
    for event in prof.key_averages():
        if event.self_device_time_total > 0:
            times[event.key] = times.get(event.key, 0.0) + event.self_device_time_total / steps
    # the prompt's forward ran inside the profile too: its kernels are spread over the steps (a few percent)
    total = sum(times.values())
    print(f"\n{name}: {total:.0f} us of kernels a token (prompt included), {1e6 * seconds / steps:.0f} us wall a token "
          f"(profiled)")
    for key, us in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {us:8.1f} us  {100 * us / total:5.1f}%  {key[:100]}")


def state_bytes(module):
    """Bytes of the weights: every tensor of the state dict (parameters and persistent buffers)."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def linear_bytes(model):
    """Weight bytes of the transformer blocks' linear layers (float or quantized)."""
    return sum(state_bytes(m) for name, m in model.layers.named_modules()
               if isinstance(m, nn.Linear) or type(m).__name__ == "QuantizedLinear")


def not_output_head(fqn, kind):
    return fqn != "output"  # quantize_ filter: every linear layer but the output head


def main():
    args = parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    max_len = args.prompt + args.tokens
    base = Llama(args.vocab, args.dim, args.layers, args.heads, max_len).to(device, dtype)
    print(f"Llama-style model: dim {args.dim}, {args.layers} layers, {args.heads} heads, vocab {args.vocab}, "
          f"{dtype}, device {device}; prompt {args.prompt} tokens, decode {args.tokens} tokens, batch 1"
          f"{', torch.compile' if args.compile else ''}")

    models = {"float": base}
    for scheme in ("binary_weight", "apot4"):
        models[scheme] = quantize_(copy.deepcopy(base), scheme, filter=not_output_head)

    prompt = torch.randint(args.vocab, (1, args.prompt), device=device)
    results = {}
    for name, model in models.items():
        forward = model
        if args.compile:
            mode = "reduce-overhead" if device.type == "cuda" else None
            # The quantized models under the bitcompile backend: its passes call the packed linears that read the
            # same x (q / k / v, w1 / w3) as one kernel call (passes/sibling_linears.py); the rest goes to inductor.
            backend = "inductor" if name == "float" else "bitcompile"
            forward = torch.compile(model, backend=backend, mode=mode, fullgraph=True)
        greedy_decode(forward, prompt, min(args.tokens, 4))  # warm-up (and compilation)
        greedy_decode(forward, prompt, min(args.tokens, 4))
        tokens, _, seconds = greedy_decode(forward, prompt, args.tokens)
        results[name] = {
            "tokens/s": (args.tokens - 1) / seconds,
            "linear MiB": linear_bytes(model) / 2**20,
            "total MiB": state_bytes(model) / 2**20,
            "tokens": tokens,
        }
        print(f"{name:>13}: {results[name]['tokens/s']:8.1f} tokens/s, first tokens {tokens[0, :8].tolist()}",
              flush=True)
        if args.profile:
            print_profile(name, forward, prompt, args.tokens, args.top)

    reference = results["float"]
    print("\nsummary (batch-1 greedy decoding)")
    print(f"{'model':>13}  {'tokens/s':>9}  {'speedup':>7}  {'block linear weights':>20}  {'all weights':>11}")
    for name, r in results.items():
        print(f"{name:>13}  {r['tokens/s']:9.1f}  {r['tokens/s'] / reference['tokens/s']:6.2f}x  "
              f"{r['linear MiB']:16.2f} MiB  {r['total MiB']:7.2f} MiB")


if __name__ == "__main__":
    main()

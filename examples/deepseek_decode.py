"""One DeepSeek-V3 MLA attention layer, end to end on both stacks: a prefill writes each new request's latent KV into
the paged cache, then decode steps with MTP (2 new tokens a request a step) run through padded buckets while requests
finish and join. Every step's layer output is checked against a float64 attention computed from the same weights
without absorption and without a cache, and the JAX output against the torch output.

    python -m examples.deepseek_decode --heads 16 --steps 8                    # CPU: xla and the torch reference
    python -m examples.deepseek_decode --heads 128 --steps 8 --impl-torch fa3 --impl-jax pallas_mosaic_gpu   # Hopper

The layer (DeepSeek-V3's attention shapes; random, seeded weights; `h` the hidden states `[T, hidden_size]`):

    q            = q_b_proj(rms_norm(q_a_proj(h)))            [T, H, 128 + 64]    q_lora_rank 1536
    kv           = kv_a_proj_with_mqa(h)                      [T, 512 + 64]
    kv_c, k_pe   = rms_norm(kv[:, :512]), rope(kv[:, 512:])   written to the cache by write_kv (slot_mapping)
    q_nope, q_pe = q[..., :128], rope(q[..., 128:])
    W_UK, W_UV   = kv_b_proj [512 -> H x (128 + 128)] split per head
    q_latent     = q_nope @ W_UK (absorbed: 128 -> 512 per head)
    out          = mla_decode([q_latent | q_pe], kv_cache)    [T, H, 512]
    y            = o_proj((out @ W_UV).reshape(T, H * 128))   [T, hidden_size]

RoPE is DeepSeek's YaRN (vLLM's `DeepseekScalingRotaryEmbedding`, rope_type "deepseek_yarn") with V3's settings:
rope_theta 10000, factor 40, original_max_position_embeddings 4096, beta_fast 32, beta_slow 1, mscale 1,
mscale_all_dim 1. It rotates interleaved pairs `(x[2i], x[2i+1])` (GPT-J style: vLLM builds DeepSeek-V2/V3's rope with
`is_neox_style=False`; HF transformers' DeepSeek-V3 gets the same result with `rope_interleave=True`). Its cos/sin
carry the factor `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` (1 here), and the softmax scale is
`(128 + 64) ** -0.5 * mscale(factor, mscale_all_dim) ** 2`, `mscale(s, m) = 0.1 m ln(s) + 1`: 0.1352 for V3.

Numerics of both stacks, where vLLM rounds: weights and every activation between ops in the config's dtype; matmuls
accumulate in float32; RMSNorm and RoPE compute in float32 and round once. The rope table `[cos | sin]` is computed in
float64 on the host for the positions the run reaches and stored in float32 (vLLM computes its cos_sin_cache in
float32). The float64 reference (`reference_layer`) runs in torch on the torch stack's device, so that it also checks
real sizes on a GPU. In bfloat16 the layer output sits about 5e-3 (relative norm) from it: each of the dozen roundings
between the hidden state and the output (the projections', the norms' and RoPE's outputs, q_latent, the decode's
output, W_UV's) costs 1.5e-3 to 3e-3, those of q and k more the larger the attention logits (`init_weights`' logit_std).

Time a step is split into the attention (the decode call, with FA3 the bucket's CUDA graph replay and its metadata
load) and the rest (projections, RoPE, the cache write, the absorption, W_UV and o_proj), each timed to completion
(`block_until_ready`, `torch.cuda.synchronize`). Steps that compile (a bucket's first step) are left out of the
throughput.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and JAX share one GPU

import argparse
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

import mla_jax
import mla_torch
from mla_spec import Bucket, MLAConfig, build_decode_metadata, pad_to_bucket, smallest_bucket
from parity.compare import TOLERANCES, Comparison, compare

MTP_Q_LEN = 2
"""New tokens a request a decode step: the token and one MTP draft token (DeepSeek-V3's one MTP module)."""


# ---------------------------------------------------------------------------------------------------------------------
# The layer's shapes and DeepSeek's YaRN RoPE
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """One DeepSeek-V3 attention layer: the model config's names and V3's values (hidden_size 7168 in V3; a small one
    keeps a CPU run quick without changing the attention's shapes)."""

    num_heads: int = 128
    hidden_size: int = 7168
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_factor: float = 40.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 1.0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """DeepSeek's yarn softmax scale: `qk_head_dim ** -0.5 * mscale(factor, mscale_all_dim) ** 2`."""
        m = yarn_get_mscale(self.rope_factor, self.mscale_all_dim)
        return self.qk_head_dim**-0.5 * m * m

    def mla_config(self, *, page_size: int, dtype: str = "bfloat16") -> MLAConfig:
        """The decode's config: this layer's head counts and widths, and the yarn softmax scale."""
        return MLAConfig(num_heads=self.num_heads, kv_lora_rank=self.kv_lora_rank,
                         qk_rope_head_dim=self.qk_rope_head_dim, qk_nope_head_dim=self.qk_nope_head_dim,
                         v_head_dim=self.v_head_dim, page_size=page_size, dtype=dtype,
                         softmax_scale=self.softmax_scale)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude factor, `0.1 mscale ln(scale) + 1` (1 when scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_range(shape: LayerShape) -> tuple[int, int]:
    """The rotary dims between which YaRN blends interpolation into extrapolation: the dims whose wavelength fits
    beta_fast and beta_slow rotations into original_max_position_embeddings (floor / ceil, clamped to the dims)."""
    dim, base, orig = shape.qk_rope_head_dim, shape.rope_theta, shape.original_max_position_embeddings

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(correction_dim(shape.beta_fast))
    high = math.ceil(correction_dim(shape.beta_slow))
    return max(low, 0), min(high, dim - 1)


def yarn_inv_freq(shape: LayerShape) -> np.ndarray:
    """The rotary inverse frequencies `[qk_rope_head_dim / 2]` (float64): extrapolated (theta ** (-2i / dim)) below the
    correction range, interpolated (divided by factor) above it, a linear ramp between."""
    dim = shape.qk_rope_head_dim
    pos_freqs = shape.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (shape.rope_factor * pos_freqs)
    low, high = yarn_correction_range(shape)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation_mask = 1.0 - ramp
    return interpolation * (1.0 - extrapolation_mask) + extrapolation * extrapolation_mask


def rope_cos_sin(positions, shape: LayerShape) -> tuple[np.ndarray, np.ndarray]:
    """`(cos, sin)` `[n, qk_rope_head_dim / 2]` in float64 at `positions`, times DeepSeek's cos/sin factor
    `mscale(factor, mscale) / mscale(factor, mscale_all_dim)`."""
    m = yarn_get_mscale(shape.rope_factor, shape.mscale) / yarn_get_mscale(shape.rope_factor, shape.mscale_all_dim)
    angles = np.asarray(positions, np.float64)[:, None] * yarn_inv_freq(shape)[None, :]
    return np.cos(angles) * m, np.sin(angles) * m


def rope_table(shape: LayerShape, num_positions: int) -> np.ndarray:
    """`[num_positions, qk_rope_head_dim]` float32 `[cos | sin]` for positions 0..num_positions-1, computed in float64."""
    cos, sin = rope_cos_sin(np.arange(num_positions), shape)
    return np.concatenate([cos, sin], axis=-1).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------------------------------


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` rounded to `dtype` (a torch dtype name), returned as float32."""
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(getattr(torch, dtype)).float().numpy()


def init_weights(shape: LayerShape, *, dtype: str = "bfloat16", seed: int = 0,
                 logit_std: float = 1.0) -> dict[str, np.ndarray]:
    """Random layer weights (float32 arrays holding `dtype` values), each projection `[in, out]` (x @ W; the transpose
    of an nn.Linear weight) with standard deviation 1 / sqrt(in), the norms' weights around 1, except q_b_proj,
    scaled so that the attention logits have about `logit_std` for standard deviation (1 / sqrt(in) there too would
    give sqrt(192) x softmax_scale = 1.87, and a bfloat16 layer about a quarter further from float64):

        q_a_proj [hidden, q_lora_rank], q_a_layernorm [q_lora_rank], q_b_proj [q_lora_rank, H * (128 + 64)],
        kv_a_proj_with_mqa [hidden, 512 + 64], kv_a_layernorm [512], kv_b_proj [512, H * (128 + 128)],
        o_proj [H * 128, hidden]

    kv_b_proj's columns are per head `[k_nope (128) | v (128)]`, as DeepSeek's checkpoint (W_UK, W_UV: `split_kv_b`)."""
    s, H = shape, shape.num_heads
    rng = np.random.default_rng(seed)
    q_gain = logit_std / (s.softmax_scale * math.sqrt(s.qk_head_dim))

    def proj(n_in, n_out):
        return rng.standard_normal((n_in, n_out), dtype=np.float32) / np.float32(math.sqrt(n_in))

    def norm(n):
        return 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)

    weights = {
        "q_a_proj": proj(s.hidden_size, s.q_lora_rank),
        "q_a_layernorm": norm(s.q_lora_rank),
        "q_b_proj": proj(s.q_lora_rank, H * s.qk_head_dim) * np.float32(q_gain),
        "kv_a_proj_with_mqa": proj(s.hidden_size, s.kv_lora_rank + s.qk_rope_head_dim),
        "kv_a_layernorm": norm(s.kv_lora_rank),
        "kv_b_proj": proj(s.kv_lora_rank, H * (s.qk_nope_head_dim + s.v_head_dim)),
        "o_proj": proj(H * s.v_head_dim, s.hidden_size),
    }
    return {k: round_to(v, dtype) for k, v in weights.items()}


def split_kv_b(kv_b_proj, shape: LayerShape):
    """`(W_UK [H, 128, 512], W_UV [H, 512, 128])` from kv_b_proj `[512, H * (128 + 128)]` (works on NumPy, JAX and
    torch arrays): q_latent[h] = q_nope[h] @ W_UK[h], o[h] = out[h] @ W_UV[h], vLLM's `W_UK_T` and `W_UV`."""
    L, H, N = shape.kv_lora_rank, shape.num_heads, shape.qk_nope_head_dim
    w = kv_b_proj.reshape(L, H, N + shape.v_head_dim)
    w_uk, w_uv = w[..., :N], w[..., N:]  # [L, H, N], [L, H, V]
    return _permute(w_uk, (1, 2, 0)), _permute(w_uv, (1, 0, 2))


def _permute(x, axes):
    return x.permute(*axes) if isinstance(x, torch.Tensor) else x.transpose(axes)


# ---------------------------------------------------------------------------------------------------------------------
# The layer in JAX
# ---------------------------------------------------------------------------------------------------------------------


def _jnp_mm(x, w):
    """x @ w in x's dtype (XLA accumulates a bf16 or fp16 dot in float32)."""
    return jnp.matmul(x, w)


def _jnp_bmm(spec: str, x, w):
    """einsum of two `dtype` operands with float32 accumulation, in x's dtype. XLA:CPU has no mixed-precision dot and
    accumulates a batched bfloat16 dot in bfloat16 (a 1e-2 relative error here), so on a CPU the operands are
    converted to float32 first (exactly)."""
    if jax.default_backend() == "cpu":
        return jnp.einsum(spec, x.astype(jnp.float32), w.astype(jnp.float32)).astype(x.dtype)
    return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def _jnp_rms_norm(x, weight, eps):
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps) * weight.astype(jnp.float32)
    return y.astype(x.dtype)


def _jnp_rope(x, cos, sin):
    """Rotates the interleaved pairs of x `[T, ..., R]` by cos/sin `[T, R / 2]` (float32 math)."""
    xf = x.astype(jnp.float32)
    cos = cos.reshape(cos.shape[:1] + (1,) * (x.ndim - 2) + cos.shape[1:])
    sin = sin.reshape(cos.shape)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(x.shape).astype(x.dtype)


def jax_kv(p, rope, hidden, positions, shape: LayerShape):
    """The new tokens' cache rows: `(kv_c [T, 512], k_pe [T, 64])`, and the tokens' (cos, sin)."""
    L, R = shape.kv_lora_rank, shape.qk_rope_head_dim
    cos_sin = rope[positions]
    cos, sin = cos_sin[:, : R // 2], cos_sin[:, R // 2 :]
    kv = _jnp_mm(hidden, p["kv_a_proj_with_mqa"])
    kv_c = _jnp_rms_norm(kv[:, :L], p["kv_a_layernorm"], shape.rms_norm_eps)
    return kv_c, _jnp_rope(kv[:, L:], cos, sin), (cos, sin)


def jax_prefill(p, rope, hidden, positions, slot_mapping, kv_cache, *, shape: LayerShape, config: MLAConfig):
    """A prefill's cache write: the prompt's `[kv_c | k_pe]` rows into their slots. Returns the new cache."""
    kv_c, k_pe, _ = jax_kv(p, rope, hidden, positions, shape)
    return mla_jax.write_kv(kv_cache, kv_c, k_pe, slot_mapping, config)


def jax_pre_attention(p, rope, hidden, positions, slot_mapping, kv_cache, *, shape: LayerShape, config: MLAConfig):
    """Everything before the decode: the cache write and the absorbed q `[T, H, 512 + 64]`. Returns (q, new cache)."""
    H, N, eps = shape.num_heads, shape.qk_nope_head_dim, shape.rms_norm_eps
    kv_c, k_pe, (cos, sin) = jax_kv(p, rope, hidden, positions, shape)
    kv_cache = mla_jax.write_kv(kv_cache, kv_c, k_pe, slot_mapping, config)
    q = _jnp_mm(_jnp_rms_norm(_jnp_mm(hidden, p["q_a_proj"]), p["q_a_layernorm"], eps), p["q_b_proj"])
    q = q.reshape(q.shape[0], H, shape.qk_head_dim)
    q_pe = _jnp_rope(q[..., N:], cos, sin)
    q_latent = _jnp_bmm("thn,hnl->thl", q[..., :N], p["W_UK"])
    return jnp.concatenate([q_latent, q_pe], axis=-1), kv_cache


def jax_post_attention(p, out, *, shape: LayerShape):
    """The decode's latent output `[T, H, 512]` through W_UV and o_proj: `[T, hidden_size]`."""
    o = _jnp_bmm("thl,hlv->thv", out, p["W_UV"])
    return _jnp_mm(o.reshape(o.shape[0], -1), p["o_proj"])


class JaxLayer:
    """The layer on the JAX stack: its weights and cache on JAX's default device, and one `jax.jit` each for the
    prefill's cache write, the part before the decode (the cache donated: written in place), the decode
    (`mla_jax.mla_decode(impl=...)`) and the part after it."""

    def __init__(self, shape: LayerShape, config: MLAConfig, weights: dict, rope: np.ndarray, num_blocks: int, *,
                 impl: str = "xla", interpret: bool | None = None):
        dt = jnp.dtype(config.dtype)
        self.impl = impl
        self.params = {k: jnp.asarray(v, dt) for k, v in weights.items()}
        self.params["W_UK"], self.params["W_UV"] = split_kv_b(self.params["kv_b_proj"], shape)
        self.rope = jnp.asarray(rope)
        self.kv_cache = jnp.zeros((num_blocks, config.page_size, config.head_dim), dt)
        statics = dict(shape=shape, config=config)
        self.prefill_fn = jax.jit(functools.partial(jax_prefill, **statics), donate_argnames="kv_cache")
        self.pre_fn = jax.jit(functools.partial(jax_pre_attention, **statics), donate_argnames="kv_cache")
        self.decode_fn = jax.jit(
            lambda q, kv, md: mla_jax.mla_decode(q, kv, md, config, impl=impl, interpret=interpret)[0])
        self.post_fn = jax.jit(functools.partial(jax_post_attention, shape=shape))
        self.dtype = dt

    def prefill(self, hidden: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray) -> None:
        self.kv_cache = self.prefill_fn(self.params, self.rope, jnp.asarray(hidden, self.dtype),
                                        jnp.asarray(positions), jnp.asarray(slot_mapping), self.kv_cache)

    def step(self, hidden: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray, metadata):
        """One decode step on padded inputs. Returns (y [rows, hidden] float32 NumPy, attention s, rest s)."""
        h, pos, slots = jnp.asarray(hidden, self.dtype), jnp.asarray(positions), jnp.asarray(slot_mapping)
        md = mla_jax.to_jax_metadata(metadata)
        jax.block_until_ready((h, pos, slots, md))
        t0 = time.perf_counter()
        q, self.kv_cache = self.pre_fn(self.params, self.rope, h, pos, slots, self.kv_cache)
        jax.block_until_ready((q, self.kv_cache))
        t1 = time.perf_counter()
        out = jax.block_until_ready(self.decode_fn(q, self.kv_cache, md))
        t2 = time.perf_counter()
        y = jax.block_until_ready(self.post_fn(self.params, out))
        t3 = time.perf_counter()
        return np.asarray(y.astype(jnp.float32)), t2 - t1, (t1 - t0) + (t3 - t2)

    def compiles(self) -> dict[str, int]:
        """Programs compiled so far by each jitted part of a decode step."""
        return {"pre": self.pre_fn._cache_size(), "decode": self.decode_fn._cache_size(),
                "post": self.post_fn._cache_size()}


# ---------------------------------------------------------------------------------------------------------------------
# The layer in torch
# ---------------------------------------------------------------------------------------------------------------------


def _torch_rms_norm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _torch_rope(x, cos, sin):
    """Rotates the interleaved pairs of x `[T, ..., R]` by cos/sin `[T, R / 2]` (float32 math)."""
    xf = x.float()
    cos = cos.reshape(cos.shape[:1] + (1,) * (x.dim() - 2) + cos.shape[1:])
    sin = sin.reshape(cos.shape)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).reshape(x.shape).to(x.dtype)


class TorchLayer:
    """The layer on the torch stack, on `device`: the cache written in place by `mla_torch.write_kv`; the decode by
    `mla_torch.mla_decode(impl="reference")`, or with impl="fa3" by `mla_torch.BucketGraphs` (FA3 in one CUDA graph a
    bucket, captured at the bucket's first step and replayed after)."""

    def __init__(self, shape: LayerShape, config: MLAConfig, weights: dict, rope: np.ndarray, num_blocks: int, *,
                 impl: str = "reference", device="cpu", buckets: Sequence[Bucket] = ()):
        dt = getattr(torch, config.dtype)
        self.shape, self.config, self.impl, self.device, self.dtype = shape, config, impl, torch.device(device), dt
        self.w = {k: torch.from_numpy(v).to(device=device, dtype=dt) for k, v in weights.items()}
        w_uk, w_uv = split_kv_b(self.w["kv_b_proj"], shape)
        self.w["W_UK"], self.w["W_UV"] = w_uk.contiguous(), w_uv.contiguous()
        self.rope = torch.from_numpy(rope).to(device)
        self.kv_cache = torch.zeros((num_blocks, config.page_size, config.head_dim), dtype=dt, device=device)
        self.graphs = mla_torch.BucketGraphs(config, self.kv_cache, buckets) if impl == "fa3" else None

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _kv(self, hidden, positions):
        L, R = self.shape.kv_lora_rank, self.shape.qk_rope_head_dim
        cos_sin = self.rope[positions]
        cos, sin = cos_sin[:, : R // 2], cos_sin[:, R // 2 :]
        kv = hidden @ self.w["kv_a_proj_with_mqa"]
        kv_c = _torch_rms_norm(kv[:, :L], self.w["kv_a_layernorm"], self.shape.rms_norm_eps)
        return kv_c, _torch_rope(kv[:, L:], cos, sin), (cos, sin)

    def _put(self, hidden, positions, slot_mapping):
        return (torch.from_numpy(np.ascontiguousarray(hidden)).to(device=self.device, dtype=self.dtype),
                torch.from_numpy(np.asarray(positions, np.int64)).to(self.device),
                torch.from_numpy(np.asarray(slot_mapping, np.int64)).to(self.device))

    @torch.inference_mode()
    def prefill(self, hidden: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray) -> None:
        h, pos, slots = self._put(hidden, positions, slot_mapping)
        kv_c, k_pe, _ = self._kv(h, pos)
        mla_torch.write_kv(self.kv_cache, kv_c, k_pe, slots, self.config)

    @torch.inference_mode()
    def pre_attention(self, h, pos, slots):
        """The cache write and the absorbed q `[T, H, 512 + 64]`."""
        s = self.shape
        kv_c, k_pe, (cos, sin) = self._kv(h, pos)
        mla_torch.write_kv(self.kv_cache, kv_c, k_pe, slots, self.config)
        q = _torch_rms_norm(h @ self.w["q_a_proj"], self.w["q_a_layernorm"], s.rms_norm_eps) @ self.w["q_b_proj"]
        q = q.view(-1, s.num_heads, s.qk_head_dim)
        q_pe = _torch_rope(q[..., s.qk_nope_head_dim:], cos, sin)
        q_latent = torch.bmm(q[..., : s.qk_nope_head_dim].transpose(0, 1), self.w["W_UK"]).transpose(0, 1)
        return torch.cat([q_latent, q_pe], dim=-1)

    @torch.inference_mode()
    def attention(self, q, metadata):
        if self.graphs is not None:
            return self.graphs(q, metadata)[0]
        return mla_torch.mla_decode(q, self.kv_cache, metadata, self.config, impl=self.impl)[0]

    @torch.inference_mode()
    def post_attention(self, out):
        """The decode's latent output through W_UV and o_proj."""
        o = torch.bmm(out.transpose(0, 1), self.w["W_UV"]).transpose(0, 1)
        return o.reshape(o.shape[0], -1) @ self.w["o_proj"]

    def step(self, hidden: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray, metadata):
        """One decode step on padded inputs. Returns (y [rows, hidden] float32 NumPy, attention s, rest s)."""
        h, pos, slots = self._put(hidden, positions, slot_mapping)
        self._sync()
        t0 = time.perf_counter()
        q = self.pre_attention(h, pos, slots)
        self._sync()
        t1 = time.perf_counter()
        out = self.attention(q, metadata)
        self._sync()
        t2 = time.perf_counter()
        y = self.post_attention(out)
        self._sync()
        t3 = time.perf_counter()
        return y.float().cpu().numpy(), t2 - t1, (t1 - t0) + (t3 - t2)

    def compiles(self) -> dict[str, int]:
        """CUDA graphs captured so far (FA3); nothing is compiled on the reference path."""
        return {} if self.graphs is None else {"cuda graphs": self.graphs.num_captured}


# ---------------------------------------------------------------------------------------------------------------------
# The float64 reference: no cache, no absorption
# ---------------------------------------------------------------------------------------------------------------------


def reference_layer(w64: dict, shape: LayerShape, hidden: torch.Tensor, q_len: int) -> torch.Tensor:
    """The layer's output `[q_len, hidden_size]` (float64) for the last q_len tokens of one request, from the hidden
    states of all its positions `hidden [S, hidden_size]` (positions 0..S-1), in float64 (`w64`: the weights as float64
    tensors, `init_weights`' names). Plain multi-head attention: per head K = [c_kv W_UK | k_pe] `[S, 192]`,
    V = c_kv W_UV `[S, 128]`, q = [q_nope | q_pe]; query i (position S - q_len + i) attends to positions <= its own."""
    s, H, N, L = shape, shape.num_heads, shape.qk_nope_head_dim, shape.kv_lora_rank
    S, dev = hidden.shape[0], hidden.device

    def rms_norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.rms_norm_eps) * weight

    cos, sin = (torch.from_numpy(a).to(dev) for a in rope_cos_sin(np.arange(S), s))

    def rope(x, cos, sin):  # interleaved pairs, x [n, ..., R]
        cos = cos.reshape(cos.shape[:1] + (1,) * (x.dim() - 2) + cos.shape[1:])
        sin = sin.reshape(cos.shape)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).reshape(x.shape)

    kv = hidden @ w64["kv_a_proj_with_mqa"]
    c_kv = rms_norm(kv[:, :L], w64["kv_a_layernorm"])
    k_pe = rope(kv[:, L:], cos, sin)  # [S, R], one rope key shared by the heads
    kv_b = (c_kv @ w64["kv_b_proj"]).view(S, H, N + s.v_head_dim)
    k = torch.cat([kv_b[..., :N], k_pe[:, None, :].expand(S, H, s.qk_rope_head_dim)], dim=-1)  # [S, H, 192]
    v = kv_b[..., N:]  # [S, H, 128]
    q = rms_norm(hidden[S - q_len:] @ w64["q_a_proj"], w64["q_a_layernorm"]) @ w64["q_b_proj"]
    q = q.view(q_len, H, s.qk_head_dim)
    q = torch.cat([q[..., :N], rope(q[..., N:], cos[S - q_len:], sin[S - q_len:])], dim=-1)
    scores = torch.einsum("qhd,shd->hqs", q, k) * s.softmax_scale
    q_pos = torch.arange(S - q_len, S, device=dev)
    scores = scores.masked_fill(torch.arange(S, device=dev)[None, None, :] > q_pos[None, :, None], float("-inf"))
    o = torch.einsum("hqs,shv->qhv", torch.softmax(scores, dim=-1), v)
    return o.reshape(q_len, H * s.v_head_dim) @ w64["o_proj"]


# ---------------------------------------------------------------------------------------------------------------------
# Requests, buckets and the loop
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """A request of the run: it joins at step `arrival` (its prompt's KV written by a prefill before that step's
    decode) and decodes `decode_steps` steps (MTP_Q_LEN tokens each), then finishes."""

    arrival: int
    prompt_len: int
    decode_steps: int

    @property
    def max_seq_len(self) -> int:
        return self.prompt_len + MTP_Q_LEN * self.decode_steps


def make_requests(steps: int, *, max_reqs: int, max_prompt_len: int, seed: int = 0) -> list[RequestSpec]:
    """Random traffic over `steps` steps: half of max_reqs requests at step 0, each decoding 1..steps steps; at each
    later step one more joins with probability 1/2 while fewer than max_reqs decode (always when none would)."""
    rng = np.random.default_rng(seed)
    specs, ends = [], []

    def add(step):
        spec = RequestSpec(step, int(rng.integers(1, max_prompt_len + 1)), int(rng.integers(1, steps + 1)))
        specs.append(spec)
        ends.append(step + spec.decode_steps)

    for _ in range(max(1, max_reqs // 2)):
        add(0)
    for step in range(1, steps):
        active = sum(e > step for e in ends)
        if active == 0 or (active < max_reqs and rng.random() < 0.5):
            add(step)
    return specs


def make_buckets(max_reqs: int, *, max_seq_len: int, page_size: int) -> list[Bucket]:
    """Buckets of 1, 2, 4, ... requests up to max_reqs (and max_reqs itself), MTP_Q_LEN token rows a request, every
    one with room for max_seq_len positions a request."""
    sizes = sorted({min(1 << i, max_reqs) for i in range(max_reqs.bit_length() + 1)})
    max_blocks = -(-max_seq_len // page_size)
    return [Bucket(num_reqs=r, num_tokens=MTP_Q_LEN * r, max_blocks=max_blocks, max_seq_len=max_seq_len,
                   max_query_len=MTP_Q_LEN) for r in sizes]


@dataclasses.dataclass
class _Request:
    spec: RequestSpec
    blocks: list
    seq_len: int
    hidden: torch.Tensor  # [seq_len, hidden_size] float32 (dtype-rounded values), on the reference's device


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One decode step: its bucket, its batch, the comparisons of the layer output `[tokens, hidden_size]` (jax and
    torch against the float64 reference, jax against torch) and the stacks' times in seconds."""

    step: int
    bucket: Bucket
    num_reqs: int
    num_tokens: int
    first_of_bucket: bool
    jax_vs_ref: Comparison
    torch_vs_ref: Comparison
    jax_vs_torch: Comparison
    jax_attention_s: float
    jax_rest_s: float
    torch_attention_s: float
    torch_rest_s: float

    @property
    def ok(self) -> bool:
        return self.jax_vs_ref.ok and self.torch_vs_ref.ok and self.jax_vs_torch.ok

    def line(self) -> str:
        b = self.bucket
        return (f"{self.step:4d}  {b.num_reqs:3d}/{b.num_tokens:<4d} {self.num_reqs:4d} {self.num_tokens:5d}  "
                f"{self.jax_vs_ref.rel_err:9.2e} {self.torch_vs_ref.rel_err:9.2e} {self.jax_vs_torch.rel_err:9.2e}  "
                f"{1e3 * self.jax_attention_s:9.3f} {1e3 * self.jax_rest_s:9.3f}  "
                f"{1e3 * self.torch_attention_s:9.3f} {1e3 * self.torch_rest_s:9.3f}"
                f"{'  (compiles)' if self.first_of_bucket else ''}{'' if self.ok else '  FAILED'}")


STEP_HEADER = (f"{'step':>4s}  {'bucket':8s} {'reqs':>4s} {'toks':>5s}  {'jax-f64':>9s} {'torch-f64':>9s} "
               f"{'jax-torch':>9s}  {'jax attn':>9s} {'rest ms':>9s}  {'torch attn':>9s} {'rest ms':>9s}")
"""The columns of `StepRecord.line`: relative errors of the layer output, milliseconds a part."""


@dataclasses.dataclass
class LoopResult:
    records: list[StepRecord]
    buckets_used: list[Bucket]
    jax_impl: str
    torch_impl: str
    jax_compiles: dict[str, int]
    torch_compiles: dict[str, int]
    tolerance: dict

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.records)

    def throughput(self, stack: str) -> dict:
        """Over the steps that compiled nothing: tokens/s and the mean attention and rest milliseconds a step."""
        warm = [r for r in self.records if not r.first_of_bucket]
        if not warm:
            return {"steps": 0}
        attn = sum(getattr(r, f"{stack}_attention_s") for r in warm)
        rest = sum(getattr(r, f"{stack}_rest_s") for r in warm)
        return {"steps": len(warm), "tokens_per_s": sum(r.num_tokens for r in warm) / (attn + rest),
                "attention_ms": 1e3 * attn / len(warm), "rest_ms": 1e3 * rest / len(warm),
                "attention_share": attn / (attn + rest)}

    def summary(self) -> str:
        lines = [f"buckets used: {len(self.buckets_used)}; compiles: jax {self.jax_compiles}"
                 + (f", torch {self.torch_compiles}" if self.torch_compiles else "")]
        worst = {k: max(getattr(r, k).rel_err for r in self.records) for k in ("jax_vs_ref", "torch_vs_ref",
                                                                             "jax_vs_torch")}
        lines.append("worst relative error of the layer output: "
                     + ", ".join(f"{k.replace('_vs_', ' vs ')} {v:.2e}" for k, v in worst.items())
                     + f" (tolerance {self.tolerance['out_rel']:.0e}); "
                     + ("all steps within tolerance" if self.ok else "SOME STEPS FAILED"))
        for stack, impl in (("jax", self.jax_impl), ("torch", self.torch_impl)):
            t = self.throughput(stack)
            if t["steps"] == 0:
                lines.append(f"{stack} {impl}: no step without a compile to time")
                continue
            lines.append(f"{stack} {impl}: {t['tokens_per_s']:.1f} tokens/s over {t['steps']} steps; a step "
                         f"{t['attention_ms'] + t['rest_ms']:.3f} ms = attention {t['attention_ms']:.3f} ms "
                         f"({100 * t['attention_share']:.0f}%) + rest {t['rest_ms']:.3f} ms")
        return "\n".join(lines)


def _resolve_impls(config: MLAConfig, impl_jax: str, impl_torch: str, device) -> tuple[str, str]:
    if impl_jax == "auto":
        impl_jax, _ = mla_jax.select_impl(config)
    if impl_torch == "auto":
        impl_torch, _ = mla_torch.select_impl(config, device)
    for impl, reason in ((impl_jax, mla_jax.unsupported_reason(impl_jax, config)),
                         (impl_torch, mla_torch.unsupported_reason(impl_torch, config, device))):
        if reason is not None:
            raise NotImplementedError(f"impl={impl!r} cannot run this layer: {reason}")
    return impl_jax, impl_torch


def _pad_rows(x: np.ndarray, rows: int, fill) -> np.ndarray:
    out = np.full((rows,) + x.shape[1:], fill, x.dtype)
    out[: x.shape[0]] = x
    return out


def run_decode_loop(shape: LayerShape, requests: Sequence[RequestSpec], *, steps: int, page_size: int = 16,
                    buckets: Sequence[Bucket] | None = None, dtype: str = "bfloat16", impl_jax: str = "xla",
                    impl_torch: str = "reference", seed: int = 0, device=None,
                    log: Callable[[str], None] | None = None) -> LoopResult:
    """Runs `steps` decode steps of the layer on both stacks and checks each against the float64 reference.

    Each step: requests past their decode_steps finish (their blocks go back to the allocator); requests arriving
    at the step get blocks for their prompt and one prefill writes the prompts' KV (token rows padded to a power of
    two, slot -1); every request then gets MTP_Q_LEN new tokens (blocks as needed), the batch is padded to the
    smallest bucket that fits (`buckets`: by default `make_buckets` up to the most requests decoding at once) with
    hidden rows 0, position 0 and slot -1 past its tokens, and both stacks run the step. Hidden states are random
    (seeded), rounded to `dtype`. Blocks are handed out in a random order from a free list; block 0 is never given
    out (it is the padding's block-table entry). `device`: the torch stack's (default: CUDA when present); JAX
    uses its default device. `log` gets the header and one line a step."""
    requests = sorted(requests, key=lambda r: r.arrival)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    config = shape.mla_config(page_size=page_size, dtype=dtype)
    max_seq_len = max(r.max_seq_len for r in requests)
    if buckets is None:
        most = max(sum(r.arrival <= k < r.arrival + r.decode_steps for r in requests) for k in range(steps))
        buckets = make_buckets(max(1, most), max_seq_len=max_seq_len, page_size=page_size)
    buckets = list(buckets)
    blocks_of = [-(-r.max_seq_len // page_size) for r in requests]
    num_blocks = 1 + max(sum(b for r, b in zip(requests, blocks_of) if r.arrival <= k < r.arrival + r.decode_steps)
                         for k in range(steps))
    impl_jax, impl_torch = _resolve_impls(config, impl_jax, impl_torch, device)

    weights = init_weights(shape, dtype=dtype, seed=seed)
    rope = rope_table(shape, max(b.max_seq_len for b in buckets))
    jax_layer = JaxLayer(shape, config, weights, rope, num_blocks, impl=impl_jax)
    torch_layer = TorchLayer(shape, config, weights, rope, num_blocks, impl=impl_torch, device=device,
                             buckets=buckets)
    w64 = {k: torch.from_numpy(v).to(device=device, dtype=torch.float64) for k, v in weights.items()}
    rng = np.random.default_rng(seed + 1)
    free = list(range(1, num_blocks))
    active: list[_Request] = []
    tol = TOLERANCES[dtype]
    records, seen = [], []
    pending = list(requests)
    if log:
        log(STEP_HEADER)

    def slots_for(req: _Request, start: int, stop: int) -> np.ndarray:
        while len(req.blocks) * page_size < stop:
            req.blocks.append(free.pop(int(rng.integers(len(free)))))
        pos = np.arange(start, stop)
        return np.asarray(req.blocks, np.int64)[pos // page_size] * page_size + pos % page_size

    def new_hidden(n: int) -> np.ndarray:
        return round_to(rng.standard_normal((n, shape.hidden_size), dtype=np.float32), dtype)

    for step in range(steps):
        for req in [r for r in active if step >= r.spec.arrival + r.spec.decode_steps]:
            active.remove(req)
            free.extend(req.blocks)
        arriving = [r for r in pending if r.arrival == step]
        pending = [r for r in pending if r.arrival != step]
        if arriving:  # the prefill: the prompts' KV into their slots
            hs, pos, slots = [], [], []
            for spec in arriving:
                req = _Request(spec, [], spec.prompt_len, None)
                h = new_hidden(spec.prompt_len)
                req.hidden = torch.from_numpy(h).to(device)
                hs.append(h)
                pos.append(np.arange(spec.prompt_len))
                slots.append(slots_for(req, 0, spec.prompt_len))
                active.append(req)
            n = sum(len(p) for p in pos)
            rows = max(16, 1 << (n - 1).bit_length())
            h, pos, slots = (_pad_rows(np.concatenate(x), rows, fill) for x, fill in ((hs, 0), (pos, 0), (slots, -1)))
            jax_layer.prefill(h, pos.astype(np.int32), slots.astype(np.int32))
            torch_layer.prefill(h, pos, slots)
        if not active:
            raise ValueError(f"no request decodes at step {step}: every request has finished or not yet arrived")

        hs, pos, slots = [], [], []
        for req in active:
            start = req.seq_len
            h = new_hidden(MTP_Q_LEN)
            hs.append(h)
            pos.append(np.arange(start, start + MTP_Q_LEN))
            slots.append(slots_for(req, start, start + MTP_Q_LEN))
            req.seq_len += MTP_Q_LEN
            req.hidden = torch.cat([req.hidden, torch.from_numpy(h).to(device)])
        md = build_decode_metadata(seq_lens=[r.seq_len for r in active], query_lens=[MTP_Q_LEN] * len(active),
                                   block_table=[r.blocks for r in active], config=config, num_blocks=num_blocks)
        bucket = smallest_bucket(buckets, md)
        padded = pad_to_bucket(md, bucket, config, num_blocks=num_blocks)
        T, rows = md.num_decode_tokens, bucket.num_tokens
        h, pos, slots = (_pad_rows(np.concatenate(x), rows, fill) for x, fill in ((hs, 0), (pos, 0), (slots, -1)))
        y_jax, jax_attn, jax_rest = jax_layer.step(h, pos.astype(np.int32), slots.astype(np.int32), padded)
        y_torch, torch_attn, torch_rest = torch_layer.step(h, pos, slots, padded)
        with torch.inference_mode():
            y_ref = torch.cat([reference_layer(w64, shape, r.hidden.double(), MTP_Q_LEN) for r in active])
        y_ref = y_ref.cpu().numpy()

        def cmp(a, b, name):
            return compare(a, b, name=name, rel_tol=tol["out_rel"], cos_tol=tol["out_cos"])

        first = bucket not in seen
        if first:
            seen.append(bucket)
        record = StepRecord(step, bucket, len(active), T, first, cmp(y_jax[:T], y_ref, "jax vs float64"),
                            cmp(y_torch[:T], y_ref, "torch vs float64"), cmp(y_jax[:T], y_torch[:T], "jax vs torch"),
                            jax_attn, jax_rest, torch_attn, torch_rest)
        records.append(record)
        if log:
            log(record.line())
    return LoopResult(records, seen, impl_jax, impl_torch, jax_layer.compiles(), torch_layer.compiles(), tol)


# ---------------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(
        prog="python -m examples.deepseek_decode",
        description="A DeepSeek-V3 MLA attention layer: prefill, then MTP decode steps through padded buckets on "
                    "the JAX and torch stacks, each step checked against a float64 attention without absorption. "
                    "Defaults are sized for the machine: real sizes on a GPU, small ones on a CPU.")
    p.add_argument("--heads", type=int, default=128 if gpu else 16, help="query heads (V3: 128, 16 with TP8)")
    p.add_argument("--steps", type=int, default=8, help="decode steps")
    p.add_argument("--impl-jax", default="auto", choices=("auto",) + mla_jax.IMPLS)
    p.add_argument("--impl-torch", default="auto", choices=("auto",) + mla_torch.IMPLS)
    p.add_argument("--hidden-size", type=int, default=7168 if gpu else 256, help="V3: 7168")
    p.add_argument("--max-reqs", type=int, default=32 if gpu else 4, help="requests decoding at once, at most")
    p.add_argument("--prompt-len", type=int, default=4096 if gpu else 48, help="longest prompt (drawn from 1..this)")
    p.add_argument("--page-size", type=int, default=64 if gpu else 16)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    shape = LayerShape(num_heads=args.heads, hidden_size=args.hidden_size)
    requests = make_requests(args.steps, max_reqs=args.max_reqs, max_prompt_len=args.prompt_len, seed=args.seed)
    print(f"DeepSeek-V3 attention: {args.heads} heads, hidden {args.hidden_size}, q_lora_rank {shape.q_lora_rank}, "
          f"kv_lora_rank {shape.kv_lora_rank}, rope {shape.qk_rope_head_dim}, softmax_scale {shape.softmax_scale:.6f} "
          f"(yarn); {len(requests)} requests over {args.steps} steps, q_len {MTP_Q_LEN}, page {args.page_size}, "
          f"{args.dtype}; jax on {jax.devices()[0].platform}, torch on {'cuda' if gpu else 'cpu'}")
    result = run_decode_loop(shape, requests, steps=args.steps, page_size=args.page_size, dtype=args.dtype,
                             impl_jax=args.impl_jax, impl_torch=args.impl_torch, seed=args.seed, log=print)
    print(f"jax impl={result.jax_impl}, torch impl={result.torch_impl}")
    print(result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""`write_kv`: the new tokens' latent rows written into the paged cache, in place (vLLM's
`concat_and_cache_mla`), `quantize_fp8`, the fp8 cache's quantization rule (`mla_spec.fp8`) in torch, and
`quantize_sparse_fp8`, the sparse decode's fp8_ds_mla layout (`mla_spec.fp8_sparse`) in torch.

No host synchronization and no data-dependent shapes: a call can be captured in a CUDA graph and replayed with new
contents in kv_c, k_pe, slot_mapping (and a k_scale tensor).
"""

from __future__ import annotations

import torch

from mla_spec import (
    FP8_E4M3_MAX,
    MLAConfig,
    validate_k_scale,
    validate_slot_mapping,
    validate_write_kv_arrays,
)
from mla_spec.fp8 import check_quantize_scale
from mla_spec.fp8_sparse import (
    BYTES_PER_TOKEN,
    MIN_SCALE_BEFORE_ROUNDING,
    NOPE_DIM,
    NUM_TILES,
    ROPE_DIM,
    ROPE_OFFSET,
    SCALES_OFFSET,
    TILE_SIZE,
)

_BITS_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
"""The integer dtype of each element size: the write moves bit patterns (NaN payloads and -0.0 included)."""


def _scale_tensor(k_scale, device) -> torch.Tensor:
    """k_scale as a 0-d float32 tensor on `device`: a device tensor as it is, a number (or a CPU tensor) by a fill
    on the device (a kernel, so also inside a CUDA graph capture; the value is then part of the graph)."""
    if isinstance(k_scale, torch.Tensor) and k_scale.device == torch.device(device):
        return k_scale.to(torch.float32)
    return torch.full((), float(k_scale), dtype=torch.float32, device=device)


def quantize_fp8(x: torch.Tensor, k_scale) -> torch.Tensor:
    """`x` (any float tensor) as float8_e4m3fn by `mla_spec.fp8`'s rule: `saturate(float32(x) / k_scale)` to
    [-448, 448], rounded to nearest even. k_scale: a float or a 0-d float tensor (on x's device for a CUDA graph).

    The divisor is a tensor on x's device: with a Python-number divisor CUDA computes `x * (1 / k_scale)`, which
    is not the rule (an ulp off on about a third of the values, enough to change some fp8 roundings). A k_scale
    given as a number is checked as the decode's is (ValueError naming it); a tensor's value is not read here (no
    device sync)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor (mla_spec.quantize_fp8 takes NumPy arrays), got x={type(x).__name__}")
    check_quantize_scale(k_scale)
    y = x.to(torch.float32) / _scale_tensor(k_scale, x.device)
    return y.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)  # clamp keeps NaN


def quantize_sparse_fp8(kv: torch.Tensor) -> torch.Tensor:
    """Cache rows `[..., 576]` (`[kv_c | k_pe]`, any float dtype, any device) -> `uint8 [..., 656]` in the fp8_ds_mla
    layout by FlashMLA's rule, byte for byte as `mla_spec.fp8_sparse.quantize_sparse_fp8` on finite input: the row
    rounded to bfloat16, per 128-value tile the scale `2 ** ceil(log2(max(amax / 448, 1e-4)))` (the exponent read
    exactly by frexp, not by a float log2), `float8_e4m3fn(x / scale)`, then the 4 float32 scales and the 64 bfloat16
    rope values. On the device: the bench and a serving loop quantize caches of gigabytes with it."""
    if not isinstance(kv, torch.Tensor) or not kv.is_floating_point() or kv.ndim < 1 or kv.shape[-1] != NOPE_DIM + ROPE_DIM:
        shown = f"shape={tuple(kv.shape)} dtype={kv.dtype}" if isinstance(kv, torch.Tensor) else f"type={type(kv).__name__}"
        raise ValueError(f"kv must be a float tensor [..., {NOPE_DIM + ROPE_DIM}] ([kv_c | k_pe] rows), got {shown}")
    lead = kv.shape[:-1]
    rows = kv.to(torch.bfloat16)
    tiles = rows[..., :NOPE_DIM].float().reshape(*lead, NUM_TILES, TILE_SIZE)
    s = torch.maximum(tiles.abs().amax(dim=-1) / FP8_E4M3_MAX,  # float32 division, as FlashMLA's; NaN kept
                      torch.tensor(MIN_SCALE_BEFORE_ROUNDING, device=kv.device))
    mant, exp = torch.frexp(s)  # s = mant * 2**exp: ceil(log2(s)) is exp, or exp - 1 where s is a power of two
    scale = torch.ldexp(torch.ones_like(s), torch.where(mant == 0.5, exp - 1, exp))
    scale = torch.where(torch.isfinite(s), scale, s)
    out = torch.empty(*lead, BYTES_PER_TOKEN, dtype=torch.uint8, device=kv.device)
    out[..., :SCALES_OFFSET] = (tiles / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).reshape(*lead, NOPE_DIM)
    out[..., SCALES_OFFSET:ROPE_OFFSET] = scale.contiguous().view(torch.uint8)
    out[..., ROPE_OFFSET:] = rows[..., NOPE_DIM:].contiguous().view(torch.uint8)
    return out


def write_kv(kv_cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor | None, slot_mapping: torch.Tensor,
             config: MLAConfig, *, k_scale=1.0, check_values: bool | None = None) -> torch.Tensor:
    """Writes row t, `[kv_c[t] | k_pe[t]]`, to cache slot `slot_mapping[t]` = block * page_size + offset, i.e.
    `kv_cache[block, offset]`, in place, and returns `kv_cache` (the same tensor). vLLM's `concat_and_cache_mla`.

    kv_cache: `[num_blocks, page_size, kv_lora_rank + qk_rope_head_dim]`, contiguous, of the config's cache dtype
        (config.dtype, or float8_e4m3fn with kv_cache_dtype="fp8_e4m3").
    kv_c, k_pe: `[T, kv_lora_rank]` and `[T, qk_rope_head_dim]` in config.dtype; or k_pe=None and kv_c the packed
        `[T, kv_lora_rank + qk_rope_head_dim]`.
    slot_mapping: `[T]` int32 or int64 on the cache's device; -1 skips the row (a padding token).
    k_scale: the fp8 cache's per-tensor scale (a float, or a 0-d float tensor on the cache's device, whose value
        is then not read or checked here), stored value = `mla_spec.fp8` rule of `x / k_scale`; 1.0 for other
        caches.
    check_values: read slot_mapping's values and refuse a slot outside [-1, num_blocks * page_size) or a slot
        written twice. Default: when slot_mapping is on the CPU (free to read). A GPU slot_mapping is not read
        (that would synchronize with the host and cannot be captured); its contract is the same, and a slot
        out of range there is a device-side indexing error, and a slot written twice holds, element by element,
        the value of one of its rows, which one unspecified (as in vLLM's kernel).

    Every slot not named in slot_mapping keeps its bits. How -1 rows are skipped without a host sync or a
    data-dependent shape: the write is one `index_copy_` of T rows on the flattened cache (as integer bits). A -1
    row is sent to the slot of the first row that writes one, carrying that row's new bits, so the two writes to
    that slot are the same bits and their order does not matter. When no row writes (all -1), every row carries
    slot 0's current bits back to slot 0, which is left as it was.
    """
    for name, x in (("kv_cache", kv_cache), ("kv_c", kv_c), ("k_pe", k_pe), ("slot_mapping", slot_mapping)):
        if name == "k_pe" and x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch tensor, got {name}={type(x).__name__}")
    validate_write_kv_arrays(config, kv_cache, kv_c, k_pe, slot_mapping)
    tensors = (kv_cache, kv_c, slot_mapping) + (() if k_pe is None else (k_pe,))
    devices = {x.device for x in tensors}
    if len(devices) != 1:
        raise ValueError(
            f"kv_cache, kv_c, k_pe and slot_mapping must be on one device, got devices={sorted(map(str, devices))}"
        )
    if kv_cache.is_meta:
        raise ValueError("kv_cache must hold data (a CPU or GPU tensor), got a tensor on device='meta'")
    if not kv_cache.is_contiguous():
        raise ValueError(f"kv_cache must be contiguous (it is written in place), got kv_cache.stride()={kv_cache.stride()}")
    device = kv_cache.device
    on_device = isinstance(k_scale, torch.Tensor) and k_scale.device.type != "cpu"
    validate_k_scale(k_scale, config, concrete=not on_device)
    if on_device and k_scale.device != device:
        raise ValueError(f"k_scale must be on the cache's device {str(device)!r}, got k_scale.device={str(k_scale.device)!r}")
    num_blocks, page_size, width = kv_cache.shape
    if check_values is None:
        check_values = slot_mapping.device.type == "cpu"
    if check_values:
        validate_slot_mapping(slot_mapping.cpu().numpy(), num_blocks * page_size)
    if kv_c.shape[0] == 0:
        return kv_cache
    rows = kv_c if k_pe is None else torch.cat([kv_c, k_pe], dim=-1)
    if config.is_fp8_kv_cache:
        rows = quantize_fp8(rows, k_scale)
    bits = _BITS_DTYPES[kv_cache.element_size()]
    flat = kv_cache.view(num_blocks * page_size, width).view(bits)
    new = rows.view(bits)
    slots = slot_mapping.to(torch.int64)
    valid = slots >= 0
    first = torch.argmax(valid.to(torch.int32)).reshape(1)  # the first row that writes (row 0 when none does)
    any_valid = valid.index_select(0, first)  # [1]
    fill_slot = torch.where(any_valid, slots.index_select(0, first), 0)
    fill_row = torch.where(any_valid[:, None], new.index_select(0, first), flat[:1])
    flat.index_copy_(0, torch.where(valid, slots, fill_slot), torch.where(valid[:, None], new, fill_row))
    return kv_cache

"""torch reference for paged MLA decode: runs on CPU and GPU tensors, float32 compute.

One request at a time, over exactly its `seq_len` valid slots (padding slots are
never read, so NaN there cannot leak). The math of a request depends on that request
alone, so the result is batch-invariant by construction (config.batch_invariant holds).
Padding requests (q_len 0) are skipped, and rows of no request get out 0, lse -inf.
An fp8 cache (kv_cache_dtype="fp8_e4m3", torch.float8_e4m3fn) is dequantized as
`fp8 value * k_scale` in float32.
"""

from __future__ import annotations

import torch

from mla_spec import MLAConfig


def mla_decode(q_nope, q_pe, kv_cache, query_start_loc, seq_lens, block_table, config: MLAConfig, *,
               k_scale: float = 1.0):
    """Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`.

    The metadata arguments are host-readable int tensors (they drive Python loops).
    k_scale (a float, already validated) scales the rows of an fp8 cache.
    """
    L, P = config.kv_lora_rank, config.page_size
    T, H = q_nope.shape[:2]
    device = q_nope.device
    # rows of no request (padding past query_start_loc[-1]) stay out 0, lse -inf
    out = torch.zeros((T, H, L), dtype=torch.float32, device=device)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float32, device=device)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    bt = block_table.to(device=device, dtype=torch.long)
    for r, seq_len in enumerate(lens):
        start, end = qsl[r], qsl[r + 1]
        q_len = end - start
        if q_len == 0:  # a padding request (seq_len 0)
            continue
        pos = torch.arange(seq_len, device=device)
        rows = kv_cache[bt[r, pos // P], pos % P].float()  # [S, L+R]
        if config.is_fp8_kv_cache:
            rows = rows * k_scale
        kv_c, k_pe = rows[:, :L], rows[:, L:]
        s = q_nope[start:end].float() @ kv_c.T + q_pe[start:end].float() @ k_pe.T  # [q_len, H, S]
        s = s * config.softmax_scale
        q_pos = seq_len - q_len + torch.arange(q_len, device=device)
        s = s.masked_fill(pos[None, None, :] > q_pos[:, None, None], float("-inf"))
        lse[start:end] = torch.logsumexp(s, dim=-1)
        out[start:end] = torch.softmax(s, dim=-1) @ kv_c
    return out.to(q_nope.dtype), lse

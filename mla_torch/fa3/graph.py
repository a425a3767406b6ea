"""`FA3DecodeGraph`: one FA3 decode captured in a full CUDA graph, replayed with other batches.

vLLM runs decode under FULL CUDA graphs: the kernel launches are captured once, for the
largest batch, and each step writes its batch into the same persistent buffers before a
replay. This helper does the same with the port's builder and Impl, so that graph
replays can be timed and checked against eager calls. FA3 bakes its grid, its schedule
layout and its split buffers into the graph, so everything they depend on is pinned at
construction (see the class docstring).
"""

from __future__ import annotations

import torch

from mla_spec import DecodeMetadata, MLAConfig
from mla_spec.config import check_config
from mla_torch.fa3.impl import FlashAttnMLAImpl, mask_padding
from mla_torch.fa3.metadata import FlashAttnMLAMetadata, FlashAttnMLAMetadataBuilder, cpu_int32
from mla_torch.fa3.providers import FA3Provider

__all__ = ["BucketGraphs", "FA3DecodeGraph"]


class FA3DecodeGraph:
    """One decode captured in a CUDA graph, vLLM's FULL cudagraph way, replayable with
    other batches.

    Persistent buffers sized for the largest batch: q `[max_num_tokens, H, L+R]`,
    query_start_loc `[max_num_reqs + 1]`, seq_lens `[max_num_reqs]`, block_table
    `[max_num_reqs, max_blocks_per_req]`, and the builder's scheduler-metadata buffer
    (full-cuda-graph mode). Each `load` validates a batch, writes it into the buffers
    padded to `max_num_reqs` requests as vLLM does (padding requests: q_len 0, seq_len 0,
    block row 0), and rebuilds FA3's schedule into the same buffer. Everything FA3 bakes
    into the graph, and everything the schedule's layout depends on, is pinned: batch
    size `max_num_reqs`, `max_query_len`, `max_seq_len`, the token count `max_num_tokens`
    (so `max_num_splits` is the config's bound) and the kv cache tensor itself.

        g = FA3DecodeGraph(config, kv_cache, max_num_reqs=8, max_num_tokens=32,
                           max_blocks_per_req=64, max_query_len=4)
        out, lse = g.capture(q, metadata)      # runs once eagerly (warm-up), then captures
        out, lse = g.replay(q2, metadata2)     # another batch, same buffers

    The returned `out [T, H, L]` / `lse [T, H]` are views of the graph's outputs: the next
    replay overwrites them.
    """

    def __init__(self, config: MLAConfig, kv_cache: torch.Tensor, *, max_num_reqs: int, max_num_tokens: int,
                 max_blocks_per_req: int, max_query_len: int = 1, max_seq_len: int | None = None,
                 fa3_provider: FA3Provider | None = None):
        check_config(config)
        for name, v in (("max_num_reqs", max_num_reqs), ("max_num_tokens", max_num_tokens),
                        ("max_blocks_per_req", max_blocks_per_req), ("max_query_len", max_query_len)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {name}={v!r}")
        if max_num_reqs > max(config.max_num_seqs, config.max_capture_size):
            raise ValueError(
                f"max_num_reqs={max_num_reqs} exceeds what the scheduler-metadata buffer is sized for: "
                f"max(max_num_seqs={config.max_num_seqs}, max_capture_size={config.max_capture_size})"
            )
        if max_num_tokens > config.max_capture_size:
            raise ValueError(
                f"max_num_tokens={max_num_tokens} exceeds max_capture_size={config.max_capture_size}: "
                "vLLM captures full graphs only up to the capture size"
            )
        if max_query_len > config.reorder_batch_threshold:
            raise ValueError(
                f"max_query_len={max_query_len} exceeds reorder_batch_threshold={config.reorder_batch_threshold}"
            )
        capacity = max_blocks_per_req * config.page_size
        if max_seq_len is None:
            max_seq_len = capacity
        if max_seq_len > capacity or max_seq_len < max_query_len:
            raise ValueError(
                f"max_seq_len must be in [max_query_len={max_query_len}, max_blocks_per_req * page_size={capacity}], "
                f"got max_seq_len={max_seq_len}"
            )
        if not isinstance(kv_cache, torch.Tensor):
            raise ValueError(f"kv_cache must be a torch.Tensor, got kv_cache={type(kv_cache).__name__}")
        if kv_cache.dim() != 3 or kv_cache.shape[1] != config.page_size or kv_cache.shape[2] != config.head_dim:
            raise ValueError(
                f"kv_cache must be [num_blocks, page_size={config.page_size}, {config.head_dim}], "
                f"got kv_cache.shape={tuple(kv_cache.shape)}"
            )
        self.config = config
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.max_blocks_per_req = max_blocks_per_req
        self.max_query_len = max_query_len
        self.max_seq_len = max_seq_len
        self.builder = FlashAttnMLAMetadataBuilder(config, self.device, use_full_cuda_graph=True,
                                                   fa3_provider=fa3_provider)
        extra = {} if fa3_provider is None else {"fa3_provider": fa3_provider}
        self.impl = FlashAttnMLAImpl.from_config(config, self.device, **extra)
        i32 = dict(dtype=torch.int32, device=self.device)
        self.q = torch.zeros((max_num_tokens, config.num_heads, config.head_dim), dtype=kv_cache.dtype,
                             device=self.device)
        self.query_start_loc = torch.zeros(max_num_reqs + 1, **i32)
        self.seq_lens = torch.zeros(max_num_reqs, **i32)
        self.block_table = torch.zeros((max_num_reqs, max_blocks_per_req), **i32)
        self.graph = None
        self._out = self._lse = None
        self._num_tokens = 0

    def load(self, q, metadata: DecodeMetadata) -> FlashAttnMLAMetadata:
        """Writes one batch into the persistent buffers and rebuilds FA3's schedule."""
        qsl = cpu_int32("query_start_loc", metadata.query_start_loc)
        seq_lens = cpu_int32("seq_lens", metadata.seq_lens)
        bt = cpu_int32("block_table", metadata.block_table)
        host = metadata.replace(query_start_loc=qsl.numpy(), seq_lens=seq_lens.numpy(), block_table=bt.numpy())
        host.validate(self.config, num_blocks=int(self.kv_cache.shape[0]))
        R, T = int(seq_lens.shape[0]), int(metadata.num_decode_tokens)
        max_q = int((qsl[1:] - qsl[:-1]).max())
        max_s = int(seq_lens.max())
        need_blocks = -(-max_s // self.config.page_size)
        for name, value, bound in (("num_reqs", R, self.max_num_reqs), ("num_decode_tokens", T, self.max_num_tokens),
                                   ("max query len", max_q, self.max_query_len),
                                   ("max seq len", max_s, self.max_seq_len),
                                   ("blocks per request", need_blocks, self.max_blocks_per_req)):
            if value > bound:
                raise ValueError(f"batch does not fit the graph: {name}={value} > {bound}")
        H, L, rope = self.config.num_heads, self.config.kv_lora_rank, self.config.qk_rope_head_dim
        parts = (("q_nope", q[0], L), ("q_pe", q[1], rope)) if isinstance(q, tuple) else (("q", q, L + rope),)
        for name, x, width in parts:
            if tuple(x.shape) != (T, H, width) or x.dtype != self.q.dtype:
                raise ValueError(
                    f"{name} must be [{T}, {H}, {width}] {self.q.dtype}, got {name}.shape={tuple(x.shape)}, "
                    f"{name}.dtype={x.dtype}"
                )
        if isinstance(q, tuple):
            self.q[:T, :, :L].copy_(q[0])
            self.q[:T, :, L:].copy_(q[1])
        else:
            self.q[:T].copy_(q)
        # vLLM's padding: extra requests have no query tokens and no KV (query_start_loc repeats the batch's token
        # count, which a padded bucket's metadata holds below num_decode_tokens)
        qsl_pad = torch.full((self.max_num_reqs + 1,), int(qsl[-1]), dtype=torch.int32)
        qsl_pad[: R + 1] = qsl
        seq_pad = torch.zeros(self.max_num_reqs, dtype=torch.int32)
        seq_pad[:R] = seq_lens
        bt_pad = torch.zeros((self.max_num_reqs, self.max_blocks_per_req), dtype=torch.int32)
        width = min(bt.shape[1], self.max_blocks_per_req)
        bt_pad[:R, :width] = bt[:, :width]  # columns past need_blocks are padding, never read
        self.query_start_loc.copy_(qsl_pad)
        self.seq_lens.copy_(seq_pad)
        self.block_table.copy_(bt_pad)
        self._num_tokens = T
        decode = self.builder._build_decode(
            block_table_tensor=self.block_table,
            seq_lens_device=self.seq_lens,
            max_seq_len=self.max_seq_len,
            query_start_loc_cpu=qsl_pad,
            query_start_loc_device=self.query_start_loc,
            num_decode_tokens=self.max_num_tokens,  # the padded size, as vLLM's graph batches
            max_query_len=self.max_query_len,
        )
        return FlashAttnMLAMetadata(num_reqs=self.max_num_reqs, num_actual_tokens=T, num_decodes=self.max_num_reqs,
                                    num_decode_tokens=T, decode=decode)

    def _forward(self, attn_metadata):
        """FA3 on the persistent buffers, then out 0 and lse -inf on the rows past the batch's tokens (a padded
        bucket's rows: FA3 writes none of them), read from the device's query_start_loc (captured with the rest)."""
        out, lse = self.impl._forward_decode(self.q, self.kv_cache, attn_metadata)
        return mask_padding(out, lse, self.query_start_loc)

    def run_eager(self, q, metadata: DecodeMetadata):
        """The same call without a graph (on the padded buffers). Returns copies."""
        attn_metadata = self.load(q, metadata)
        out, lse = self._forward(attn_metadata)
        T = self._num_tokens
        return out[:T].clone(), lse[:T].clone()

    def capture(self, q, metadata: DecodeMetadata):
        """Loads `metadata`, runs once eagerly (warm-up, on a side stream), captures,
        and replays once. Returns the replay's `(out, lse)` views."""
        attn_metadata = self.load(q, metadata)
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._forward(attn_metadata)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        # The warm-up consumed the schedule's semaphore; rebuild before capture.
        attn_metadata = self.load(q, metadata)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._out, self._lse = self._forward(attn_metadata)
        self.graph = graph
        self.load(q, metadata)
        graph.replay()
        return self._outputs()

    def replay(self, q, metadata: DecodeMetadata):
        """Loads another batch into the buffers and replays. Returns `(out, lse)` views."""
        if self.graph is None:
            raise RuntimeError("FA3DecodeGraph.replay before capture")
        self.load(q, metadata)
        self.graph.replay()
        return self._outputs()

    def _outputs(self):
        T = self._num_tokens
        return self._out[:T], (self._lse[:T] if self._lse is not None else None)


class BucketGraphs:
    """A serving loop's CUDA graphs: one `FA3DecodeGraph` a `mla_spec.Bucket`, captured at a bucket's first batch and
    replayed for every later batch that the bucket is the smallest to fit (`mla_spec.smallest_bucket`), as vLLM
    captures a full graph per capture size (`mla_spec.capture_size_buckets` gives its sizes as buckets).

        graphs = BucketGraphs(config, kv_cache, buckets)
        out, lse = graphs(q, metadata)   # exact or padded metadata; q has metadata.num_decode_tokens rows

    The results are views of the bucket graph's outputs (the next call of that bucket overwrites them); rows past
    the batch's tokens are out 0, lse -inf. Each graph pins its bucket's shapes and, with the builder in
    full-CUDA-graph mode, FA3's scheduler-metadata buffer and its split count (the config's
    max_num_splits_for_cuda_graph, for token counts up to 992)."""

    def __init__(self, config: MLAConfig, kv_cache: torch.Tensor, buckets, *, fa3_provider: FA3Provider | None = None):
        from mla_spec.metadata import check_buckets

        check_config(config)
        self.buckets = check_buckets(buckets)
        self.graphs = {
            b: FA3DecodeGraph(config, kv_cache, max_num_reqs=b.num_reqs, max_num_tokens=b.num_tokens,
                              max_blocks_per_req=b.max_blocks, max_query_len=b.max_query_len,
                              max_seq_len=min(b.max_seq_len, b.max_blocks * config.page_size),
                              fa3_provider=fa3_provider)
            for b in self.buckets
        }

    @property
    def num_captured(self) -> int:
        """Graphs captured so far (one a bucket used)."""
        return sum(g.graph is not None for g in self.graphs.values())

    def __call__(self, q, metadata: DecodeMetadata):
        from mla_spec import smallest_bucket

        graph = self.graphs[smallest_bucket(self.buckets, metadata)]
        if graph.graph is None:
            return graph.capture(q, metadata)
        return graph.replay(q, metadata)

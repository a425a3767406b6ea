"""python -m parity.fp8_tiles: which Triton tiles give the right answer for an fp8 KV cache,
compiled on this GPU (a diagnosis, not a test: `pallas_triton.fp8_gpu_reason` refuses the
tiles seen wrong, and this script calls the kernel below that guard).

For each scenario and tiling: the compiled kernel on the fp8 cache against the float64
reference on the dequantized cache, and the same tiling on a bf16 copy of the dequantized
cache (a control: is it the fp8 path or the tile?). Prints one line per case, and with
--json writes them all.
"""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_SCENARIOS = ("spec_decode_page_16", "heads_128_spec", "spec_decode", "heads_128", "decode_mixed_lengths")
# (block_h, block_q, num_warps, block_kv, num_stages)
DEFAULT_TILES = (
    (16, 1, 4, 64, 2), (16, 2, 4, 64, 3), (32, 1, 4, 64, 3),  # seen right
    (64, 1, 8, 64, 2), (16, 4, 8, 64, 2), (32, 2, 8, 64, 2),  # M = 64, 8 warps (seen wrong)
    (64, 1, 4, 64, 2), (16, 4, 4, 64, 2),  # M = 64, 4 warps
    (32, 1, 8, 64, 2), (16, 2, 8, 64, 2), (16, 1, 8, 64, 2),  # M <= 32, 8 warps
    (64, 1, 8, 32, 2), (64, 1, 8, 16, 1),  # M = 64, 8 warps, smaller KV steps
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.fp8_tiles", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS))
    p.add_argument("--json")
    p.add_argument("--tiles", type=int, default=0, help="only the first N tilings (0: all)")
    p.add_argument("--interpret", action="store_true", help="interpret mode (a CPU smoke run of this script)")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    import mla_jax
    from mla_jax import pallas_triton
    from mla_jax.pallas_triton import TritonConfig
    from mla_spec import reference
    from parity.compare import TOLERANCES, compare
    from parity.scenarios import SCENARIOS, make_fp8_batch

    if jax.default_backend() != "gpu" and not args.interpret:
        print(f"needs a GPU (JAX default backend {jax.default_backend()!r})", file=sys.stderr)
        return 2
    rows = []
    for name in [s for s in args.scenarios.split(",") if s]:
        batch, k_scale = make_fp8_batch(SCENARIOS[name], "bfloat16")
        deq = batch.kv_cache.astype(np.float64) * k_scale
        cfg16 = batch.config.replace(kv_cache_dtype="auto")
        ref_out, ref_lse = reference.mla_decode(batch.q, deq, batch.metadata, cfg16)
        md = mla_jax.to_jax_metadata(batch.metadata)
        q = jnp.asarray(batch.q, jnp.bfloat16)
        q_nope, q_pe = mla_jax.split_q(q, batch.config)
        kv8 = jnp.asarray(batch.kv_cache, jnp.float8_e4m3fn)
        # The control: the same values rounded to bf16 (no NaN), against its own reference.
        kv16_np = np.asarray(jnp.asarray(np.nan_to_num(deq), jnp.bfloat16).astype(jnp.float32), np.float64)
        kv16 = jnp.asarray(kv16_np, jnp.bfloat16)
        refs = {"fp8": (ref_out, ref_lse), "bf16": reference.mla_decode(batch.q, kv16_np, batch.metadata, cfg16)}
        tol = TOLERANCES["bfloat16"]
        for bh, bq, w, bkv, st in DEFAULT_TILES[: args.tiles or None]:
            if bh * bq < 16:
                continue
            tuning = TritonConfig(block_h=bh, block_q=bq, num_warps=w, block_kv=bkv, num_stages=st, num_splits=1)
            row = {"scenario": name, "block_h": bh, "block_q": bq, "rows": bh * bq, "num_warps": w,
                   "block_kv": bkv, "num_stages": st}
            for label, kv, cfg, ks in (("fp8", kv8, batch.config, k_scale), ("bf16", kv16, cfg16, 1.0)):
                try:
                    out, lse = pallas_triton._mla_decode(q_nope, q_pe, kv, jnp.float32(ks), md, cfg, tuning,
                                                           args.interpret)
                    out = np.asarray(out.astype(jnp.float32), np.float64)
                    lse = np.asarray(lse, np.float64)
                    r_out, r_lse = refs[label]
                    c_out = compare(out, r_out, name="out", rel_tol=2 * tol["out_rel"])
                    c_lse = compare(lse, r_lse, name="lse", abs_tol=2 * tol["lse_abs"])
                    row[label] = {"ok": bool(c_out.ok and c_lse.ok), "out_rel": c_out.rel_err,
                                  "lse_abs": c_lse.max_abs_err, "out_nan": int(np.isnan(out).sum()),
                                  "bad_rows": int((np.abs(out - r_out).max(-1) > 0.1 * np.abs(r_out).max()).sum())}
                except Exception as e:  # noqa: BLE001 (a diagnosis: report and go on)
                    row[label] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)

            def fmt(d):
                if "error" in d:
                    return "ERROR " + d["error"][:60]
                return (f"{'ok  ' if d['ok'] else 'FAIL'} out_rel {d['out_rel']:.1e} lse {d['lse_abs']:.1e} "
                        f"nan {d['out_nan']} bad_rows {d['bad_rows']}")

            print(f"{name:<22} h{bh:<3} q{bq} M{bh * bq:<3} w{w} kv{bkv:<3} st{st}  fp8: {fmt(row['fp8'])}  |  "
                  f"bf16: {fmt(row['bf16'])}", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"device": str(jax.devices()[0]), "jax": jax.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

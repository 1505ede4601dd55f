"""Side-by-side candidates for the dilated and block-sparse forwards, in one process on one GPU.

    python scripts/bench_kernels.py [--out DIR] [--quick]

First every Triton kernel configuration is checked against the float64 reference at small
shapes (bf16 and fp16, head dims 64 and 128, causal, several head groups, fewer key heads).
Then, bf16, B=1, H=8, D=64, forward:

- dense: SDPA cuDNN at 64K, the Triton dilated kernel run dense (one segment of 64K);
- dilated [2048, 4096] / [1, 2] at 1M: the SDPA path as it is, the same SDPA calls with no
  output assembled, SDPA writing only the rows outside the dilation as zeros (no full zero
  fill), that with the copies on a second stream, and the Triton kernel at several tiles;
- block-sparse at 5%, block 128, each pattern at 64K: FlexAttention with its default and a
  few kernel options, and the Triton kernel at several tiles.

Each timing is the median of CUDA-event samples of one synchronised call (the host's
dispatch included, as `attnbench` times), with the interquartile range and the sample count;
"gpu" is the mean of back-to-back calls. A table is printed last; every row also goes to
DIR/bench.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench import impls
from attnbench.impls import flash
from attnbench.impls.dilated import chunk_views
from attnbench.trials.reference import masked_reference, relative_error

ROWS: list[dict] = []


def timed(fn, min_samples=15, max_samples=60, target_s=0.6):
    """(median ms, q1, q3, n, back-to-back mean ms) of synchronised calls of fn."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:  # warm clocks
        fn()
    torch.cuda.synchronize()
    samples = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    while len(samples) < max_samples and (len(samples) < min_samples or time.perf_counter() - t0 < target_s):
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    reps = max(3, min(50, int(200 / max(statistics.median(samples), 0.01))))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    q = statistics.quantiles(samples, n=4)
    return statistics.median(samples), q[0], q[2], len(samples), start.elapsed_time(end) / reps


def record(section, name, flops, fn, **extra):
    try:
        med, q1, q3, n, gpu = timed(fn)
    except Exception as exc:  # a candidate that cannot run is reported, the others go on
        print(f"{section:10s} {name:44s} ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:150]}", flush=True)
        ROWS.append({"section": section, "name": name, "error": f"{type(exc).__name__}: {exc}"[:500], **extra})
        return None
    row = {
        "section": section,
        "name": name,
        "ms": med,
        "q1": q1,
        "q3": q3,
        "n": n,
        "gpu_ms": gpu,
        "tflops": flops / med / 1e9,
        "gpu_tflops": flops / gpu / 1e9,
        **extra,
    }
    ROWS.append(row)
    print(
        f"{section:10s} {name:44s} {med:9.3f} ms [{q1:.3f}-{q3:.3f}] n={n:3d} gpu {gpu:9.3f} ms "
        f"{row['tflops']:6.1f} TF/s (gpu {row['gpu_tflops']:6.1f})",
        flush=True,
    )
    return row


def qkv(n, heads=8, kv_heads=8, dim=64, dtype=torch.bfloat16, batch=1):
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(batch, n, heads, dim, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(batch, n, kv_heads, dim, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(batch, n, kv_heads, dim, device="cuda", dtype=dtype, generator=g)
    return q, k, v


# --- correctness -------------------------------------------------------------------------


def check_cases():
    for dtype in (torch.bfloat16, torch.float16):
        for dim in (64, 128):
            for causal in (False, True):
                yield "dilated", dtype, dim, causal, 8, 4, ([64, 128, 256], [1, 2, 4])
                yield "dilated", dtype, dim, causal, 6, 6, ([96, 192], [1, 2])
                for pattern in ("local_window", "dilated_sparse", "global_local", "hierarchical"):
                    yield "block-sparse", dtype, dim, causal, 2, 1, pattern


def check_inputs(kind, dtype, dim, causal, heads, kv_heads, what):
    """(impl, q, k, v, reference) of one check case."""
    if kind == "dilated":
        impl = impls.build("dilated", segment_lengths=what[0], dilation_rates=what[1])
        q, k, v = qkv(1536, heads, kv_heads, dim, dtype, batch=2)  # a multiple of every segment length
    else:
        impl = impls.build("block-sparse", pattern_type=what, block_size=128, sparsity_ratio=0.1)
        q, k, v = qkv(128 * 32, heads, kv_heads, dim, dtype, batch=1)
    rep, n = heads // kv_heads, q.shape[1]
    mask = impl.key_mask(n, heads, causal)
    return impl, q, k, v, masked_reference(q, k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2), mask)


def run_kernel(kind, impl, q, k, v, causal, tiles):
    if kind == "dilated":
        out = torch.full_like(q, float("nan"))  # poisoned: every row must be written
        for g in impl.groups(q.shape[2]):
            flash.dilated_group(q, k, v, out, g.heads, g.segment_length, g.dilation_rate, g.offset, causal, tiles)
        return out
    p = impl.pattern(q.shape[1], causal)
    return flash.block_sparse(q, k, v, p, 128, flash.block_lists(p, q.device), tiles)


def check_kernels(tile_list):
    """Every case with the first tiles; bf16 cases with the others too. One reference per case."""
    bad = 0
    for case in check_cases():
        kind, dtype, dim, causal, _, _, what = case
        impl, q, k, v, ref = check_inputs(*case)
        for i, tiles in enumerate(tile_list):
            if i and (dtype != torch.bfloat16 or (kind == "dilated" and what[0][0] == 96)):
                continue
            try:
                err, note = relative_error(run_kernel(kind, impl, q, k, v, causal, tiles), ref), ""
            except Exception as exc:
                err, note = float("nan"), f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            limit = 1e-2 if dtype == torch.bfloat16 else 2e-3
            ok = err == err and err <= limit
            bad += not ok
            if not ok or i == 0:
                verdict = "ok" if ok else "FAIL " + note
                print(
                    f"check {kind:12s} {str(what):28s} {str(dtype)[6:]:8s} D={dim} causal={causal:d} "
                    f"{tiles_name(tiles)}: {err:.2e} {verdict}",
                    flush=True,
                )
            ROWS.append(
                {
                    "section": "check",
                    "kind": kind,
                    "what": str(what),
                    "dtype": str(dtype),
                    "dim": dim,
                    "causal": causal,
                    "tiles": tiles_name(tiles),
                    "rel_err": err,
                    "ok": ok,
                    "note": note,
                }
            )
    print(f"checks: {bad} failed", flush=True)
    return bad


# --- dilated candidates -----------------------------------------------------------------------


def sdpa_no_output(q, k, v, impl, causal=False):
    for g in impl.groups(q.shape[2]):
        for qc, kc, vc in chunk_views((q, k, v), g, max(1, impl.max_chunk_tokens // g.segment_length)):
            F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal)


def zero_outside(out, g):
    """Zero the rows of group g's heads outside its dilation (views, no full fill)."""
    if g.dilation_rate == 1:
        return
    seg = out[:, :, g.heads].unflatten(1, (-1, g.segment_length))
    for residue in range(g.dilation_rate):
        if residue != g.offset:
            seg[:, :, residue :: g.dilation_rate].zero_()


def sdpa_lean(q, k, v, impl, causal=False):
    out = torch.empty_like(q)
    for g in impl.groups(q.shape[2]):
        zero_outside(out, g)
        for qc, kc, vc, oc in chunk_views((q, k, v, out), g, max(1, impl.max_chunk_tokens // g.segment_length)):
            oc.copy_(F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal))
    return out


def sdpa_overlap(q, k, v, impl, causal=False, chunk_tokens=1 << 17):
    """Copies of chunk i on a side stream while chunk i+1's SDPA runs."""
    out = torch.empty_like(q)
    main, side = torch.cuda.current_stream(), SIDE
    pending = []
    for g in impl.groups(q.shape[2]):
        zero_outside(out, g)
        for qc, kc, vc, oc in chunk_views((q, k, v, out), g, max(1, chunk_tokens // g.segment_length)):
            got = F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                oc.copy_(got)
            got.record_stream(side)
            pending.append(got)
            if len(pending) > 2:
                pending.pop(0)
    main.wait_stream(side)
    return out


def triton_dilated(q, k, v, impl, causal=False, tiles=None):
    out = torch.empty_like(q)
    for g in impl.groups(q.shape[2]):
        flash.dilated_group(q, k, v, out, g.heads, g.segment_length, g.dilation_rate, g.offset, causal, tiles)
    return out


def bench_dilated(tile_list, lengths):
    for n in lengths:
        dilated_at(n, tile_list if n == lengths[0] else tile_list[:2], first=n == lengths[0])
        torch.cuda.empty_cache()


def dilated_at(n, tile_list, first):
    impl = impls.build("dilated", segment_lengths=[2048, 4096], dilation_rates=[1, 2])
    impl_sdpa = impls.build("dilated", segment_lengths=[2048, 4096], dilation_rates=[1, 2], kernel="sdpa")
    q, k, v = qkv(n)
    flops = 4 * impl.useful_pairs(n, 8, False) * 64
    sec = f"dil-{n >> 20}M"
    with torch.no_grad():
        record(sec, "sdpa (as it is)", flops, lambda: impl_sdpa(q, k, v))
        if first:
            record(sec, "sdpa, no output assembled", flops, lambda: sdpa_no_output(q, k, v, impl))
            record(sec, "sdpa, zero only outside, copy", flops, lambda: sdpa_lean(q, k, v, impl))
            record(sec, "sdpa, copies on a 2nd stream", flops, lambda: sdpa_overlap(q, k, v, impl))
        for tiles in tile_list:
            record(sec, f"triton {tiles_name(tiles)}", flops, lambda t=tiles: triton_dilated(q, k, v, impl, tiles=t))
        # memory above q, k, v of the implementation as dispatched (the floor adds one output)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        impl(q, k, v)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    ROWS.append({"section": sec, "name": "peak over inputs", "extra_bytes": peak, "out_bytes": q.nbytes})
    print(f"{sec:10s} default ({impl.last_backend}) peak above q,k,v: {peak / q.nbytes:.4f} x one output", flush=True)


def tiles_name(t):
    return f"M{t.block_m} N{t.block_n} w{t.num_warps} s{t.num_stages}{' tma' if t.tma else ''}"


def bench_dense(tile_list):
    n = 1 << 16
    q, k, v = qkv(n)
    flops = 4 * n * n * 8 * 64
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    with torch.no_grad(), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        record("dense-64K", "sdpa cudnn", flops, lambda: F.scaled_dot_product_attention(qh, kh, vh))
    with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        record("dense-64K", "sdpa flash", flops, lambda: F.scaled_dot_product_attention(qh, kh, vh))
    dense = impls.build("dilated", segment_lengths=[n], dilation_rates=[1])
    for tiles in tile_list[:4]:
        record(
            "dense-64K", f"triton {tiles_name(tiles)}", flops, lambda t=tiles: triton_dilated(q, k, v, dense, tiles=t)
        )
    # cuDNN on the folded segments alone (2048 tokens, 512 x 8 batch-heads): the same work as 1M dilated
    seg = torch.randn(512, 8, 2048, 64, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad(), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        record(
            "dense-2K",
            "sdpa cudnn 512x8 of 2048",
            4 * 512 * 8 * 2048 * 2048 * 64,
            lambda: F.scaled_dot_product_attention(seg, seg, seg),
        )


def bench_block_sparse(tile_list, flex_options, lengths):
    for n in lengths:
        q, k, v = qkv(n)
        for pattern in ("local_window", "dilated_sparse", "global_local", "hierarchical"):
            first = n == lengths[0]
            block_sparse_at(q, k, v, pattern, tile_list if first else tile_list[:2], flex_options if first else [])
        del q, k, v
        torch.cuda.empty_cache()


def block_sparse_at(q, k, v, pattern, tile_list, flex_options):
    n = q.shape[1]
    impl = impls.build("block-sparse", pattern_type=pattern, sparsity_ratio=0.05, block_size=128)
    flops = 4 * impl.useful_pairs(n, 8, False) * 64
    sec = f"bs-{n >> 10}K"
    name = pattern[:10]
    with torch.no_grad():
        for options in flex_options:
            flex = impls.build(
                "block-sparse",
                pattern_type=pattern,
                sparsity_ratio=0.05,
                block_size=128,
                kernel="flex",
                kernel_options=options,
            )
            record(sec, f"{name} flex {options or 'default'}", flops, lambda f=flex: f(q, k, v))
        p = impl.pattern(n, False)
        lists = flash.block_lists(p, q.device)
        for tiles in tile_list:
            record(
                sec,
                f"{name} triton {tiles_name(tiles)}",
                flops,
                lambda t=tiles: flash.block_sparse(q, k, v, p, 128, lists, t),
            )
        record(sec, f"{name} auto (impl)", flops, lambda: impl(q, k, v))


SIDE = None


def main() -> None:
    global SIDE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--quick", action="store_true", help="fewer candidates")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: bench_kernels.py needs a CUDA GPU")
    SIDE = torch.cuda.Stream()
    import triton

    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    T = flash.Tiles
    tile_list = [
        T(128, 64, 4, 3),
        T(128, 128, 8, 3),
        T(128, 64, 8, 3),
        T(128, 128, 4, 3),
        T(128, 64, 4, 4),
        T(128, 128, 8, 2),
        T(64, 64, 4, 3),
        T(128, 64, 4, 3, True),
        T(128, 128, 8, 3, True),
    ]
    if args.quick:
        tile_list = tile_list[:3]
    t0 = time.time()
    failed = check_kernels([tile_list[0], tile_list[1], tile_list[7]])
    print(f"[{time.time() - t0:.0f}s] checks done", flush=True)
    bench_dense(tile_list)
    print(f"[{time.time() - t0:.0f}s] dense done", flush=True)
    bench_dilated(tile_list, [1 << 20, 1 << 22, 1 << 24])
    print(f"[{time.time() - t0:.0f}s] dilated done", flush=True)
    bs_tiles = [
        T(128, 64, 4, 3),
        T(128, 128, 8, 3),
        T(128, 64, 8, 3),
        T(128, 128, 4, 3),
        T(128, 64, 4, 4),
        T(64, 64, 4, 3),
    ]
    bench_block_sparse(bs_tiles, ["", "num_warps=8"], [1 << 16, 1 << 20])
    print(f"[{time.time() - t0:.0f}s] block-sparse done", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "bench.jsonl", "w") as f:
        for row in ROWS:
            f.write(json.dumps(row) + "\n")
    print("\n== summary (median ms, TFLOP/s useful) ==")
    for row in ROWS:
        if "ms" in row:
            print(
                f"{row['section']:10s} {row['name']:44s} {row['ms']:9.3f} {row['tflops']:6.1f}  gpu {row['gpu_ms']:9.3f}"
            )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

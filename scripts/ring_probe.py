"""Where a ring call's time goes, per rank: a benchmark (not a test) run under torchrun.

    torchrun --standalone --nproc-per-node P scripts/ring_probe.py --seq-lens 8192,16384,32768 [--calls 30] [--profile DIR]

``--host-costs`` instead times what one exchange is made of on the host (a batched send and
receive of 4 and of 2 tensors, an all-to-all, one flash call, one merge, one CUDA event), and
checks that one ring call captured in a CUDA graph replays to the eager call's output.

For each global length it times ``ring`` (and any ``--impl``) on its shard five ways:
  call     a barrier, then one call between CUDA events (how a trial times it), median
  stream   the calls back to back between two events after one barrier, per call
  graph    one call captured in a CUDA graph, replayed back to back (a trial's GPU time), median
  host     the host's time to issue one call (no synchronisation), median
  split    the ring's own compute / wait clock of the last call
and prints one line per (impl, length) from rank 0 with the slowest rank's value, then the
per-rank floor: one flash call of the shard's queries over every key of the sequence (graph),
and sdpa over the whole sequence on one GPU divided by the ranks. ``--plan steps|gather``
forces the dense ring's exchange plan (default: its own choice). With ``--profile DIR``
rank 0 and the last rank also write a profiler table of three graph replays at the first length.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from attnbench.impls import build_for_ranks


def slowest(x: float, dev) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def timed_call(fn) -> float:
    dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def stream_time(fn, reps: int = 30) -> float:
    dist.barrier()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def host_time(fn) -> float:
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    return ms


def captured(fn):
    """One call of ``fn`` in a CUDA graph (every rank captures before any replays)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def graph_time(fn, dev, reps: int = 20, samples: int = 5) -> float:
    """Median over samples of a graph of one call replayed ``reps`` times back to back, per call."""
    graph = captured(fn)
    times = []
    for _ in range(samples):
        dist.barrier()
        times.append(stream_time(graph.replay, reps))
    return slowest(statistics.median(times), dev)


def floors(seq, rank, world, dev, heads, head_dim) -> dict[str, float]:
    """The ranks' compute floor: the shard's queries over all keys in one call, and the whole
    sequence on one GPU over the ranks (graph times, ms; SDPA's own kernel choice, as sdpa's
    and the ring's default backend make it)."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    n = seq // world
    q = torch.randn(1, heads, n, head_dim, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(1, heads, seq, head_dim, device=dev, dtype=torch.bfloat16) for _ in range(2))
    qf = torch.randn(1, heads, seq, head_dim, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        one = graph_time(lambda: sdpa(q, k, v), dev)
        whole = graph_time(lambda: sdpa(qf, k, v), dev)
    return {"shard over all keys": one, "sdpa on one GPU / P": whole / world}


def probe(name, config, seq, rank, world, dev, heads, head_dim, causal, calls):
    impl = build_for_ranks(name, config, world)
    n = seq // world
    g = torch.Generator(device=dev).manual_seed(1 + rank)
    q, k, v = (torch.randn(1, n, heads, head_dim, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))

    def call():
        with torch.no_grad():
            impl(q, k, v, is_causal=causal)

    for _ in range(min(5, calls)):
        call()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    times = [timed_call(call) for _ in range(calls)]
    peak = torch.cuda.max_memory_allocated(dev) - base
    stream = stream_time(call, calls)
    host = [host_time(call) for _ in range(min(10, calls))]
    split = impl.last_breakdown() if hasattr(impl, "last_breakdown") else {}
    graph = graph_time(call, dev)  # after the split: a captured call's clock has no times
    shard_floor = 4 * n * heads * head_dim * 2  # q, k, v, output of the shard in bf16
    vals = {
        "call": slowest(statistics.median(times), dev),
        "stream": slowest(stream, dev),
        "graph": graph,
        "host": slowest(statistics.median(host), dev),
        "compute": slowest(float(split.get("compute_ms", 0.0)), dev),
        "wait": slowest(float(split.get("comm_wait_ms", 0.0)), dev),
        "peak/floor": slowest((peak + 3 * n * heads * head_dim * 2) / shard_floor, dev),
    }
    return vals, call


def host_costs(rank: int, world: int, dev, heads: int, head_dim: int, n: int = 8192) -> None:
    """Host microseconds of each piece of an exchange (slowest rank), and a graph replay's check."""
    from attnbench.impls.sequence_parallel.merge import merge_into

    aten = torch.ops.aten
    k, v, q = (torch.randn(1, n, heads, head_dim, device=dev, dtype=torch.bfloat16) for _ in range(3))
    kv, buf = torch.stack([k, v]), torch.empty(2 * k.numel(), device=dev, dtype=torch.bfloat16)
    dst, src = (rank + 1) % world, (rank - 1) % world
    splits_in, splits_out = [0] * world, [0] * world
    splits_in[dst], splits_out[src] = kv.numel(), kv.numel()
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    out, lse = aten._scaled_dot_product_flash_attention(qh, kh, vh, 0.0, False)[:2]
    acc, acc_lse = out.float(), lse.clone()

    def exchange(tensors):
        ops = [dist.P2POp(dist.isend, t, dst) for t in tensors]
        ops += [dist.P2POp(dist.irecv, buf[: t.numel()].view_as(t), src) for t in tensors]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    pieces = {
        "send+recv of k, v": lambda: exchange([k, v]),
        "send+recv of one kv": lambda: exchange([kv]),
        "all-to-all of one kv": lambda: dist.all_to_all_single(buf, kv.flatten(), splits_out, splits_in),
        "flash call": lambda: aten._scaled_dot_product_flash_attention(qh, kh, vh, 0.0, False),
        "merge": lambda: merge_into(acc, acc_lse, out, lse),
        "cuda event": lambda: torch.cuda.Event(enable_timing=True).record(),
    }
    for name, fn in pieces.items():
        us = slowest(statistics.median(host_time(fn) for _ in range(30)) * 1e3, dev)
        if rank == 0:
            print(f"{name:<24} {us:8.1f} us on the host", flush=True)
    impl = build_for_ranks("ring", {}, world)
    with torch.no_grad():
        eager = impl(q, k, v).clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            impl(q, k, v)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = impl(q, k, v)
        dist.barrier()
        graph.replay()
        torch.cuda.synchronize()
    worst = slowest((replayed.float() - eager.float()).abs().max().item(), dev)
    if rank == 0:
        print(f"graph replay of one ring call: largest difference from the eager call {worst:.3g}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-lens", default="8192,16384,32768")
    ap.add_argument("--impl", action="append", default=[])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--profile", default="")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--host-costs", action="store_true")
    ap.add_argument("--plan", choices=["auto", "steps", "gather"], default="auto")
    args = ap.parse_args()
    if args.plan != "auto":
        from attnbench.impls.sequence_parallel import ring

        ring.GATHER_BLOCK_FLOP = 0 if args.plan == "steps" else 1 << 60
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    if args.host_costs:
        host_costs(rank, world, dev, args.heads, args.head_dim)
        dist.destroy_process_group()
        return
    impls = args.impl or ["ring"]
    seqs = [int(s) for s in args.seq_lens.split(",")]
    if rank == 0:
        print(
            f"world {world} {torch.cuda.get_device_name(dev)} torch {torch.__version__} "
            f"causal={args.causal} plan={args.plan}"
        )
        print(
            f"{'impl':<34} {'N':>7} {'call':>7} {'stream':>7} {'graph':>7} {'host':>7} {'compute':>7} "
            f"{'wait':>7} {'mem/fl':>6}"
        )
    for spec in impls:
        name, _, rest = spec.partition(":")
        config = dict(kv.split("=") for kv in rest.split(",") if kv) if rest else {}
        for seq in seqs:
            vals, call = probe(name, config, seq, rank, world, dev, args.heads, args.head_dim, args.causal, args.calls)
            if rank == 0:
                print(
                    f"{spec:<34} {seq:>7} "
                    + " ".join(f"{vals[k]:>7.3f}" for k in ("call", "stream", "graph", "host", "compute", "wait"))
                    + f" {vals['peak/floor']:>6.2f}",
                    flush=True,
                )
            if args.profile and seq == seqs[0]:  # every rank runs the calls; the first and last write
                from torch.profiler import ProfilerActivity, profile

                graph = captured(call)
                dist.barrier()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        graph.replay()
                    torch.cuda.synchronize()
                if rank not in (0, world - 1):
                    dist.barrier()
                    continue
                os.makedirs(args.profile, exist_ok=True)
                tag = f"{name}-{seq}-w{world}-r{rank}"
                with open(os.path.join(args.profile, f"{tag}.txt"), "w") as f:
                    f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30))
                    f.write("\n")
                    f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
                prof.export_chrome_trace(os.path.join(args.profile, f"{tag}.json"))
            dist.barrier()
    if world > 1 and not args.causal:
        for seq in seqs:
            found = floors(seq, rank, world, dev, args.heads, args.head_dim)
            if rank == 0:
                print(f"floor N={seq}: " + ", ".join(f"{k} {ms:.3f} ms" for k, ms in found.items()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

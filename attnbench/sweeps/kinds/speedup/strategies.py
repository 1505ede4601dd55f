"""How a speedup run spreads one workload over GPUs: a small registry of strategies.

A strategy says how many processes to launch for P GPUs, which CUDA devices each rank
uses, which part of the global batch and sequence each rank holds, and how the module is
wrapped (plain, DataParallel, DistributedDataParallel). It never measures: one place does
that for every strategy (``attnbench.sweeps.kinds.speedup.job.measure``), so times, memory and
the output check mean the same thing in every row.

A new strategy (sequence-parallel ``ring``, say) is one ``register(Strategy(...))`` in any
module; the rank processes import that module by name before they look the strategy up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.trials.workload import Workload

MODULES = ("attention", "multihead")
# torch's built-in DDP gradient-compression hooks, by the dtype they send
GRAD_COMPRESSION = ("bf16", "fp16")


@dataclass(frozen=True)
class RankContext:
    """What one rank knows: the whole problem and its place in the world."""

    workload: Workload  # global batch and sequence length
    module: str  # attention | multihead
    grad_compression: str | None
    gpus: int  # GPUs of the run (processes on the CPU)
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    seed: int = 0

    @property
    def cuda(self) -> bool:
        return self.workload.device == "cuda"

    def device(self, index: int | None = None) -> torch.device:
        if not self.cuda:
            return torch.device("cpu")
        return torch.device("cuda", self.local_rank if index is None else index)


@dataclass
class Prepared:
    """A rank's share of the work, ready to run."""

    step: Callable[[], None]  # one timed iteration (forward, or forward + backward)
    output: Callable[[], torch.Tensor]  # this rank's output, (len(batch), tokens, ...) in global order
    batch: range  # global batch indices this rank's output holds
    tokens: slice = field(default_factory=lambda: slice(None))  # global tokens held (all unless sequence-parallel)
    grads: Callable[[], torch.Tensor | None] = lambda: None  # flat parameter gradients after one step
    backend: Callable[[], str | None] = lambda: None  # what the kernel really ran
    facts: dict[str, Any] = field(default_factory=dict)  # observed while running, for the notes


def _no_check(wl: Workload, gpus: int) -> None:
    return None


@dataclass(frozen=True)
class Strategy:
    name: str
    summary: str
    processes: Callable[[int], int]  # ranks to launch for P GPUs
    devices: Callable[[RankContext], list[int]]  # CUDA devices a rank uses (allocator peaks read there)
    prepare: Callable[[RankContext], Prepared]
    world_size: Callable[[int], int] = lambda gpus: gpus  # the GPUs a row of this strategy names
    check: Callable[[Workload, int], None] = _no_check  # bad input: raise AttnbenchError naming the fix
    skip: Callable[[str], str | None] = lambda device: None  # why it cannot run on this device type
    notes: Callable[[dict[str, Any]], list[str]] = lambda row: []  # what really happened, from the row
    min_gpus: int = 2  # GPUs it needs to mean anything (1: it runs on a one-GPU machine too)
    # whether its one process may also take GPU time: a CUDA graph or events on the caller's stream
    # see only work launched there, not what other threads launch (DataParallel's replicas, thread)
    gpu_timed: bool = True

    @property
    def module_name(self) -> str:
        """Where the rank processes find it."""
        return self.prepare.__module__


STRATEGIES: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    if strategy.name in STRATEGIES and STRATEGIES[strategy.name] is not strategy:
        raise ValueError(f"strategy {strategy.name!r} registered twice")
    STRATEGIES[strategy.name] = strategy
    return strategy


def get(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise AttnbenchError(
            f"unknown strategy {name!r}: choose from {', '.join(n for n in STRATEGIES if n != 'single')}"
        )
    return STRATEGIES[name]


# ---------------------------------------------------------------------------------------
# The module every strategy runs, and its inputs
# ---------------------------------------------------------------------------------------


class MultiheadSelfAttention(nn.Module):
    """q/k/v/out projections around a registered attention implementation: what a training
    step updates, so DistributedDataParallel has gradients to all-reduce."""

    def __init__(self, attention: nn.Module, heads: int, head_dim: int, compute_dtype: torch.dtype) -> None:
        super().__init__()
        embed = heads * head_dim
        self.attention, self.heads, self.head_dim, self.compute_dtype = attention, heads, head_dim, compute_dtype
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(embed, embed) for _ in range(4))

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        b, n, e = x.shape

        def heads(t):
            return t.view(b, n, self.heads, self.head_dim)

        # float32 parameters, 16-bit compute (mixed precision); entered here rather than by the
        # caller because DataParallel's replica threads would not inherit the autocast dtype
        with torch.autocast(x.device.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32):
            out = self.attention(
                heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)), is_causal=is_causal
            )
            return self.out_proj(out.reshape(b, n, e))


def build_model(ctx: RankContext, device: torch.device) -> tuple[nn.Module, Any]:
    """(module, attention impl): the same parameters on every rank and in every process."""
    wl = ctx.workload
    impl = impls.build(wl.impl, **wl.config)
    if ctx.module == "attention":
        return impl.to(device), impl
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed)
        model = MultiheadSelfAttention(impl, wl.heads, wl.head_dim, wl.torch_dtype)
    # parameters stay float32 (mixed precision runs under autocast), so gradient compression
    # to bf16 / fp16 really halves what the all-reduce sends
    return model.to(device), impl


def seeded_normal(shape: tuple[int, ...], batch: range, seed: int, stream: int, dtype, device) -> torch.Tensor:
    """Batch element b is drawn from its own generator, so any rank holding any subset of
    the batch gets exactly the values the single-GPU run used."""
    out = torch.empty((len(batch), *shape), dtype=dtype, device=device)
    for i, b in enumerate(batch):
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + stream * 10_007 + b)
        out[i].normal_(generator=gen)
    return out


def make_inputs(ctx: RankContext, batch: range, device: torch.device) -> tuple[torch.Tensor, ...]:
    wl = ctx.workload
    if ctx.module == "attention":
        shape = (wl.seq_len, wl.heads, wl.head_dim)
        tensors = tuple(seeded_normal(shape, batch, ctx.seed, s, wl.torch_dtype, device) for s in range(3))
        if wl.mode == "fwd_bwd":
            for t in tensors:
                t.requires_grad_(True)
        return tensors
    return (seeded_normal((wl.seq_len, wl.heads * wl.head_dim), batch, ctx.seed, 0, wl.torch_dtype, device),)


def output_shape(ctx: RankContext) -> tuple[int, ...]:
    wl = ctx.workload
    return (wl.seq_len, wl.heads, wl.head_dim) if ctx.module == "attention" else (wl.seq_len, wl.heads * wl.head_dim)


def plan_work(
    ctx: RankContext,
    model: nn.Module,
    plain: nn.Module,
    impl,
    inputs,
    batch: range,
    device: torch.device,
    tokens: slice = slice(None),
) -> Prepared:
    """The step, output and gradient closures of any strategy.

    ``model`` is what the step calls (possibly wrapped), ``plain`` what the output check
    calls. The backward uses a fixed upstream gradient scaled by 1/len(batch), so the
    gradient is that of a batch mean: averaged over data-parallel ranks it equals the
    single-GPU gradient of the whole batch.
    """
    wl = ctx.workload
    causal = wl.causal
    grad_out = None
    if wl.mode == "fwd_bwd":
        grad_out = seeded_normal(output_shape(ctx), batch, ctx.seed, 7, wl.torch_dtype, device) / len(batch)

    def forward(m):
        # keyword arguments make DataParallel pad a short batch's scatter with empty calls:
        # pass none when the default already says it
        return m(*inputs, is_causal=True) if causal else m(*inputs)

    def step() -> None:
        if grad_out is None:
            with torch.no_grad():
                forward(model)
            return
        for t in inputs:
            t.grad = None
        model.zero_grad(set_to_none=True)
        forward(model).backward(grad_out)

    def output() -> torch.Tensor:
        with torch.no_grad():
            return forward(plain)

    def grads() -> torch.Tensor | None:
        params = [p for p in plain.parameters()]
        if grad_out is None or not params:
            return None
        step()
        return torch.cat([p.grad.detach().float().flatten() for p in params])

    return Prepared(
        step=step, output=output, batch=batch, tokens=tokens, grads=grads, backend=lambda: impl.last_backend
    )


# ---------------------------------------------------------------------------------------
# single: the baseline on GPU 0
# ---------------------------------------------------------------------------------------


def _prepare_single(ctx: RankContext) -> Prepared:
    device = ctx.device(0)
    model, impl = build_model(ctx, device)
    batch = range(ctx.workload.batch)
    return plan_work(ctx, model, model, impl, make_inputs(ctx, batch, device), batch, device)


register(
    Strategy(
        name="single",
        summary="the implementation on GPU 0 (the baseline every speedup divides)",
        processes=lambda gpus: 1,
        devices=lambda ctx: [0] if ctx.cuda else [],
        prepare=_prepare_single,
        world_size=lambda gpus: 1,
        min_gpus=1,
    )
)


# ---------------------------------------------------------------------------------------
# thread: the single-GPU call, made from a new thread each time
# ---------------------------------------------------------------------------------------


def _prepare_thread(ctx: RankContext) -> Prepared:
    """``single``, but every call runs on a thread started for it, as DataParallel runs each
    replica's call (``parallel_apply`` starts its threads anew at every call). Its time over
    ``single``'s is what a new thread costs the kernel library, with no second GPU involved:
    the part of DataParallel's fixed cost per call that does not come from scatter and gather."""
    prepared = _prepare_single(ctx)
    inner = prepared.step

    def step() -> None:
        failed: list[BaseException] = []

        def call() -> None:
            try:
                inner()
            except BaseException as exc:  # an OOM on the thread is the trial's outcome
                failed.append(exc)

        worker = threading.Thread(target=call, name="attnbench-call")
        worker.start()
        worker.join()
        if failed:
            raise failed[0]

    prepared.step = step
    return prepared


register(
    Strategy(
        name="thread",
        summary="the single-GPU call made from a new thread each time, as DataParallel makes each replica's: "
        "what a new thread costs the kernel library",
        processes=lambda gpus: 1,
        devices=lambda ctx: [0] if ctx.cuda else [],
        prepare=_prepare_thread,
        world_size=lambda gpus: 1,
        notes=lambda row: ["every call on a new thread, one device"],
        min_gpus=1,
        gpu_timed=False,
    )
)


# ---------------------------------------------------------------------------------------
# dp: torch.nn.DataParallel, as the seeds used it
# ---------------------------------------------------------------------------------------


def _prepare_dp(ctx: RankContext) -> Prepared:
    device = ctx.device(0)
    model, impl = build_model(ctx, device)
    replicas: list[tuple[int, int]] = []
    # every replica calls the module's pre-hooks with its own chunk: record what each GPU got
    model.register_forward_pre_hook(
        lambda m, args: replicas.append((args[0].device.index, args[0].shape[0])) if args else None
    )
    dp = nn.DataParallel(model, device_ids=list(range(ctx.gpus)))
    batch = range(ctx.workload.batch)
    prepared = plan_work(ctx, dp, dp, impl, make_inputs(ctx, batch, device), batch, device)
    inner = prepared.step

    def step() -> None:
        replicas.clear()
        inner()
        prepared.facts["replica_batches"] = sorted(set(replicas))

    prepared.step = step
    prepared.backend = lambda: None  # each replica is a copy; the original module never runs
    return prepared


def _dp_notes(row: dict[str, Any]) -> list[str]:
    gpus, batch = row["world_size"], row["batch"]
    ran = row.get("replica_batches")
    if not ran:
        return []
    used = {d for d, _ in ran}
    notes = []
    if len(used) < gpus:
        idle = [g for g in row.get("gpus") or [] if g.get("index") not in used]
        what = "; ".join(f"GPU {g['index']} idle ({_idle_text(g)})" for g in idle) or ", ".join(
            f"GPU {i} idle" for i in range(gpus) if i not in used
        )
        notes.append(
            f"batch {batch} < {gpus} GPUs: DataParallel ran {len(used)} replica{'s' if len(used) > 1 else ''}; {what}"
            if batch < gpus
            else f"DataParallel ran {len(used)} of {gpus} replicas; {what}"
        )
    sizes = sorted({b for _, b in ran})
    if len(sizes) > 1:
        notes.append("uneven split: " + ", ".join(f"GPU {d} got {b}" for d, b in ran))
    return notes


def _idle_text(gpu: dict[str, Any]) -> str:
    from attnbench.units import format_bytes

    alloc = gpu.get("max_memory_allocated")
    bits = [f"allocator peak {format_bytes(alloc) if alloc else '0 B'}"]
    if gpu.get("nvml_used_peak") is not None:
        bits.append(f"NVML {gpu['nvml_used_peak'] / 2**30:.2f} GiB used at peak")
        if gpu.get("nvml_used_before") is not None:
            rise = gpu["nvml_used_peak"] - gpu["nvml_used_before"]
            bits.append(
                f"+{rise / 2**30:.2f} GiB during the run" + (" = CUDA context" if rise > 0 and not alloc else "")
            )
    return ", ".join(bits)


register(
    Strategy(
        name="dp",
        summary="torch.nn.DataParallel over the GPUs in one process: the batch is scattered from GPU 0, outputs gathered back",
        processes=lambda gpus: 1,
        devices=lambda ctx: list(range(ctx.gpus)),
        prepare=_prepare_dp,
        skip=lambda device: (
            None
            if device == "cuda"
            else "DataParallel splits a batch over CUDA GPUs; on the CPU it runs the module once, so there is nothing to compare"
        ),
        notes=_dp_notes,
        gpu_timed=False,
    )
)


# ---------------------------------------------------------------------------------------
# mp: one process per GPU under torchrun, the batch split across ranks
# ---------------------------------------------------------------------------------------


def _check_mp(wl: Workload, gpus: int) -> None:
    if wl.batch % gpus:
        raise AttnbenchError(
            f"mp splits the batch across {gpus} ranks (one per GPU): case {wl.seq_len}x{wl.batch} has batch {wl.batch}, not a multiple "
            f"of {gpus}; choose a batch that {gpus} divides (dp runs such a case, with a note)"
        )


def _prepare_mp(ctx: RankContext) -> Prepared:
    device = ctx.device()
    model, impl = build_model(ctx, device)
    share = ctx.workload.batch // ctx.world
    batch = range(ctx.rank * share, (ctx.rank + 1) * share)
    wrapped = model
    if ctx.module == "multihead" and ctx.workload.mode == "fwd_bwd" and ctx.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[device.index] if ctx.cuda else None)
        if ctx.grad_compression:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}
            wrapped.register_comm_hook(None, hook[ctx.grad_compression])
    return plan_work(ctx, wrapped, model, impl, make_inputs(ctx, batch, device), batch, device)


def _mp_notes(row: dict[str, Any]) -> list[str]:
    notes = [f"{row['batch'] // row['world_size']} per rank; time = slowest rank per iteration"]
    if row["mode"] == "fwd_bwd" and row.get("module") == "attention":
        notes.append("attention alone has no parameters: no gradient all-reduce, ranks run independently")
    if row["mode"] == "fwd_bwd" and row.get("module") == "multihead" and row["world_size"] > 1:
        notes.append(f"DistributedDataParallel, gradient all-reduce {row.get('grad_compression') or 'fp32'}")
    return notes


register(
    Strategy(
        name="mp",
        summary="multi-process data parallel: torchrun, one process per GPU, the batch split across ranks "
        "(multihead fwd_bwd: DistributedDataParallel)",
        processes=lambda gpus: gpus,
        devices=lambda ctx: [ctx.local_rank] if ctx.cuda else [],
        prepare=_prepare_mp,
        check=_check_mp,
        notes=_mp_notes,
    )
)

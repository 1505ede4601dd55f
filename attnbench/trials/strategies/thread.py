"""``thread``: the single-GPU call, made from a new thread each time."""

from __future__ import annotations

import threading

from attnbench.trials.strategies import Prepared, RankContext, Strategy, register
from attnbench.trials.strategies.single import prepare_single


def _prepare_thread(ctx: RankContext) -> Prepared:
    """``single``, but every call runs on a thread started for it, as DataParallel runs each
    replica's call (``parallel_apply`` starts its threads anew at every call). Its time over
    ``single``'s is what a new thread costs the kernel library, with no second GPU involved:
    the part of DataParallel's fixed cost per call that does not come from scatter and gather."""
    prepared = prepare_single(ctx)
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
        processes=lambda gpus: 1,
        devices=lambda ctx: [0] if ctx.cuda else [],
        prepare=_prepare_thread,
        world_size=lambda gpus: 1,
        notes=lambda row: ["every call on a new thread, one device"],
        min_gpus=1,
        gpu_timed=False,
    )
)

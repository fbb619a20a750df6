"""torchrun support: one process per rank, gloo on CPU / nccl on GPU, the global batch split by rows.

Every rank builds the same global batch (same seed), takes its rows, and scales its loss so that
DDP's gradient averaging gives exactly the single-process gradient of the global batch.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def shard(self, n: int) -> slice:
        """This rank's contiguous rows of a global batch of n rows."""
        per, extra = divmod(n, self.world_size)
        start = self.rank * per + min(self.rank, extra)
        return slice(start, start + per + (1 if self.rank < extra else 0))

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return value
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def init_distributed(want_cuda: bool = False) -> DistContext:
    """Start the process group when launched by torchrun (WORLD_SIZE > 1), else a 1-process context."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = want_cuda and torch.cuda.is_available()
    if world <= 1:
        return DistContext(device=torch.device("cuda") if cuda else torch.device("cpu"))
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    log.info("rank %d/%d on %s (%s)", rank, world, device, backend)
    return DistContext(rank=rank, world_size=world, device=device)


def shutdown(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()

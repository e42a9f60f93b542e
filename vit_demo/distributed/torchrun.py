"""Where this process sits in a torchrun job, for every command that shards work (the training,
the survey, the atlas): without torchrun, rank 0 of 1 and nothing to set up."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Dist:
    """Where this process sits in a torchrun job (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str = ""  # the process group's (nccl / gloo); none without torchrun

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> Dist:
    """Join the torchrun job if there is one (env:// rendezvous); nccl on CUDA, gloo otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), dist.get_backend())


def gather_objects(obj: Any, dist: Dist) -> list[Any] | None:
    """Every process's ``obj`` on process 0, in rank order (None elsewhere; [obj] without torchrun)."""
    if dist.world <= 1:
        return [obj]
    import torch.distributed as tdist

    parts: list[Any] = [None] * dist.world
    tdist.all_gather_object(parts, obj)
    return parts if dist.main else None


def share_objects(obj: Any, dist: Dist) -> list[Any]:
    """Every process's ``obj`` on every process, in rank order ([obj] without torchrun)."""
    if dist.world <= 1:
        return [obj]
    import torch.distributed as tdist

    parts: list[Any] = [None] * dist.world
    tdist.all_gather_object(parts, obj)
    return parts


def finish(dist: Dist) -> None:
    """Wait for every process, then leave the job (nothing without torchrun)."""
    if dist.world > 1:
        import torch.distributed as tdist

        tdist.barrier()
        tdist.destroy_process_group()

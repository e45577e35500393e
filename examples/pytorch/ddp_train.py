#!/usr/bin/env python3
"""A small model trained with DistributedDataParallel on the conflux backend.

    PYTHONPATH=build/python /usr/bin/python3 -m torch.distributed.run \\
        --redirects 1 --tee 1 --nproc_per_node=4 examples/pytorch/ddp_train.py \\
        [--backend gloo] [--steps 30]

torchrun starts the ranks and sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
init_process_group reads them (env://). Rank 0 prints the loss and the time
per step. (`--redirects 1 --tee 1`: Debian's torch 1.13 under Python 3.11
fails in torchrun's default "--redirects 0", see docs/troubleshooting.md.)
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_conflux  # noqa: F401 (registers the "conflux" backend)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="conflux", choices=["conflux", "gloo"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args()

    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # Ranks share the machine's cores.

    torch.manual_seed(0)  # Same start on every rank (DDP also broadcasts it).
    model = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    n_params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"backend {args.backend}, {size} ranks, {n_params} parameters "
              f"({n_params * 4 / 2**20:.1f} MiB of gradients per step)", flush=True)

    # A fixed random regression task; each rank draws its own batches.
    gen = torch.Generator().manual_seed(1000 + rank)
    target = torch.nn.Linear(64, 10)
    times = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 64, generator=gen)
        with torch.no_grad():
            y = target(x)
        start = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here.
        opt.step()
        times.append(time.perf_counter() - start)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}  {times[-1] * 1e3:7.2f} ms/step",
                  flush=True)
    if rank == 0:
        steady = sorted(times[len(times) // 5:])
        print(f"median {steady[len(steady) // 2] * 1e3:.2f} ms/step over the last "
              f"{len(steady)} steps ({args.backend}, {size} ranks)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

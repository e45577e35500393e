#!/usr/bin/env python3
"""conflux vs gloo through torch.distributed, interleaved in one run.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_bench.py [NPROCS] [ROUNDS]

Starts NPROCS ranks (default 2) on this machine. Each rank joins a "conflux"
world group and a Gloo group over the same ranks, then for ROUNDS rounds
(default 5) times, for each backend in turn: all_reduce of float32 at 4 KiB,
1 MiB and 64 MiB, and one DistributedDataParallel step of a 4.3 MiB-gradient
MLP. Rank 0 prints the median time per call of each backend and the ratio.
Interleaving the backends within a round keeps a change in machine load from
favouring one of them.
"""
import os
import socket
import statistics
import subprocess
import sys
import time

SIZES = [("4 KiB", 4 << 10), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]


def iters_for(nbytes):
    return 200 if nbytes <= 4 << 10 else 20 if nbytes <= 1 << 20 else 3


def worker(rounds):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_conflux  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("conflux")
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"conflux": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    results = {(name, label): [] for name in groups for label, _ in SIZES + [("DDP step", 0)]}

    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 10))
    ddps = {name: DDP(mlp(), process_group=g) for name, g in groups.items()}
    x, y = torch.randn(32, 64), torch.randn(32, 10)

    for _ in range(rounds):
        for label, nbytes in SIZES:
            t = torch.ones(nbytes // 4)
            for name, g in groups.items():
                dist.all_reduce(t, group=g)  # Warm up (connections, buffers).
                dist.barrier(group=g)
                n = iters_for(nbytes)
                start = time.perf_counter()
                for _ in range(n):
                    dist.all_reduce(t, group=g)
                results[(name, label)].append((time.perf_counter() - start) / n)
        for name, ddp in ddps.items():
            dist.barrier(group=groups[name])
            start = time.perf_counter()
            ddp.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            results[(name, "DDP step")].append(time.perf_counter() - start)

    if rank == 0:
        print(f"{size} ranks, {rounds} rounds, median per call (ms); load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end")
        print(f"{'operation':<22}{'conflux':>10}{'gloo':>10}{'gloo/conflux':>14}")
        for label, _ in SIZES + [("DDP step", 0)]:
            op = f"all_reduce {label}" if label != "DDP step" else label
            c = statistics.median(results[("conflux", label)]) * 1e3
            g = statistics.median(results[("gloo", label)]) * 1e3
            print(f"{op:<22}{c:>10.3f}{g:>10.3f}{g / c:>14.2f}")
    dist.destroy_process_group()


def main():
    nprocs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(nprocs):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(rounds)],
                                      env=env))
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]))
    else:
        main()

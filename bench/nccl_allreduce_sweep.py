"""NCCL's allreduce through torch.distributed, several ranks on GPU 0, as a
table like conflux-perf's (nccl-tests' columns): the NCCL side of
scripts/gpu_check.sh. Ranks sharing one GPU need NCCL_MULTI_RANK_GPU_ENABLE=1
(NCCL refuses duplicate GPUs otherwise; older NCCLs refuse anyway, and the
error is printed).

    python3 bench/nccl_allreduce_sweep.py --np 2 -b 8 -e 1G -f 4 -n 20 -w 5
"""
import argparse
import os
import socket
import sys


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def rank_main(rank, args, port):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.np)
    n = args.np
    size = args.min
    rows = []
    while size <= args.max:
        count = max(size // 4, 1)
        x = torch.ones(count, dtype=torch.float32, device="cuda")
        for _ in range(args.warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        for _ in range(args.iters):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1000.0 / args.iters
        algbw = count * 4 / us / 1e3
        rows.append((count * 4, count, us, algbw, algbw * 2 * (n - 1) / n))
        size *= args.factor
    if rank == 0:
        print(f"# NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {n} ranks on "
              f"{torch.cuda.get_device_name(0)}, allreduce float32 sum, out of place")
        print("#       size      count    time(us)  algbw(GB/s)  busbw(GB/s)")
        for r in rows:
            print(f"{r[0]:12d} {r[1]:10d} {r[2]:11.2f} {r[3]:12.2f} {r[4]:12.2f}")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=2)
    p.add_argument("-b", dest="min", type=parse_size, default=8)
    p.add_argument("-e", dest="max", type=parse_size, default=1 << 30)
    p.add_argument("-f", dest="factor", type=int, default=4)
    p.add_argument("-n", dest="iters", type=int, default=20)
    p.add_argument("-w", dest="warmup", type=int, default=5)
    args = p.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    mp.spawn(rank_main, args=(args, port), nprocs=args.np, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

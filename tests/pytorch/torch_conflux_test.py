#!/usr/bin/env python3
"""torch_conflux against Gloo: N processes, one case each run.

    torch_conflux_test.py CASE NPROCS [DEADLINE_S]

Starts NPROCS copies of itself as ranks (each with RANK, WORLD_SIZE, ...)
and waits for all of them under DEADLINE_S: a rank that hangs fails the run,
named, with every rank's output. Cases:

  ops       every operation and dtype on "conflux" against the same call
            on a Gloo group over the same inputs (exact for integers,
            allclose for floats); bad input raises a clear error
  ddp       20 DistributedDataParallel steps on conflux and on Gloo from the
            same start: the parameters match
  subgroup  new_group subgroups on conflux against Gloo
  killed    a rank dies (SIGKILL); the survivors' next collective raises an
            exception naming it within the group's timeout
  group_timeout
            each group keeps its own timeout: a subgroup made with a 3 s
            timeout, whose all_reduce the last rank never joins, raises on
            the others within seconds, naming that rank, while the world
            group (60 s) still works after it

Run it with /usr/bin/python3 (Debian's torch) and PYTHONPATH=<build>/python.
"""
import datetime
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

KILLED_RANK = 1
KILLED_TIMEOUT_S = 5
SUBGROUP_TIMEOUT_S = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# How often a run whose store lost its port is tried again (free_port's
# port is free when it is chosen; another process may bind it before rank
# 0's store does: "Address already in use").
PORT_TRIES = 3


def launch(case, nprocs, deadline_s):
    """Runs the ranks; returns the exit status of the test."""
    for attempt in range(PORT_TRIES):
        status, port_taken = launch_once(case, nprocs, deadline_s)
        if not port_taken:
            return status
        print(f"NOTE: the store's port was taken before rank 0 bound it (try {attempt + 1} "
              f"of {PORT_TRIES}); running the case again on another port", flush=True)
    return status


def store_lost_port(log):
    """Whether rank 0's output (@p log) says its store could not bind."""
    log.seek(0)
    out = log.read()
    log.seek(0, os.SEEK_END)
    return "failed to bind" in out and "Address already in use" in out


def launch_once(case, nprocs, deadline_s):
    """Runs the ranks once; returns the exit status of the test and whether
    rank 0's store could not bind its port (nothing of the case ran)."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="cfx_torch_")
    procs, logs = [], []
    for rank in range(nprocs):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nprocs),
                   LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), CFX_TORCH_TEST_DIR=tmp)
        log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", case],
                                      env=env, stdout=log, stderr=subprocess.STDOUT))
        logs.append(log)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        if procs[0].poll() is not None and procs[0].returncode != 0 and store_lost_port(logs[0]):
            for p in procs:  # The others wait for a store that never came.
                if p.poll() is None:
                    p.kill()
                    p.wait()
            break
        time.sleep(0.1)
    hung = [r for r, p in enumerate(procs) if p.poll() is None]
    for r in hung:
        procs[r].kill()
        procs[r].wait()
    ok = not hung
    port_taken = False
    for rank, (p, log) in enumerate(zip(procs, logs)):
        expected = -signal.SIGKILL if case == "killed" and rank == KILLED_RANK else 0
        log.seek(0)
        out = log.read()
        if rank == 0 and p.returncode != 0 and store_lost_port(log):
            port_taken = True
        status = "HUNG" if rank in hung else f"exit {p.returncode}"
        if rank not in hung and p.returncode != expected:
            ok = False
        print(f"---- rank {rank} ({status}, expected exit {expected}) ----\n{out}", flush=True)
    if hung:
        print(f"FAIL: rank(s) {hung} still running after the {deadline_s} s deadline "
              f"(case {case}); see their output above", flush=True)
    print(f"{'PASS' if ok else 'FAIL'}: case {case} on {nprocs} processes", flush=True)
    return (0 if ok else 1), port_taken and not ok


# ------------------------------------------------------------------ worker

def worker(case):
    import torch
    import torch.distributed as dist
    import torch_conflux  # noqa: F401 (registers "conflux")
    import warnings
    warnings.filterwarnings("ignore", message=".*(deprecated|private function).*")

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tmp = os.environ["CFX_TORCH_TEST_DIR"]
    # Each case starts through a different init_method.
    if case == "ddp":
        init = f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}"
    elif case == "subgroup":
        init = f"file://{tmp}/store"
    else:
        init = "env://"
    timeout = datetime.timedelta(seconds=KILLED_TIMEOUT_S if case == "killed" else 60)
    dist.init_process_group("conflux", init_method=init, rank=rank, world_size=size,
                            timeout=timeout)
    assert dist.get_backend() == "conflux", dist.get_backend()
    {"ops": case_ops, "ddp": case_ddp, "subgroup": case_subgroup,
     "killed": case_killed, "async": case_async,
     "group_timeout": case_group_timeout}[case](torch, dist, rank, size)
    # Every group goes now, in order, not at interpreter teardown (whose order
    # of destruction is undefined).
    dist.destroy_process_group()
    print(f"rank {rank}: case {case} passed", flush=True)


def tolerances(torch):
    return {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12),
            torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}


def same(torch, what, got, want):
    """Exact for integers, allclose for floats; raises naming `what`."""
    if isinstance(got, (list, tuple)):
        assert len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            same(torch, f"{what}[{i}]", g, w)
        return
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}"
    if got.is_floating_point():
        rtol, atol = tolerances(torch)[got.dtype]
        ok = torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol)
    else:
        ok = torch.equal(got, want)
    if not ok:
        raise AssertionError(f"{what}: conflux {got.flatten()[:8].tolist()} ... "
                             f"vs gloo {want.flatten()[:8].tolist()} ...")


def case_ops(torch, dist, rank, size):
    cfx = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
              torch.int8, torch.int32, torch.int64, torch.uint8]

    def data(dtype, n, seed, lo=None):
        """Rank-dependent input: small integers, or floats near 1 (products
        stay in range)."""
        g = torch.Generator().manual_seed(seed * 131 + rank)
        if dtype.is_floating_point:
            return (torch.rand(n, generator=g, dtype=torch.float64) + 0.5).to(dtype)
        return torch.randint(0, 4, (n,), generator=g).to(dtype)

    def on_gloo(fn, *tensors):
        """Runs fn on Gloo in the tensors' dtype, or in float64 cast back
        when Gloo lacks the dtype (bfloat16). Returns the tensors."""
        dtype = tensors[0].dtype
        try:
            fn(gloo, *tensors)
            return tensors
        except RuntimeError as e:
            if "ScalarType" not in str(e) and "type" not in str(e).lower():
                raise
        wide = [t.double() for t in tensors]
        fn(gloo, *wide)
        for t, w in zip(tensors, wide):
            t.copy_(w.to(dtype))
        return tensors

    def both(name, make, fn):
        """make() builds inputs (fresh each call); fn(group, *tensors) runs the
        op in place; compares conflux's tensors to Gloo's."""
        got = make()
        fn(cfx, *got)
        want = on_gloo(fn, *make())
        same(torch, name, list(got), list(want))

    seed = 0
    for dtype in dtypes:
        n = 1000 + 7 * (seed % 5)
        seed += 1
        s = seed
        mk = lambda dtype=dtype, n=n, s=s: [data(dtype, n, s)]  # noqa: E731
        for op_name in ("SUM", "PRODUCT", "MIN", "MAX"):
            op = getattr(dist.ReduceOp, op_name)
            both(f"all_reduce {dtype} {op_name}", mk,
                 lambda g, t, op=op: dist.all_reduce(t, op=op, group=g))
        if dtype.is_floating_point:
            # AVG: Gloo has none; compare with Gloo's SUM / size.
            got = mk()[0]
            dist.all_reduce(got, op=dist.ReduceOp.AVG, group=cfx)
            want = on_gloo(lambda g, t: dist.all_reduce(t, group=g), mk()[0].double())[0]
            same(torch, f"all_reduce {dtype} AVG", got, (want / size).to(dtype))
        both(f"all_reduce_coalesced {dtype}",
             lambda dtype=dtype, s=s: [data(dtype, 33, s), data(dtype, 5, s + 99)],
             lambda g, a, b: dist.all_reduce_coalesced([a, b], group=g))
        root = size - 1
        both(f"broadcast {dtype}", mk, lambda g, t: dist.broadcast(t, src=root, group=g))
        got, want = mk()[0], mk()[0]
        dist.reduce(got, dst=root, group=cfx)
        on_gloo(lambda g, t: dist.reduce(t, dst=root, group=g), want)
        if rank == root:
            same(torch, f"reduce {dtype}", got, want)

        # all_gather and _all_gather_base.
        def gather_all(g, t, *outs):
            dist.all_gather(list(outs), t, group=g)
        both(f"all_gather {dtype}",
             lambda dtype=dtype, n=n, s=s: [data(dtype, n, s)] +
             [torch.zeros(n, dtype=dtype) for _ in range(size)], gather_all)
        # _all_gather_base: Gloo has none; compare with Gloo's all_gather.
        got = torch.zeros(n * size, dtype=dtype)
        dist._all_gather_base(got, data(dtype, n, s), group=cfx)
        want = [torch.zeros(n, dtype=dtype) for _ in range(size)]
        on_gloo(gather_all, data(dtype, n, s), *want)
        same(torch, f"_all_gather_base {dtype}", got, torch.cat(want))

        # reduce_scatter: Gloo has none; compare with Gloo's all_reduce of the
        # whole input, this rank's chunk.
        chunk = 24
        whole = data(dtype, chunk * size, s)
        want = on_gloo(lambda g, t: dist.all_reduce(t, group=g), whole.clone())[0]
        want = want[rank * chunk:(rank + 1) * chunk]
        out = torch.zeros(chunk, dtype=dtype)
        dist.reduce_scatter(out, list(whole.clone().chunk(size)), group=cfx)
        same(torch, f"reduce_scatter {dtype}", out, want)
        out = torch.zeros(chunk, dtype=dtype)
        dist._reduce_scatter_base(out, whole.clone(), group=cfx)
        same(torch, f"_reduce_scatter_base {dtype}", out, want)

        # all_to_all_single with uneven splits: rank r sends f(r, j) rows to j.
        def f(r, j):
            return (r + j) % 3 + 1
        in_splits = [f(rank, j) for j in range(size)]
        out_splits = [f(j, rank) for j in range(size)]

        def a2a(g, out, t):
            dist.all_to_all_single(out, t, out_splits, in_splits, group=g)
        both(f"all_to_all_single {dtype}",
             lambda dtype=dtype, s=s: [torch.zeros(sum(out_splits), 3, dtype=dtype),
                                       data(dtype, sum(in_splits) * 3, s).view(-1, 3)], a2a)
        # all_to_all on lists: Gloo has only the single-tensor form.
        ins = [data(dtype, 4 + j, s + j) for j in range(size)]
        outs = [torch.zeros(4 + rank, dtype=dtype) for _ in range(size)]
        dist.all_to_all(outs, ins, group=cfx)
        cat_in = torch.cat(ins)
        cat_out = torch.zeros(size * (4 + rank), dtype=dtype)
        on_gloo(lambda g, o, t: dist.all_to_all_single(
            o, t, [4 + rank] * size, [4 + j for j in range(size)], group=g), cat_out, cat_in)
        same(torch, f"all_to_all {dtype}", outs, list(cat_out.split(4 + rank)))

        # gather to root, scatter from root.
        t = data(dtype, n, s)
        got = [torch.zeros(n, dtype=dtype) for _ in range(size)] if rank == 0 else None
        want = [torch.zeros(n, dtype=dtype) for _ in range(size)] if rank == 0 else None
        dist.gather(t, got, dst=0, group=cfx)
        on_gloo(lambda g, t, *w: dist.gather(t, list(w) if rank == 0 else None, dst=0,
                                             group=g), t, *(want or []))
        if rank == 0:
            same(torch, f"gather {dtype}", got, want)
        src_list = [data(dtype, n, s + j) for j in range(size)] if rank == root else None
        got = torch.zeros(n, dtype=dtype)
        dist.scatter(got, src_list, src=root, group=cfx)
        if rank == root:
            want = src_list[rank]
        else:
            g = torch.Generator().manual_seed((s + rank) * 131 + root)
            want = ((torch.rand(n, generator=g, dtype=torch.float64) + 0.5).to(dtype)
                    if dtype.is_floating_point else
                    torch.randint(0, 4, (n,), generator=g).to(dtype))
        same(torch, f"scatter {dtype}", got, want)

        # send/recv around a ring: even ranks send first.
        def ring(g, t, into):
            nxt, prv = (rank + 1) % size, (rank - 1) % size
            if rank % 2 == 0:
                dist.send(t, nxt, group=g)
                dist.recv(into, prv, group=g)
            else:
                dist.recv(into, prv, group=g)
                dist.send(t, nxt, group=g)
        both(f"send/recv {dtype}",
             lambda dtype=dtype, n=n, s=s: [data(dtype, n, s), torch.zeros(n, dtype=dtype)],
             ring)

    # PREMUL_SUM: Gloo has none; compare with Gloo's SUM times the factor.
    premul = dist._make_nccl_premul_sum(2.5)
    got = data(torch.float32, 64, 77)
    dist.all_reduce(got, op=premul, group=cfx)
    want = data(torch.float32, 64, 77)
    dist.all_reduce(want, group=gloo)
    same(torch, "all_reduce PREMUL_SUM", got, want * 2.5)

    # Non-contiguous tensors: a transposed view is reduced in place.
    base_c = data(torch.float32, 60, 5).view(6, 10)
    base_g = base_c.clone()
    view_c, view_g = base_c.t(), base_g.t()
    assert not view_c.is_contiguous()
    dist.all_reduce(view_c, group=cfx)
    dist.all_reduce(view_g, group=gloo)
    same(torch, "all_reduce of a transposed view", base_c, base_g)

    # Async work: complete, waitable, with a future holding the outputs.
    t = data(torch.float64, 16, 9)
    work = dist.all_reduce(t, async_op=True, group=cfx)
    assert work.wait()
    assert work.is_completed()
    fut = work.get_future().wait()
    assert torch.equal(fut[0], t), "future does not hold the reduced tensor"

    dist.barrier(group=cfx)

    # Clear errors for what Conflux does not do; nothing is sent, so the
    # group stays usable.
    def refuses(what, fn, words):
        try:
            fn()
        except RuntimeError as e:
            for w in words:
                assert w in str(e), f"{what}: error '{e}' lacks '{w}'"
            return
        raise AssertionError(f"{what}: no error")
    refuses("BAND", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32),
                                            op=dist.ReduceOp.BAND, group=cfx), ["bitwise"])
    refuses("int16", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16), group=cfx),
            ["not supported", "Short"])
    refuses("bool", lambda: dist.broadcast(torch.ones(4, dtype=torch.bool), src=0, group=cfx),
            ["not supported"])
    t = torch.full((8,), float(rank + 1))
    dist.all_reduce(t, group=cfx)
    assert t[0].item() == size * (size + 1) / 2, t


def case_ddp(torch, dist, rank, size):
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(backend="gloo")

    def model():
        torch.manual_seed(1234)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 4))
    ddp_c = DDP(model(), process_group=dist.group.WORLD)
    ddp_g = DDP(model(), process_group=gloo)
    start = [p.detach().clone() for p in ddp_c.parameters()]
    opt_c = torch.optim.SGD(ddp_c.parameters(), lr=0.05)
    opt_g = torch.optim.SGD(ddp_g.parameters(), lr=0.05)
    for step in range(20):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x = torch.randn(8, 16, generator=g)
        y = torch.randn(8, 4, generator=g)
        for ddp, opt in ((ddp_c, opt_c), (ddp_g, opt_g)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
    for i, (pc, pg, p0) in enumerate(zip(ddp_c.parameters(), ddp_g.parameters(), start)):
        assert not torch.equal(pc, p0), f"parameter {i} did not change"
        same(torch, f"DDP parameter {i} after 20 steps", pc.detach(), pg.detach())
    # And every rank holds the same parameters.
    flat = torch.cat([p.detach().flatten() for p in ddp_c.parameters()])
    everyone = [torch.zeros_like(flat) for _ in range(size)]
    dist.all_gather(everyone, flat)
    for r in range(size):
        assert torch.equal(everyone[r], flat), f"rank {r}'s parameters differ from rank {rank}'s"


def case_subgroup(torch, dist, rank, size):
    evens = list(range(0, size, 2))
    odds = list(range(1, size, 2))
    # Every rank creates every group, in the same order.
    sub_c = [dist.new_group(evens, backend="conflux"), dist.new_group(odds, backend="conflux")]
    sub_g = [dist.new_group(evens, backend="gloo"), dist.new_group(odds, backend="gloo")]
    mine = rank % 2
    members = (evens, odds)[mine]
    assert dist.get_world_size(sub_c[mine]) == len(members)
    for dtype in (torch.float32, torch.int64):
        t = (torch.arange(100) * (rank + 1)).to(dtype)
        got, want = t.clone(), t.clone()
        dist.all_reduce(got, group=sub_c[mine])
        dist.all_reduce(want, group=sub_g[mine])
        same(torch, f"subgroup {members} all_reduce {dtype}", got, want)
        want_direct = sum((torch.arange(100) * (r + 1)).to(dtype) for r in members)
        same(torch, f"subgroup {members} all_reduce {dtype} (direct)", got, want_direct)
        got, want = t.clone(), t.clone()
        dist.broadcast(got, src=members[-1], group=sub_c[mine])
        dist.broadcast(want, src=members[-1], group=sub_g[mine])
        same(torch, f"subgroup {members} broadcast {dtype}", got, want)
    # The world group still works after the subgroups.
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == size


def case_async(torch, dist, rank, size):
    """async_op=True returns at once and completes later, in queue order; the
    future carries the result; an error surfaces at wait()."""
    t = torch.full((1 << 16,), float(rank + 1))
    if rank != 0:
        time.sleep(1.0)  # Rank 0's call cannot finish before the others join.
    start = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    returned = time.monotonic() - start
    if rank == 0:
        assert returned < 0.5, f"all_reduce(async_op=True) took {returned:.2f} s to return"
        assert not work.is_completed(), "the work was complete before the peers joined"
    # Queued behind the first; the future's callback sees the result.
    u = torch.full((8,), float(rank))
    fut = dist.all_reduce(u, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    work.wait()
    assert work.is_completed()
    total = size * (size + 1) / 2
    assert t[0].item() == total and t[-1].item() == total, (t[0].item(), total)
    doubled = fut.wait()
    assert doubled[0].item() == 2 * sum(range(size)), doubled
    # Many in flight, waited in reverse order.
    works, tensors = [], []
    for i in range(20):
        x = torch.full((1000,), float(i + rank))
        tensors.append(x)
        works.append(dist.all_reduce(x, async_op=True))
    for w in reversed(works):
        w.wait()
    for i, x in enumerate(tensors):
        assert x[0].item() == size * i + sum(range(size)), (i, x[0].item())
    # A bad argument still throws at the call, before anything is queued.
    try:
        dist.all_reduce(torch.zeros(2, dtype=torch.bool), async_op=True)
        raise AssertionError("a bool tensor was accepted")
    except RuntimeError as e:
        assert "conflux" in str(e), e
    dist.barrier()


def case_killed(torch, dist, rank, size):
    t = torch.ones(1024)
    dist.all_reduce(t)
    assert t[0].item() == size
    if rank == KILLED_RANK:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        elapsed = time.monotonic() - start
        print(f"rank {rank}: raised after {elapsed:.1f} s: {e}", flush=True)
        assert f"rank {KILLED_RANK}" in str(e), f"the error does not name rank {KILLED_RANK}"
        assert elapsed < KILLED_TIMEOUT_S + 10, f"raised after {elapsed:.1f} s"
        os._exit(0)  # The group is broken; skip the interpreter's teardown.
    raise AssertionError(f"rank {rank}: all_reduce with rank {KILLED_RANK} dead did not raise")


def case_group_timeout(torch, dist, rank, size):
    sub = dist.new_group(ranks=list(range(size)),
                         timeout=datetime.timedelta(seconds=SUBGROUP_TIMEOUT_S))
    t = torch.ones(256)
    dist.all_reduce(t, group=sub)
    assert t[0].item() == size
    idle = size - 1  # never joins the subgroup's second all_reduce
    if rank != idle:
        start = time.monotonic()
        try:
            dist.all_reduce(t, group=sub)
            raise AssertionError(f"rank {rank}: the subgroup all_reduce without rank {idle} "
                                 "did not raise")
        except RuntimeError as e:
            elapsed = time.monotonic() - start
            print(f"rank {rank}: raised after {elapsed:.1f} s: {e}", flush=True)
            assert f"rank {idle}" in str(e), f"the error does not name rank {idle}"
            # The subgroup's own 3 s, not the world's 60 s (plus blame and slack).
            assert elapsed < SUBGROUP_TIMEOUT_S + 6, f"raised after {elapsed:.1f} s"
    else:
        time.sleep(SUBGROUP_TIMEOUT_S + 8)  # alive, elsewhere, past the others' raise
    w = torch.full((64,), float(rank + 1))
    dist.all_reduce(w)  # the world group is untouched
    assert w[0].item() == size * (size + 1) / 2, w[0].item()
    dist.barrier()
    # The broken subgroup is not destroyed in order: skip the teardown.
    print(f"rank {rank}: case group_timeout passed", flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--worker":
        try:
            worker(sys.argv[2])
        except BaseException:
            import traceback
            traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)
        sys.exit(0)
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        sys.exit(2)
    sys.exit(launch(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3
                    else 120.0))

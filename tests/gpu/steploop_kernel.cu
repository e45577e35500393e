/*
 * Every schedule and the step loop inside a kernel: one thread block per
 * rank, each running its rank's work descriptor through
 * cfx_steploop_progress over FIFOs in device memory: the code the CUDA
 * executor will launch, compiled by nvcc in every build that finds CUDA
 * (so device code that stops compiling fails the build here, not on a GPU
 * machine). Runs the ring, direct and tree allreduces, the chain broadcast
 * and the ring allgather on 4 ranks and checks the results; reports SKIP
 * (exit 77) where no GPU can run it. The same loop over every schedule,
 * 1 to 8 ranks, runs on the CPU in tests/test_steploop.c.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C++" {
#include "src/coll/steploop.h"
}

#define NRANKS     4
#define N_STEPS    4
#define SLOT_BYTES 1024
#define COUNT      10000
/* Polls without progress before a block gives up (a deadlock, not a hang). */
#define SPIN_LIMIT (1ull << 26)

struct rank_dev {
    struct cfx_work work;
    struct cfx_conn conns[CFX_OP_MAX_CONNS];
};

static __global__ void run_ranks(struct rank_dev *ranks, int *status)
{
    if (threadIdx.x != 0)
        return;
    struct rank_dev *me = &ranks[blockIdx.x];
    struct cfx_steploop loop;
    cfx_steploop_init(&loop, &me->work, me->conns);
    unsigned long long idle = 0;
    while (loop.status == CFX_STEPLOOP_RUNNING && idle < SPIN_LIMIT)
        idle = cfx_steploop_progress(&loop) ? 0 : idle + 1;
    status[blockIdx.x] = loop.status == CFX_STEPLOOP_RUNNING ? -(int)loop.step - 1 : loop.status;
}

static struct rank_dev host[NRANKS];
static void *blocks[NRANKS * NRANKS * 2];
static int n_blocks;

static int fifo_between(int a, int b, int8_t *ia, int8_t *ib)
{
    size_t bytes = cfx_fifo_slots_offset() + (size_t)N_STEPS * SLOT_BYTES;
    void *block;
    if (cudaMalloc(&block, bytes) != cudaSuccess || cudaMemset(block, 0, bytes) != cudaSuccess)
        return -1;
    blocks[n_blocks++] = block;
    struct cfx_fifo *fifo = (struct cfx_fifo *)block;
    char *slots = (char *)block + cfx_fifo_slots_offset();
    *ia = (int8_t)host[a].work.n_conns++;
    *ib = (int8_t)host[b].work.n_conns++;
    cfx_fifo_view(&host[a].conns[*ia], fifo, slots, SLOT_BYTES, N_STEPS);
    cfx_fifo_view(&host[b].conns[*ib], fifo, slots, SLOT_BYTES, N_STEPS);
    return 0;
}

/* One collective on NRANKS blocks; returns 0 when every rank's output is right. */
static int run_case(enum cfx_sched algo, enum cfx_coll_kind kind)
{
    int gather = kind == CFX_COLL_ALLGATHER;
    size_t out_count = gather ? (size_t)COUNT * NRANKS : COUNT;
    int32_t *in[NRANKS], *out[NRANKS];
    static int32_t h_in[COUNT], h_out[(size_t)COUNT * NRANKS];
    memset(host, 0, sizeof(host));
    n_blocks = 0;
    for (int r = 0; r < NRANKS; r++) {
        cudaMalloc(&in[r], COUNT * sizeof(int32_t));
        cudaMalloc(&out[r], out_count * sizeof(int32_t));
        for (int i = 0; i < COUNT; i++)
            h_in[i] = r * 1000 + i % 997;
        cudaMemcpy(in[r], h_in, sizeof(h_in), cudaMemcpyHostToDevice);
        struct cfx_work *w = &host[r].work;
        memset(&w->links, CFX_NO_CONN, sizeof(w->links));
        w->links.tree_root = r == 0;
        w->links.n_children = 0;
        w->links.relay_slots = 0;
        w->algo = (uint8_t)algo;
        w->kind = (uint8_t)kind;
        w->type = cfxInt32;
        w->redop = cfxSum;
        w->rank = r;
        w->nranks = NRANKS;
        w->root = kind == CFX_COLL_BROADCAST ? 0 : -1;
        w->elem_bytes = 4;
        w->count = COUNT;
        w->pitch = 0; /* Blocks side by side (cfx_work_finish). */
        w->sendbuff = in[r];
        w->recvbuff = out[r];
        w->check_prints = 1;
        w->print.seq = 1;
        w->print.count = COUNT;
        w->print.root = w->root;
        w->print.kind = (uint8_t)kind;
        w->print.type = cfxInt32;
        w->print.valid = 1;
        w->expect = w->print;
    }
    for (int a = 0; a < NRANKS; a++) {
        if (algo == CFX_SCHED_DIRECT_ALLREDUCE) {
            for (int b = 0; b < NRANKS; b++)
                if (a != b &&
                    fifo_between(a, b, &host[a].work.links.to[b], &host[b].work.links.from[a]) != 0)
                    return 1;
        } else if (algo == CFX_SCHED_TREE) {
            if (a == 0)
                continue; /* Binary tree rooted at 0. */
            int p = (a - 1) / 2, k = host[p].work.links.n_children++;
            if (fifo_between(a, p, &host[a].work.links.to_parent,
                             &host[p].work.links.from_child[k]) != 0 ||
                fifo_between(p, a, &host[p].work.links.to_child[k],
                             &host[a].work.links.from_parent) != 0)
                return 1;
        } else if (fifo_between(a, (a + 1) % NRANKS, &host[a].work.links.send,
                                &host[(a + 1) % NRANKS].work.links.recv) != 0) {
            return 1;
        }
    }
    for (int r = 0; r < NRANKS; r++)
        cfx_work_finish(&host[r].work, SLOT_BYTES);
    struct rank_dev *dev;
    int *status;
    cudaMalloc(&dev, sizeof(host));
    cudaMallocManaged(&status, NRANKS * sizeof(int));
    cudaMemcpy(dev, host, sizeof(host), cudaMemcpyHostToDevice);
    run_ranks<<<NRANKS, 32>>>(dev, status);
    cudaError_t err = cudaDeviceSynchronize();
    int failed = 0;
    if (err != cudaSuccess) {
        printf("FAIL: %s: kernel: %s\n", cfx_schedule_name(algo), cudaGetErrorString(err));
        return 1;
    }
    for (int r = 0; r < NRANKS; r++) {
        if (status[r] != CFX_STEPLOOP_DONE) {
            printf("FAIL: %s: rank %d ended with status %d\n", cfx_schedule_name(algo), r,
                   status[r]);
            failed = 1;
            continue;
        }
        cudaMemcpy(h_out, out[r], out_count * sizeof(int32_t), cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < out_count && !failed; i++) {
            int32_t want = 0;
            if (gather)
                want = (int32_t)(i / COUNT) * 1000 + (int32_t)(i % COUNT) % 997;
            else if (kind == CFX_COLL_BROADCAST)
                want = (int32_t)i % 997;
            else
                for (int q = 0; q < NRANKS; q++)
                    want += q * 1000 + (int32_t)i % 997;
            if (h_out[i] != want) {
                printf("FAIL: %s: rank %d element %zu is %d, not %d\n", cfx_schedule_name(algo), r,
                       i, h_out[i], want);
                failed = 1;
            }
        }
    }
    for (int i = 0; i < n_blocks; i++)
        cudaFree(blocks[i]);
    for (int r = 0; r < NRANKS; r++) {
        cudaFree(in[r]);
        cudaFree(out[r]);
    }
    cudaFree(dev);
    cudaFree(status);
    if (!failed)
        printf("PASS: %s on %d blocks\n", cfx_schedule_name(algo), NRANKS);
    return failed;
}

int main(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device: %s\n", err != cudaSuccess ? cudaGetErrorString(err) : "none");
        return 77;
    }
    int failed = 0;
    failed |= run_case(CFX_SCHED_RING_ALLREDUCE, CFX_COLL_ALLREDUCE);
    failed |= run_case(CFX_SCHED_DIRECT_ALLREDUCE, CFX_COLL_ALLREDUCE);
    failed |= run_case(CFX_SCHED_TREE, CFX_COLL_ALLREDUCE);
    failed |= run_case(CFX_SCHED_CHAIN_BROADCAST, CFX_COLL_BROADCAST);
    failed |= run_case(CFX_SCHED_RING_ALLGATHER, CFX_COLL_ALLGATHER);
    return failed;
}

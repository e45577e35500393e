/*
 * The MPI way to share the unique id: MPI_Init, rank 0 calls cfxGetUniqueId,
 * MPI_Bcast hands it to everyone. Built with MPI when CMake finds it
 * (CFX_PERF_HAVE_MPI); otherwise stubs, and mpirun users set CFX_COMM_ID.
 * MPI carries nothing else: timing and totals go through Conflux itself.
 */
#include <string.h>

#include "perf.h"

#if defined(CFX_PERF_HAVE_MPI) && CFX_PERF_HAVE_MPI
#include <mpi.h>

static int mpi_started;

int perf_mpi_available(void)
{
    return 1;
}

int perf_mpi_share_id(int *rank_p, int *nranks_p, cfxUniqueId *id_p)
{
    int rank = 0, nranks = 0;
    if (MPI_Init(NULL, NULL) != MPI_SUCCESS) {
        fprintf(stderr, "conflux-perf: MPI_Init failed\n");
        return -1;
    }
    mpi_started = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    cfxUniqueId id;
    memset(&id, 0, sizeof(id));
    int have_id = 1;
    if (rank == 0) {
        cfxResult_t res = cfxGetUniqueId(&id);
        if (res != cfxSuccess) {
            fprintf(stderr, "conflux-perf: rank 0: cfxGetUniqueId failed: %s: %s\n",
                    cfxGetErrorString(res), cfxGetLastError(NULL));
            have_id = 0;
        }
    }
    /* Everyone learns whether there is an id, so no rank waits for nothing. */
    MPI_Bcast(&have_id, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!have_id)
        return -1;
    MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    *rank_p = rank;
    *nranks_p = nranks;
    *id_p = id;
    return 0;
}

void perf_mpi_finish(int ok)
{
    if (!mpi_started)
        return;
    if (ok)
        MPI_Finalize();
    else
        MPI_Abort(MPI_COMM_WORLD, PERF_EXIT_FAILED);
}

#else /* built without MPI */

int perf_mpi_available(void)
{
    return 0;
}

int perf_mpi_share_id(int *rank_p, int *nranks_p, cfxUniqueId *id_p)
{
    (void)rank_p;
    (void)nranks_p;
    (void)id_p;
    fprintf(stderr, "conflux-perf: built without MPI\n");
    return -1;
}

void perf_mpi_finish(int ok)
{
    (void)ok;
}

#endif

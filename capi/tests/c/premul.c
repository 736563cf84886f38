/* Pre-multiplied sums (ncclRedOpCreatePreMulSum) on the emulator: every rank scales its input by
 * its own scalar before the sum. Values are chosen so that every product and sum is exact.
 *
 *   premul threads N   N ranks as threads: all-reduce (out of place and in place), reduce and
 *                      reduce-scatter with host-immediate and device scalars (a device scalar is
 *                      read by each call), bad uses refused, the communicator still usable
 */
#define _GNU_SOURCE
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define COUNT 1031
#define MAX_RANKS 8

static ncclUniqueId the_id;
static int nranks;

static int premul_rank(int rank) {
  int failures = 0, n = nranks;
  ncclComm_t comm = NULL;
  CALL(rank, ncclCommInitRank(&comm, n, the_id, rank));
  static __thread float fs[COUNT * MAX_RANKS], fr[COUNT * MAX_RANKS];
  static __thread int32_t is[COUNT * MAX_RANKS], ir[COUNT * MAX_RANKS];
  /* float, host-immediate scalar 0.5 * (rank + 1): sum = 0.5 * (i % 13) * n (n + 1) / 2 */
  float half_r = 0.5f * (float)(rank + 1);
  ncclRedOp_t fop;
  CALL(rank, ncclRedOpCreatePreMulSum(&fop, &half_r, ncclFloat, ncclScalarHostImmediate, comm));
  half_r = 1000; /* copied at creation: later changes do not count */
  for (long i = 0; i < COUNT; i++) fs[i] = (float)(i % 13), fr[i] = -1;
  CALL(rank, ncclAllReduce(fs, fr, COUNT, ncclFloat, fop, comm, NULL));
  EXPECT(rank, "premul all-reduce float", COUNT, fr[i], 0.25f * (float)(i % 13) * n * (n + 1));
  EXPECT(rank, "premul all-reduce leaves the input", COUNT, fs[i], (float)(i % 13));
  CALL(rank, ncclAllReduce(fs, fs, COUNT, ncclFloat, fop, comm, NULL));
  EXPECT(rank, "premul all-reduce float in place", COUNT, fs[i],
         0.25f * (float)(i % 13) * n * (n + 1));
  /* int32, device scalar (host memory on the emulator), read by every call */
  int32_t scale = rank + 2;
  ncclRedOp_t iop;
  CALL(rank, ncclRedOpCreatePreMulSum(&iop, &scale, ncclInt32, ncclScalarDevice, comm));
  if (iop == fop) FAIL(rank, "two live ops share the value %d", (int)iop);
  for (int round = 0; round < 2; round++) {
    scale = rank + 2 + 10 * round;
    int32_t sum_scale = 0;
    for (int r = 0; r < n; r++) sum_scale += r + 2 + 10 * round;
    for (long i = 0; i < COUNT * n; i++) is[i] = (int32_t)(i % 101) - 50, ir[i] = -1;
    CALL(rank, ncclReduceScatter(is, ir, COUNT, ncclInt32, iop, comm, NULL));
    EXPECT(rank, "premul reduce-scatter int32 (device scalar)", COUNT, ir[i],
           ((int32_t)((rank * COUNT + i) % 101) - 50) * sum_scale);
    int root = (round + 1) % n;
    for (long i = 0; i < COUNT; i++) ir[i] = -7;
    CALL(rank, ncclReduce(is, ir, COUNT, ncclInt32, iop, root, comm, NULL));
    if (rank == root)
      EXPECT(rank, "premul reduce int32 (root)", COUNT, ir[i], ((int32_t)(i % 101) - 50) * sum_scale);
    else
      EXPECT(rank, "premul reduce int32 (non-root untouched)", COUNT, ir[i], -7);
  }
  /* bad uses: each refused (a refused creation leaves *op alone), the communicator goes on */
  BAD(rank, ncclInvalidArgument, ncclAllReduce(is, ir, COUNT, ncclInt32, fop, comm, NULL));
  BAD(rank, ncclInvalidArgument, ncclRedOpCreatePreMulSum(&fop, NULL, ncclFloat, ncclScalarDevice, comm));
  BAD(rank, ncclInvalidArgument, ncclRedOpCreatePreMulSum(NULL, &scale, ncclInt32, ncclScalarDevice, comm));
  BAD(rank, ncclInvalidArgument,
      ncclRedOpCreatePreMulSum(&fop, &scale, ncclInt32, (ncclScalarResidence_t)5, comm));
  BAD(rank, ncclInvalidArgument, ncclRedOpDestroy(ncclSum, comm));
  CALL(rank, ncclRedOpDestroy(iop, comm));
  BAD(rank, ncclInvalidArgument, ncclRedOpDestroy(iop, comm));
  BAD(rank, ncclInvalidArgument, ncclAllReduce(is, ir, COUNT, ncclInt32, iop, comm, NULL));
  for (long i = 0; i < COUNT; i++) fs[i] = 1, fr[i] = -1;
  CALL(rank, ncclAllReduce(fs, fr, COUNT, ncclFloat, fop, comm, NULL));
  EXPECT(rank, "premul all-reduce after refused calls", COUNT, fr[i], 0.25f * n * (n + 1));
  CALL(rank, ncclRedOpDestroy(fop, comm));
  CALL(rank, ncclCommDestroy(comm));
  return failures;
}

int main(int argc, char** argv) {
  int started = start_program(argc, argv, "threads", MAX_RANKS, &nranks, &the_id);
  if (started) return started;
  if (strcmp(argv[1], "threads")) return 2;
  int failures = run_as_threads(nranks, premul_rank);
  printf("%s %s %d: %s (%d failed checks)\n", argv[0], argv[1], nranks, failures ? "FAIL" : "PASS",
         failures);
  return failures ? 1 : 0;
}

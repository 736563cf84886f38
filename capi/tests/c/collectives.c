/* NCCL programs against symcomm-nccl on the emulator (SYMCOMM_DEVICE=emu: buffers are host
 * memory, calls synchronous). Every check is bit-exact on predictable values; the program
 * prints one line per failed check and exits non-zero when any failed.
 *
 *   collectives procs N    N ranks as forked processes (ncclGetUniqueId in the parent)
 *   collectives threads N  N ranks as pthreads (ncclCommInitRank)
 *   collectives single N   one thread drives N ranks: init in a group, grouped all-reduce and
 *                          send/recv ring over every rank; then ncclCommInitAll likewise
 *   collectives commid N   as procs, but each process makes the id itself (NCCL_COMM_ID set)
 *   collectives hosts N    as procs, rank r on simulated host `capi-host-(r % 2)` (its
 *                          SYMCOMM_HOST_ID): a communicator across two hosts, UCX between them
 *   collectives errors N   bad arguments on N ranks as threads: each returns its documented
 *                          code, ncclGetLastError says why, the next call works
 */
#define _GNU_SOURCE
#include <nccl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* NCCL's layouts, as programs built against NVIDIA's header expect them (LP64). */
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
_Static_assert(offsetof(ncclConfig_t, magic) == 8, "config magic");
_Static_assert(offsetof(ncclConfig_t, version) == 12, "config version");
_Static_assert(offsetof(ncclConfig_t, blocking) == 16, "config blocking");
_Static_assert(offsetof(ncclConfig_t, netName) == 32, "config netName");
_Static_assert(offsetof(ncclConfig_t, splitShare) == 40, "config splitShare");
#ifdef SYMCOMM_NCCL_H_ /* our header; NVIDIA's newer ones have longer configs */
_Static_assert(sizeof(ncclConfig_t) == 48, "2.21's ncclConfig_t");
#endif
_Static_assert(sizeof(ncclResult_t) == sizeof(int) && sizeof(ncclDataType_t) == sizeof(int) &&
                   sizeof(ncclRedOp_t) == sizeof(int),
               "the enums are ints");
_Static_assert(NCCL_VERSION_CODE == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), "version");

/* The version the library reports: our header's, also when this is built against NVIDIA's. */
#define LIBRARY_VERSION 22105
#ifdef SYMCOMM_NCCL_H_
_Static_assert(NCCL_VERSION_CODE == LIBRARY_VERSION, "our header declares the library's version");
#endif

#define COUNT 1031 /* elements per rank: not a multiple of any vector width */
#define MAX_RANKS 8

static ncclUniqueId the_id;

/* Every collective and a send/recv ring on one rank. Returns the failed checks. */
static int run_rank(ncclComm_t comm) {
  int failures = 0, rank = -1, n = 0, dev = -1;
  CALL(rank, ncclCommUserRank(comm, &rank));
  CALL(rank, ncclCommCount(comm, &n));
  CALL(rank, ncclCommCuDevice(comm, &dev));
  if (dev != 0) FAIL(rank, "ncclCommCuDevice on the emulator: %d, expected 0", dev);
  const long C = COUNT;
  float* fs = malloc(sizeof(float) * C * n);
  float* fr = malloc(sizeof(float) * C * n);
  int32_t* is = malloc(sizeof(int32_t) * C * n);
  int32_t* ir = malloc(sizeof(int32_t) * C * n);
  int64_t* ls = malloc(sizeof(int64_t) * C);

  /* all-reduce, float sum, out of place */
  for (long i = 0; i < C; i++) fs[i] = (float)((rank + 1) * (i % 7)), fr[i] = -1;
  CALL(rank, ncclAllReduce(fs, fr, C, ncclFloat, ncclSum, comm, NULL));
  EXPECT(rank, "all-reduce float sum", C, fr[i], (float)((i % 7) * n * (n + 1) / 2));

  /* all-reduce, int32 sum, in place */
  for (long i = 0; i < C; i++) ir[i] = rank * 1000 + (int32_t)i;
  CALL(rank, ncclAllReduce(ir, ir, C, ncclInt32, ncclSum, comm, NULL));
  EXPECT(rank, "all-reduce int32 sum in place", C, ir[i],
         (int32_t)(1000 * n * (n - 1) / 2 + n * i));

  /* all-reduce, int32 max, out of place */
  for (long i = 0; i < C; i++) is[i] = rank * 3 + (int32_t)(i % 5), ir[i] = -1;
  CALL(rank, ncclAllReduce(is, ir, C, ncclInt32, ncclMax, comm, NULL));
  EXPECT(rank, "all-reduce int32 max", C, ir[i], (int32_t)((n - 1) * 3 + i % 5));

  /* broadcast from the last rank, float, out of place (non-roots pass no send buffer) */
  int root = n - 1;
  for (long i = 0; i < C; i++) fs[i] = (float)i * 0.5f, fr[i] = -1;
  CALL(rank, ncclBroadcast(rank == root ? fs : NULL, fr, C, ncclFloat, root, comm, NULL));
  EXPECT(rank, "broadcast float", C, fr[i], (float)i * 0.5f);

  /* ncclBcast in place from rank 0, int64 */
  for (long i = 0; i < C; i++) ls[i] = rank == 0 ? (int64_t)i * 1000003 : -7;
  CALL(rank, ncclBcast(ls, C, ncclInt64, 0, comm, NULL));
  EXPECT(rank, "bcast int64 in place", C, ls[i], (int64_t)i * 1000003);

  /* reduce to rank 1 % n, int32 sum: other ranks' receive buffers stay untouched */
  root = 1 % n;
  for (long i = 0; i < C; i++) is[i] = (rank + 1) * (int32_t)(i % 11), ir[i] = -5;
  CALL(rank, ncclReduce(is, ir, C, ncclInt32, ncclSum, root, comm, NULL));
  if (rank == root)
    EXPECT(rank, "reduce int32 sum (root)", C, ir[i], (int32_t)((i % 11) * n * (n + 1) / 2));
  else
    EXPECT(rank, "reduce int32 (non-root untouched)", C, ir[i], -5);

  /* all-gather, int32, out of place then in place */
  for (long i = 0; i < C; i++) is[i] = rank * 100000 + (int32_t)i;
  for (long i = 0; i < C * n; i++) ir[i] = -1;
  CALL(rank, ncclAllGather(is, ir, C, ncclInt32, comm, NULL));
  EXPECT(rank, "all-gather int32", C * n, ir[i], (int32_t)((i / C) * 100000 + i % C));
  for (long i = 0; i < C * n; i++) ir[i] = i / C == rank ? rank * 7 + (int32_t)(i % C) : -1;
  CALL(rank, ncclAllGather(ir + rank * C, ir, C, ncclInt32, comm, NULL));
  EXPECT(rank, "all-gather int32 in place", C * n, ir[i], (int32_t)((i / C) * 7 + i % C));

  /* reduce-scatter, float sum, out of place */
  for (long i = 0; i < C * n; i++) fs[i] = (float)((rank + 1) * (i / C + 1) + i % C % 3);
  for (long i = 0; i < C; i++) fr[i] = -1;
  CALL(rank, ncclReduceScatter(fs, fr, C, ncclFloat, ncclSum, comm, NULL));
  EXPECT(rank, "reduce-scatter float sum", C, fr[i],
         (float)((rank + 1) * n * (n + 1) / 2 + n * (i % 3)));

  /* all-to-all, int32 */
  for (long i = 0; i < C * n; i++) is[i] = rank * 1000000 + (int32_t)(i / C) * 1000 + (int32_t)(i % C % 1000);
  for (long i = 0; i < C * n; i++) ir[i] = -1;
  CALL(rank, ncclAlltoAll(is, ir, C, ncclInt32, comm, NULL));
  EXPECT(rank, "all-to-all int32", C * n, ir[i],
         (int32_t)((i / C) * 1000000 + rank * 1000 + i % C % 1000));

  /* a send/recv ring in a group: the receive is posted after the send, as NCCL allows */
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (long i = 0; i < C; i++) fs[i] = (float)(rank * 10 + i), fr[i] = -1;
  CALL(rank, ncclGroupStart());
  CALL(rank, ncclSend(fs, C, ncclFloat, next, comm, NULL));
  CALL(rank, ncclRecv(fr, C, ncclFloat, prev, comm, NULL));
  CALL(rank, ncclGroupEnd());
  EXPECT(rank, "send/recv ring", C, fr[i], (float)(prev * 10 + i));

  /* a pipeline: rank 0's data flows to the last rank in chunks. Chunk c leaves rank q at step
   * c + q, so at step k rank r receives chunk k - r + 1 from r - 1 and forwards chunk k - r to
   * r + 1, both in one group */
  {
    const long chunks = 4, chunk = C / chunks;
    for (long i = 0; i < C; i++) fr[i] = rank == 0 ? (float)(i * 3) : -1;
    for (long k = 0; k < chunks + n - 1; k++) {
      long in = k - rank + 1, out = k - rank;
      CALL(rank, ncclGroupStart());
      if (rank > 0 && in >= 0 && in < chunks)
        CALL(rank, ncclRecv(fr + in * chunk, chunk, ncclFloat, rank - 1, comm, NULL));
      if (rank < n - 1 && out >= 0 && out < chunks)
        CALL(rank, ncclSend(fr + out * chunk, chunk, ncclFloat, rank + 1, comm, NULL));
      CALL(rank, ncclGroupEnd());
    }
    EXPECT(rank, "send/recv pipeline", chunks * chunk, fr[i], (float)(i * 3));
  }

  /* nested groups mixing a collective and send/recv on one communicator: nothing runs before
   * the outermost ncclGroupEnd (on the emulator the results are in place right after it) */
  for (long i = 0; i < C; i++) is[i] = rank + (int32_t)i, ir[i] = -1, fr[i] = -1;
  CALL(rank, ncclGroupStart());
  CALL(rank, ncclGroupStart());
  CALL(rank, ncclRecv(fr, C, ncclFloat, next, comm, NULL));
  CALL(rank, ncclAllReduce(is, ir, C, ncclInt32, ncclSum, comm, NULL));
  CALL(rank, ncclSend(fs, C, ncclFloat, prev, comm, NULL));
  CALL(rank, ncclGroupEnd());
  EXPECT(rank, "nested group: nothing ran at the inner end", C, ir[i] + (int32_t)fr[i], -2);
  CALL(rank, ncclGroupEnd());
  EXPECT(rank, "nested group: all-reduce", C, ir[i], (int32_t)(n * (n - 1) / 2 + n * i));
  EXPECT(rank, "nested group: reverse ring", C, fr[i], (float)(next * 10 + i));

  ncclResult_t async = ncclInternalError;
  CALL(rank, ncclCommGetAsyncError(comm, &async));
  if (async != ncclSuccess) FAIL(rank, "async error %d: %s", (int)async, ncclGetLastError(comm));
  free(fs), free(fr), free(is), free(ir), free(ls);
  return failures;
}


/* An all-reduce that must work (after a bad call). */
static int works(ncclComm_t comm, int rank, int n, const char* after) {
  int failures = 0;
  int32_t buf[64];
  for (int i = 0; i < 64; i++) buf[i] = rank + i;
  CALL(rank, ncclAllReduce(buf, buf, 64, ncclInt32, ncclSum, comm, NULL));
  EXPECT(rank, after, 64, buf[i], (int32_t)(n * (n - 1) / 2 + n * i));
  return failures;
}

static int run_errors(ncclComm_t comm) {
  int failures = 0, rank = -1, n = 0;
  CALL(rank, ncclCommUserRank(comm, &rank));
  CALL(rank, ncclCommCount(comm, &n));
  float buf[16] = {0};
  BAD(rank, ncclInvalidArgument, ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, NULL, NULL));
  failures += works(comm, rank, n, "all-reduce after a NULL comm");
  BAD(rank, ncclInvalidArgument,
      ncclAllReduce(buf, buf, 16, (ncclDataType_t)99, ncclSum, comm, NULL));
  failures += works(comm, rank, n, "all-reduce after a bad datatype");
  BAD(rank, ncclInvalidArgument, ncclAllReduce(buf, buf, 16, ncclFloat, (ncclRedOp_t)42, comm, NULL));
  failures += works(comm, rank, n, "all-reduce after a bad op");
  BAD(rank, ncclInvalidArgument, ncclAllGather(buf, buf, SIZE_MAX / 2, ncclFloat, comm, NULL));
  failures += works(comm, rank, n, "all-reduce after a count overflow");
  BAD(rank, ncclInvalidArgument, ncclSend(buf, 16, ncclFloat, n, comm, NULL));
  BAD(rank, ncclInvalidArgument, ncclRecv(buf, 16, ncclFloat, -1, comm, NULL));
  failures += works(comm, rank, n, "all-reduce after a peer out of range");
  BAD(rank, ncclInvalidArgument, ncclBroadcast(buf, buf, 16, ncclFloat, n, comm, NULL));
  failures += works(comm, rank, n, "all-reduce after a root out of range");
  BAD(rank, ncclInvalidUsage, ncclGroupEnd());
  int version = 0;
  CALL(rank, ncclGetVersion(&version));
  if (version != LIBRARY_VERSION) FAIL(rank, "version %d, expected %d", version, LIBRARY_VERSION);
  BAD(rank, ncclInvalidArgument, ncclGetVersion(NULL));
  ncclComm_t child = NULL;
  BAD(rank, ncclInvalidArgument, ncclCommSplit(comm, -5, rank, &child, NULL));
  BAD(rank, ncclInvalidArgument, ncclCommSplit(comm, 0, rank, NULL, NULL));
  failures += works(comm, rank, n, "all-reduce after refused splits");
  BAD(rank, ncclInvalidUsage, ncclCommInitRankScalable(&child, n, rank, 1, &the_id, NULL));
  if (strstr(ncclGetLastError(NULL), "ncclCommInitRankScalable") == NULL)
    FAIL(rank, "the unimplemented call is not named: %s", ncclGetLastError(NULL));
  BAD(rank, ncclInvalidUsage, ncclCommInitRankScalable(&child, n, rank, 1, &the_id, NULL));
  failures += works(comm, rank, n, "all-reduce after unimplemented calls");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 7;
  ncclComm_t other = NULL;
  BAD(rank, ncclInvalidArgument, ncclCommInitRankConfig(&other, n, the_id, rank, &config));
  config.blocking = 0;
  config.magic = 0;
  BAD(rank, ncclInvalidArgument, ncclCommInitRankConfig(&other, n, the_id, rank, &config));
  ncclUniqueId junk;
  memset(&junk, 'j', sizeof junk);
  BAD(rank, ncclInvalidArgument, ncclCommInitRank(&other, n, junk, rank));
  BAD(rank, ncclInvalidArgument, ncclCommInitRank(&other, n, the_id, n));
  failures += works(comm, rank, n, "all-reduce after refused inits");
  return failures;
}

static int nranks;
static int (*body)(ncclComm_t);
static int own_id; /* each rank makes the id itself (NCCL_COMM_ID) */
static int two_hosts; /* rank r on simulated host capi-host-(r % 2) */

static int one_rank(int rank) {
  int failures = 0;
  if (own_id) CALL(rank, ncclGetUniqueId(&the_id));
  if (two_hosts) {
    char host[32];
    snprintf(host, sizeof host, "capi-host-%d", rank % 2);
    setenv("SYMCOMM_HOST_ID", host, 1); /* this rank's process only */
  }
  ncclComm_t comm = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  if (rank % 2)
    CALL(rank, ncclCommInitRankConfig(&comm, nranks, the_id, rank, &config));
  else
    CALL(rank, ncclCommInitRank(&comm, nranks, the_id, rank));
  failures += body(comm);
  CALL(rank, ncclCommFinalize(comm));
  BAD(rank, ncclInvalidUsage, ncclAllReduce(&failures, &failures, 1, ncclInt, ncclSum, comm, NULL));
  CALL(rank, ncclCommDestroy(comm));
  BAD(rank, ncclInvalidArgument, ncclCommCount(comm, &failures));
  return failures;
}

static int as_threads(void) { return run_as_threads(nranks, one_rank); }

static int as_processes(void) { return run_as_processes(nranks, one_rank, -1); }

/* A grouped all-reduce and a grouped ring over `n` ranks, all driven from this thread. */
static int drive_all(ncclComm_t* comms, int n, const char* how) {
  int failures = 0, rank = -1;
  static float bufs[MAX_RANKS][COUNT], out[MAX_RANKS][COUNT];
  for (int r = 0; r < n; r++)
    for (int i = 0; i < COUNT; i++) bufs[r][i] = (float)(r + i), out[r][i] = -1;
  CALL(rank, ncclGroupStart());
  for (int r = 0; r < n; r++)
    CALL(rank, ncclAllReduce(bufs[r], bufs[r], COUNT, ncclFloat, ncclSum, comms[r], NULL));
  CALL(rank, ncclGroupEnd());
  for (int r = 0; r < n; r++)
    EXPECT(r, how, COUNT, bufs[r][i], (float)(n * (n - 1) / 2 + n * i));
  CALL(rank, ncclGroupStart());
  for (int r = 0; r < n; r++) {
    CALL(rank, ncclRecv(out[r], COUNT, ncclFloat, (r + n - 1) % n, comms[r], NULL));
    CALL(rank, ncclSend(bufs[r], COUNT, ncclFloat, (r + 1) % n, comms[r], NULL));
  }
  CALL(rank, ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    int p = (r + n - 1) % n;
    EXPECT(r, "one-thread ring", COUNT, out[r][i], bufs[p][i]);
  }
  for (int r = 0; r < n; r++) CALL(r, ncclCommDestroy(comms[r]));
  return failures;
}

/* Rank 0 aborts: the call returns at once, its handle is gone, and every other rank's
 * ncclCommGetAsyncError reports ncclRemoteError within a bounded time. */
static int abort_one(int n) {
  int failures = 0, rank = -1;
  ncclComm_t comms[MAX_RANKS];
  if (n < 2) return 0;
  CALL(rank, ncclCommInitAll(comms, n, NULL));
  CALL(0, ncclCommAbort(comms[0]));
  int count = 0;
  BAD(0, ncclInvalidArgument, ncclCommCount(comms[0], &count));
  for (int r = 1; r < n; r++) {
    ncclResult_t async = ncclSuccess;
    for (int tries = 0; tries < 1000 && async == ncclSuccess; tries++) {
      CALL(r, ncclCommGetAsyncError(comms[r], &async));
      if (async == ncclSuccess) usleep(10000);
    }
    if (async != ncclRemoteError)
      FAIL(r, "after rank 0 aborted: async error %d, expected ncclRemoteError (%d)", async,
           ncclRemoteError);
    else if (!strstr(ncclGetLastError(NULL), "rank 0"))
      FAIL(r, "the async error does not name rank 0: %s", ncclGetLastError(NULL));
    CALL(r, ncclCommDestroy(comms[r]));
  }
  return failures;
}

static int single_thread(void) {
  int failures = 0, rank = -1;
  ncclComm_t comms[MAX_RANKS];
  CALL(rank, ncclGroupStart());
  for (int r = 0; r < nranks; r++) CALL(r, ncclCommInitRank(&comms[r], nranks, the_id, r));
  CALL(rank, ncclGroupEnd());
  failures += drive_all(comms, nranks, "grouped all-reduce (ranks made in a group)");
  CALL(rank, ncclCommInitAll(comms, nranks, NULL));
  failures += drive_all(comms, nranks, "grouped all-reduce (ncclCommInitAll)");
  failures += abort_one(nranks);
  return failures;
}

int main(int argc, char** argv) {
  int started =
      start_program(argc, argv, "procs|commid|hosts|threads|single|errors", MAX_RANKS, &nranks, &the_id);
  if (started) return started;
  const char* mode = argv[1];
  int failures;
  body = run_rank;
  if (!strcmp(mode, "procs")) failures = as_processes();
  else if (!strcmp(mode, "commid")) own_id = 1, failures = as_processes();
  else if (!strcmp(mode, "hosts")) two_hosts = 1, failures = as_processes();
  else if (!strcmp(mode, "threads")) failures = as_threads();
  else if (!strcmp(mode, "single")) failures = single_thread();
  else if (!strcmp(mode, "errors")) body = run_errors, failures = as_threads();
  else return 2;
  printf("%s %s %d: %s (%d failed checks)\n", argv[0], mode, nranks, failures ? "FAIL" : "PASS",
         failures);
  return failures ? 1 : 0;
}

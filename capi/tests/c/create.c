/* Making communicators other than by a blocking init, on the emulator (SYMCOMM_DEVICE=emu):
 * splits, non-blocking creation, and what happens to communicators whose peers die. Prints one
 * line per failed check; exits non-zero when any failed.
 *
 *   create split N        N ranks as threads: ncclCommSplit by color (one rank NOCOLOR when
 *                         N > 2) and key, collectives on the parts and on the parent, then a
 *                         non-blocking split
 *   create split-group N  one thread drives N ranks: ncclCommInitAll, every rank's split in
 *                         one group, grouped all-reduces on the parts
 *   create nonblocking N  N ranks as threads, rank 0 non-blocking and first (ncclInProgress,
 *                         its handle unusable until ncclCommGetAsyncError says ncclSuccess);
 *                         then one thread makes N non-blocking ranks in one group
 *   create abandon 1      a non-blocking init that cannot finish (its peer never comes) is
 *                         aborted: the abort returns at once and the handle is gone
 *   create deadpeer N     N ranks as processes; the last is killed (SIGKILL) after init: the
 *                         others' all-reduce fails within a bound, the async error says so,
 *                         ncclCommAbort returns at once
 */
#define _GNU_SOURCE
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define COUNT 515
#define MAX_RANKS 8

/* A call that must start a non-blocking creation. */
#define STARTS(rank, call)                                                                 \
  do {                                                                                     \
    ncclResult_t r_ = (call);                                                              \
    if (r_ != ncclInProgress)                                                              \
      FAIL(rank, "%s returned %d, expected ncclInProgress (%s)", #call, r_,                \
           ncclGetLastError(NULL));                                                        \
  } while (0)

static ncclUniqueId the_id;
static int nranks;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Polls ncclCommGetAsyncError until the creation ends (at most 30 s): its final state. */
static ncclResult_t wait_made(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  double end = now() + 30;
  while (now() < end) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state != ncclInProgress) return state;
    usleep(1000);
  }
  return ncclInProgress;
}

/* An int32 all-reduce of `value` on every element; the sum `want` must come back. */
static int sum_is(ncclComm_t comm, int rank, int32_t value, int32_t want, const char* what) {
  int failures = 0;
  static __thread int32_t buf[COUNT];
  for (int i = 0; i < COUNT; i++) buf[i] = value + i;
  CALL(rank, ncclAllReduce(buf, buf, COUNT, ncclInt32, ncclSum, comm, NULL));
  int n = 0;
  CALL(rank, ncclCommCount(comm, &n));
  EXPECT(rank, what, COUNT, buf[i], want + n * i);
  return failures;
}

/* Colors rank % 2, except the last rank of more than 2, which passes NCCL_SPLIT_NOCOLOR. */
static int color_of(int rank, int n) {
  return n > 2 && rank == n - 1 ? NCCL_SPLIT_NOCOLOR : rank % 2;
}

/* The members of `rank`'s color: their count, the sum of (rank + 1), and `rank`'s place when
 * ranked by key -rank (the reverse of the parent's order). */
static void color_facts(int rank, int n, int* count, int* sum, int* place) {
  *count = *sum = *place = 0;
  for (int r = 0; r < n; r++) {
    if (color_of(r, n) != color_of(rank, n)) continue;
    (*count)++;
    *sum += r + 1;
    if (r > rank) (*place)++;
  }
}

static int split_rank(int rank) {
  int failures = 0, n = nranks;
  ncclComm_t comm = NULL, part = (ncclComm_t)&failures;
  CALL(rank, ncclCommInitRank(&comm, n, the_id, rank));
  int color = color_of(rank, n);
  CALL(rank, ncclCommSplit(comm, color, -rank, &part, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    if (part != NULL) FAIL(rank, "NCCL_SPLIT_NOCOLOR gave a communicator");
  } else {
    int count, sum, place, got_n = -1, got_rank = -1;
    color_facts(rank, n, &count, &sum, &place);
    CALL(rank, ncclCommCount(part, &got_n));
    CALL(rank, ncclCommUserRank(part, &got_rank));
    if (got_n != count || got_rank != place)
      FAIL(rank, "split color %d: rank %d of %d, expected %d of %d", color, got_rank, got_n,
           place, count);
    failures += sum_is(part, rank, rank + 1, sum, "all-reduce on the split");
  }
  failures += sum_is(comm, rank, 1, n, "all-reduce on the parent after the split");
  /* A non-blocking split of everyone, ranked as the parent. */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t all = NULL;
  ncclResult_t r = ncclCommSplit(comm, 3, 0, &all, &config);
  if (r != ncclInProgress && r != ncclSuccess)
    FAIL(rank, "non-blocking split returned %d: %s", r, ncclGetLastError(NULL));
  else if ((r = wait_made(all)) != ncclSuccess)
    FAIL(rank, "non-blocking split ended with %d: %s", r, ncclGetLastError(NULL));
  else {
    int got_rank = -1;
    CALL(rank, ncclCommUserRank(all, &got_rank));
    if (got_rank != rank) FAIL(rank, "non-blocking split: rank %d", got_rank);
    failures += sum_is(all, rank, rank, n * (n - 1) / 2, "all-reduce on the non-blocking split");
    CALL(rank, ncclCommDestroy(all));
  }
  if (part) CALL(rank, ncclCommDestroy(part));
  CALL(rank, ncclCommDestroy(comm));
  return failures;
}

/* Rank 0 starts first, non-blocking; the others join 300 ms later (odd ranks blocking). */
static int nonblocking_rank(int rank) {
  int failures = 0, n = nranks;
  ncclComm_t comm = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = rank % 2;
  if (rank == 0) {
    STARTS(rank, ncclCommInitRankConfig(&comm, n, the_id, rank, &config));
    if (comm == NULL) {
      FAIL(rank, "non-blocking init set no handle");
      return failures;
    }
    if (n > 1) {
      int32_t x = 1;
      ncclResult_t state = ncclSuccess;
      CALL(rank, ncclCommGetAsyncError(comm, &state));
      if (state != ncclInProgress) FAIL(rank, "async state %d before the peers came", state);
      BAD(rank, ncclInvalidUsage, ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, NULL));
    }
  } else {
    usleep(300000);
    ncclResult_t r = ncclCommInitRankConfig(&comm, n, the_id, rank, &config);
    if (r != (rank % 2 ? ncclSuccess : ncclInProgress))
      FAIL(rank, "init returned %d: %s", r, ncclGetLastError(NULL));
  }
  ncclResult_t state = wait_made(comm);
  if (state != ncclSuccess) {
    FAIL(rank, "creation ended with %d: %s", state, ncclGetLastError(NULL));
    return failures;
  }
  failures += sum_is(comm, rank, rank, n * (n - 1) / 2, "all-reduce after non-blocking init");
  CALL(rank, ncclCommDestroy(comm));
  return failures;
}

/* One thread: every rank's split in one group, then grouped all-reduces on the parts. */
static int split_group(void) {
  int failures = 0, rank = -1, n = nranks;
  ncclComm_t comms[MAX_RANKS], parts[MAX_RANKS];
  static int32_t bufs[MAX_RANKS][COUNT];
  CALL(rank, ncclCommInitAll(comms, n, NULL));
  CALL(rank, ncclGroupStart());
  for (int r = 0; r < n; r++) CALL(r, ncclCommSplit(comms[r], color_of(r, n), -r, &parts[r], NULL));
  CALL(rank, ncclGroupEnd());
  CALL(rank, ncclGroupStart());
  for (int r = 0; r < n; r++) {
    for (int i = 0; i < COUNT; i++) bufs[r][i] = r + 1 + i;
    if (parts[r]) CALL(r, ncclAllReduce(bufs[r], bufs[r], COUNT, ncclInt32, ncclSum, parts[r], NULL));
  }
  CALL(rank, ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    int count, sum, place;
    color_facts(r, n, &count, &sum, &place);
    if ((parts[r] == NULL) != (color_of(r, n) == NCCL_SPLIT_NOCOLOR))
      FAIL(r, "split in a group: handle %p for color %d", (void*)parts[r], color_of(r, n));
    if (!parts[r]) continue;
    EXPECT(r, "grouped all-reduce on the split parts", COUNT, bufs[r][i], sum + count * i);
    CALL(r, ncclCommDestroy(parts[r]));
  }
  for (int r = 0; r < n; r++) CALL(r, ncclCommDestroy(comms[r]));
  return failures;
}

/* One thread makes `nranks` non-blocking ranks in one group: ncclGroupEnd says ncclInProgress. */
static int nonblocking_group(void) {
  int failures = 0, rank = -1, n = nranks;
  ncclUniqueId id;
  ncclComm_t comms[MAX_RANKS];
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  CALL(rank, ncclGetUniqueId(&id));
  CALL(rank, ncclGroupStart());
  for (int r = 0; r < n; r++) CALL(r, ncclCommInitRankConfig(&comms[r], n, id, r, &config));
  STARTS(rank, ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    ncclResult_t state = wait_made(comms[r]);
    if (state != ncclSuccess) FAIL(r, "grouped non-blocking init ended with %d", state);
  }
  CALL(rank, ncclGroupStart());
  static int32_t bufs[MAX_RANKS][COUNT];
  for (int r = 0; r < n; r++) {
    for (int i = 0; i < COUNT; i++) bufs[r][i] = r + i;
    CALL(r, ncclAllReduce(bufs[r], bufs[r], COUNT, ncclInt32, ncclSum, comms[r], NULL));
  }
  CALL(rank, ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    EXPECT(r, "all-reduce after grouped non-blocking init", COUNT, bufs[r][i],
           n * (n - 1) / 2 + n * i);
    CALL(r, ncclCommDestroy(comms[r]));
  }
  return failures;
}

static int abandon(void) {
  int failures = 0, rank = 0, count = 0;
  ncclComm_t comm = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  STARTS(rank, ncclCommInitRankConfig(&comm, 2, the_id, 0, &config));
  usleep(100000);
  ncclResult_t state = ncclSuccess;
  CALL(rank, ncclCommGetAsyncError(comm, &state));
  if (state != ncclInProgress) FAIL(rank, "async state %d while rank 1 is missing", state);
  double start = now();
  CALL(rank, ncclCommAbort(comm));
  if (now() - start > 1.0) FAIL(rank, "ncclCommAbort took %.2f s", now() - start);
  BAD(rank, ncclInvalidArgument, ncclCommCount(comm, &count));
  return failures;
}

/* The last rank dies after init; the others' all-reduce must fail within 20 s. */
static int deadpeer_rank(int rank) {
  int failures = 0, n = nranks;
  ncclComm_t comm = NULL;
  CALL(rank, ncclCommInitRank(&comm, n, the_id, rank));
  if (rank == n - 1) kill(getpid(), SIGKILL);
  static int32_t buf[COUNT];
  double start = now();
  ncclResult_t r = ncclAllReduce(buf, buf, COUNT, ncclInt32, ncclSum, comm, NULL);
  double took = now() - start;
  ncclResult_t state = ncclSuccess;
  for (int tries = 0; tries < 2000 && state == ncclSuccess; tries++) {
    CALL(rank, ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) usleep(10000);
  }
  if (r != ncclRemoteError && r != ncclSystemError)
    FAIL(rank, "all-reduce with a dead peer returned %d: %s", r, ncclGetLastError(NULL));
  if (took > 20) FAIL(rank, "the failure took %.1f s", took);
  if (state != ncclRemoteError && state != ncclSystemError)
    FAIL(rank, "async error %d after the peer died", state);
  printf("rank %d: all-reduce failed after %.3f s (%d), async error %d\n", rank, took, r, state);
  start = now();
  CALL(rank, ncclCommAbort(comm));
  if (now() - start > 1.0) FAIL(rank, "ncclCommAbort took %.2f s", now() - start);
  return failures;
}

int main(int argc, char** argv) {
  int started = start_program(argc, argv, "split|split-group|nonblocking|abandon|deadpeer", MAX_RANKS, &nranks, &the_id);
  if (started) return started;
  const char* mode = argv[1];
  int failures;
  if (!strcmp(mode, "split")) failures = run_as_threads(nranks, split_rank);
  else if (!strcmp(mode, "split-group")) failures = split_group();
  else if (!strcmp(mode, "nonblocking"))
    failures = run_as_threads(nranks, nonblocking_rank) + nonblocking_group();
  else if (!strcmp(mode, "abandon")) failures = abandon();
  else if (!strcmp(mode, "deadpeer") && nranks >= 2) failures = run_as_processes(nranks, deadpeer_rank, nranks - 1);
  else return 2;
  printf("%s %s %d: %s (%d failed checks)\n", argv[0], mode, nranks, failures ? "FAIL" : "PASS",
         failures);
  return failures ? 1 : 0;
}

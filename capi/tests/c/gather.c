/* ncclGather and ncclScatter, ranks as threads on the emulator: every root, element sizes 1, 2,
 * 4 and 8 (ncclInt8, ncclFloat16, ncclBfloat16, ncclInt32, ncclFloat64), out of place and in
 * place (gather: sendbuff == recvbuff + rank * count on the root; scatter: recvbuff == sendbuff +
 * rank * count there), checked byte for byte with #wrong counted; both inside one
 * ncclGroupStart / ncclGroupEnd with a send/recv ring; one thread driving every rank through a
 * group; bad arguments.
 *   Usage: gather threads|single <ranks 1..8> */
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define COUNT 517 /* elements per block: odd */
#define MAX_RANKS 8

static ncclUniqueId the_id;
static int nranks;

/* Byte k of the block that rank `from` contributes in a call with `salt`. */
static uint8_t pattern(int from, size_t k, int salt) {
  return (uint8_t)(from * 37 + (int)(k % 251) * 11 + salt * 13 + 5);
}

/* Counts bytes of `got` (blocks of `block` bytes, `nblocks` of them, from block `first`) that
 * differ from pattern(block index, k, salt); reports the first and the count. */
static int check(int rank, const char* what, const uint8_t* got, size_t block, int first,
                 int nblocks, int salt) {
  int failures = 0;
  long wrong = 0;
  for (int b = 0; b < nblocks; b++)
    for (size_t k = 0; k < block; k++) {
      uint8_t want = pattern(first + b, k, salt);
      if (got[b * block + k] != want) {
        if (wrong == 0)
          FAIL(rank, "%s: block %d byte %zu is %u, expected %u", what, first + b, k,
               got[b * block + k], want);
        wrong++;
      }
    }
  if (wrong) fprintf(stderr, "rank %d: %s: #wrong %ld\n", rank, what, wrong);
  return failures;
}

static const struct {
  ncclDataType_t type;
  size_t size;
  const char* name;
} types[] = {{ncclInt8, 1, "int8"},
             {ncclFloat16, 2, "float16"},
             {ncclBfloat16, 2, "bfloat16"},
             {ncclInt32, 4, "int32"},
             {ncclFloat64, 8, "float64"}};

static int run_rank(ncclComm_t comm) {
  int failures = 0, rank = -1, n = 0;
  CALL(rank, ncclCommUserRank(comm, &rank));
  CALL(rank, ncclCommCount(comm, &n));
  uint8_t* a = malloc(8 * COUNT * n);
  uint8_t* b = malloc(8 * COUNT * n);
  char what[128];
  int salt = 0;
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    size_t block = types[t].size * COUNT;
    for (int root = 0; root < n; root++) {
      /* gather, out of place: non-roots' recvbuff is not used (NULL) */
      salt++;
      for (size_t k = 0; k < block; k++) a[k] = pattern(rank, k, salt);
      memset(b, 0xee, block * n);
      CALL(rank, ncclGather(a, rank == root ? b : NULL, COUNT, types[t].type, root, comm, NULL));
      snprintf(what, sizeof what, "gather %s root %d", types[t].name, root);
      if (rank == root) failures += check(rank, what, b, block, 0, n, salt);
      /* gather in place on the root (sendbuff = recvbuff + root * count) */
      salt++;
      memset(b, 0xee, block * n);
      uint8_t* send = rank == root ? b + root * block : a;
      for (size_t k = 0; k < block; k++) send[k] = pattern(rank, k, salt);
      CALL(rank, ncclGather(send, b, COUNT, types[t].type, root, comm, NULL));
      snprintf(what, sizeof what, "gather in place %s root %d", types[t].name, root);
      if (rank == root) failures += check(rank, what, b, block, 0, n, salt);
      /* scatter, out of place: non-roots' sendbuff is not used (NULL) */
      salt++;
      if (rank == root)
        for (int i = 0; i < n; i++)
          for (size_t k = 0; k < block; k++) a[i * block + k] = pattern(i, k, salt);
      memset(b, 0xee, block);
      CALL(rank, ncclScatter(rank == root ? a : NULL, b, COUNT, types[t].type, root, comm, NULL));
      snprintf(what, sizeof what, "scatter %s root %d", types[t].name, root);
      failures += check(rank, what, b, block, rank, 1, salt);
      /* scatter in place on the root (recvbuff = sendbuff + root * count) */
      salt++;
      if (rank == root)
        for (int i = 0; i < n; i++)
          for (size_t k = 0; k < block; k++) a[i * block + k] = pattern(i, k, salt);
      else
        memset(b, 0xee, block);
      uint8_t* recv = rank == root ? a + root * block : b;
      CALL(rank, ncclScatter(a, recv, COUNT, types[t].type, root, comm, NULL));
      snprintf(what, sizeof what, "scatter in place %s root %d", types[t].name, root);
      failures += check(rank, what, recv, block, rank, 1, salt);
    }
  }
  /* In one group: a gather to the last rank, a scatter from rank 0 and a send/recv ring. */
  size_t block = 4 * COUNT;
  uint8_t* ring = malloc(block);
  uint8_t* got = malloc(block);
  uint8_t* sc = malloc(block);
  int groot = n - 1, next = (rank + 1) % n, prev = (rank + n - 1) % n;
  salt = 1000;
  for (size_t k = 0; k < block; k++) a[k] = pattern(rank, k, salt), ring[k] = pattern(rank, k, salt + 1);
  if (rank == 0)
    for (int i = 0; i < n; i++)
      for (size_t k = 0; k < block; k++) b[i * block + k] = pattern(i, k, salt + 2);
  uint8_t* gathered = malloc(block * n);
  memset(gathered, 0xee, block * n), memset(got, 0xee, block), memset(sc, 0xee, block);
  CALL(rank, ncclGroupStart());
  CALL(rank, ncclGather(a, gathered, COUNT, ncclInt32, groot, comm, NULL));
  CALL(rank, ncclSend(ring, COUNT, ncclInt32, next, comm, NULL));
  CALL(rank, ncclScatter(b, sc, COUNT, ncclInt32, 0, comm, NULL));
  CALL(rank, ncclRecv(got, COUNT, ncclInt32, prev, comm, NULL));
  CALL(rank, ncclGroupEnd());
  if (rank == groot) failures += check(rank, "grouped gather", gathered, block, 0, n, salt);
  failures += check(rank, "grouped ring", got, block, prev, 1, salt + 1);
  failures += check(rank, "grouped scatter", sc, block, rank, 1, salt + 2);

  /* Bad arguments: each its code and a message; the next call works. */
  BAD(rank, ncclInvalidArgument, ncclGather(a, b, COUNT, ncclInt32, n, comm, NULL));
  BAD(rank, ncclInvalidArgument, ncclGather(a, b, COUNT, (ncclDataType_t)77, 0, comm, NULL));
  BAD(rank, ncclInvalidArgument, ncclGather(NULL, b, COUNT, ncclInt32, 0, comm, NULL));
  BAD(rank, ncclInvalidArgument, ncclScatter(a, b, COUNT, ncclInt32, -1, comm, NULL));
  BAD(rank, ncclInvalidArgument, ncclScatter(a, b, COUNT, ncclInt32, 0, NULL, NULL));
  BAD(rank, ncclInvalidArgument, ncclGather(a, b, SIZE_MAX / 2, ncclInt32, 0, comm, NULL));
  if (n > 1 && rank == 0) /* overlapping, not in place: refused at the call, nothing runs */
    BAD(rank, ncclInvalidArgument, ncclGather(b + 4, b, COUNT, ncclInt32, 0, comm, NULL));
  salt = 2000;
  for (size_t k = 0; k < block; k++) a[k] = pattern(rank, k, salt);
  CALL(rank, ncclGather(a, gathered, COUNT, ncclInt32, 0, comm, NULL));
  if (rank == 0) failures += check(rank, "gather after bad calls", gathered, block, 0, n, salt);
  free(a), free(b), free(ring), free(got), free(sc), free(gathered);
  return failures;
}

static int thread_rank(int rank) {
  int failures = 0;
  ncclComm_t comm = NULL;
  CALL(rank, ncclCommInitRank(&comm, nranks, the_id, rank));
  failures += run_rank(comm);
  CALL(rank, ncclCommDestroy(comm));
  return failures;
}

/* One thread, every rank: a gather to each root and a scatter from it, each in a group over
 * all the communicators. */
static int single_thread(void) {
  int failures = 0, rank = -1, n = nranks;
  ncclComm_t comms[MAX_RANKS];
  static uint8_t send[MAX_RANKS][4 * COUNT * MAX_RANKS], recv[MAX_RANKS][4 * COUNT * MAX_RANKS];
  size_t block = 4 * COUNT;
  CALL(rank, ncclCommInitAll(comms, n, NULL));
  for (int root = 0; root < n; root++) {
    int salt = 3000 + root;
    for (int r = 0; r < n; r++) {
      for (size_t k = 0; k < block; k++) send[r][k] = pattern(r, k, salt);
      memset(recv[r], 0xee, block * n);
    }
    CALL(rank, ncclGroupStart());
    for (int r = 0; r < n; r++)
      CALL(r, ncclGather(send[r], recv[r], COUNT, ncclInt32, root, comms[r], NULL));
    CALL(rank, ncclGroupEnd());
    failures += check(root, "one-thread gather", recv[root], block, 0, n, salt);
    for (int i = 0; i < n; i++)
      for (size_t k = 0; k < block; k++) send[root][i * block + k] = pattern(i, k, salt + 100);
    CALL(rank, ncclGroupStart());
    for (int r = 0; r < n; r++)
      CALL(r, ncclScatter(send[r], recv[r], COUNT, ncclInt32, root, comms[r], NULL));
    CALL(rank, ncclGroupEnd());
    for (int r = 0; r < n; r++)
      failures += check(r, "one-thread scatter", recv[r], block, r, 1, salt + 100);
  }
  for (int r = 0; r < n; r++) CALL(r, ncclCommDestroy(comms[r]));
  return failures;
}

int main(int argc, char** argv) {
  int started = start_program(argc, argv, "threads|single", MAX_RANKS, &nranks, &the_id);
  if (started) return started;
  int failures = 0;
  if (!strcmp(argv[1], "single")) {
    failures = single_thread();
  } else if (!strcmp(argv[1], "threads")) {
    failures = run_as_threads(nranks, thread_rank);
  } else {
    return 2;
  }
  printf("gather %s %d: %s (%d failed checks)\n", argv[1], nranks, failures ? "FAIL" : "PASS",
         failures);
  return failures ? 1 : 0;
}

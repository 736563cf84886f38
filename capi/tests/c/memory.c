/* ncclMemAlloc buffers and registration, ranks as threads on the emulator. Every collective on
 * ncclMemAlloc memory, out of place and in place, first plain, then with both buffers registered
 * (ncclCommRegister), then as windows (ncclCommWindowRegister) — bit-exact, #wrong counted; bad
 * arguments of every call, each with its code and a message, the communicator still working
 * after them.
 *   Usage: memory threads <ranks 1..8> */
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define COUNT 1031 /* elements per rank block: not a multiple of any vector width */
#define MAX_RANKS 8

static ncclUniqueId the_id;
static int nranks;

/* Every collective on s and r (ncclMemAlloc'd, COUNT * n elements each). */
static int collectives(ncclComm_t comm, int rank, int n, int32_t* s, int32_t* r, float* f,
                       const char* how) {
  int failures = 0;
  const long C = COUNT;
  char what[128];
#define WHAT(x) (snprintf(what, sizeof what, "%s: %s", how, x), what)
  /* all-reduce out of place and in place */
  for (long i = 0; i < C; i++) s[i] = rank * 1000 + (int32_t)i, r[i] = -1;
  CALL(rank, ncclAllReduce(s, r, C, ncclInt32, ncclSum, comm, NULL));
  EXPECT(rank, WHAT("all-reduce"), C, r[i], (int32_t)(1000 * n * (n - 1) / 2 + n * i));
  CALL(rank, ncclAllReduce(r, r, C, ncclInt32, ncclMax, comm, NULL));
  EXPECT(rank, WHAT("all-reduce in place"), C, r[i], (int32_t)(1000 * n * (n - 1) / 2 + n * i));
  for (long i = 0; i < C; i++) f[i] = (float)(rank + 1) * 0.25f + (float)(i % 9);
  CALL(rank, ncclAllReduce(f, f, C, ncclFloat, ncclSum, comm, NULL));
  EXPECT(rank, WHAT("all-reduce float in place"), C, f[i],
         (float)(n * (n + 1) / 2) * 0.25f + (float)(n * (i % 9)));
  /* broadcast from the last rank, out of place and in place */
  int root = n - 1;
  for (long i = 0; i < C; i++) s[i] = rank == root ? (int32_t)(i * 3 + 1) : -9, r[i] = -1;
  CALL(rank, ncclBroadcast(s, r, C, ncclInt32, root, comm, NULL));
  EXPECT(rank, WHAT("broadcast"), C, r[i], (int32_t)(i * 3 + 1));
  for (long i = 0; i < C; i++) r[i] = rank == 0 ? (int32_t)(i + 77) : -9;
  CALL(rank, ncclBroadcast(r, r, C, ncclInt32, 0, comm, NULL));
  EXPECT(rank, WHAT("broadcast in place"), C, r[i], (int32_t)(i + 77));
  /* reduce to rank 1 % n, out of place and in place */
  root = 1 % n;
  for (long i = 0; i < C; i++) s[i] = (rank + 1) * (int32_t)(i % 13), r[i] = -5;
  CALL(rank, ncclReduce(s, r, C, ncclInt32, ncclSum, root, comm, NULL));
  if (rank == root)
    EXPECT(rank, WHAT("reduce (root)"), C, r[i], (int32_t)((i % 13) * n * (n + 1) / 2));
  else
    EXPECT(rank, WHAT("reduce (non-root untouched)"), C, r[i], -5);
  CALL(rank, ncclReduce(s, s, C, ncclInt32, ncclSum, root, comm, NULL));
  if (rank == root)
    EXPECT(rank, WHAT("reduce in place (root)"), C, s[i], (int32_t)((i % 13) * n * (n + 1) / 2));
  /* all-gather out of place and in place */
  for (long i = 0; i < C; i++) s[i] = rank * 100000 + (int32_t)i;
  for (long i = 0; i < C * n; i++) r[i] = -1;
  CALL(rank, ncclAllGather(s, r, C, ncclInt32, comm, NULL));
  EXPECT(rank, WHAT("all-gather"), C * n, r[i], (int32_t)((i / C) * 100000 + i % C));
  for (long i = 0; i < C * n; i++) r[i] = i / C == rank ? rank * 7 + (int32_t)(i % C) : -1;
  CALL(rank, ncclAllGather(r + rank * C, r, C, ncclInt32, comm, NULL));
  EXPECT(rank, WHAT("all-gather in place"), C * n, r[i], (int32_t)((i / C) * 7 + i % C));
  /* reduce-scatter out of place and in place */
  for (long i = 0; i < C * n; i++) s[i] = (rank + 1) * (int32_t)(i / C + 1) + (int32_t)(i % C % 5);
  for (long i = 0; i < C; i++) r[i] = -1;
  CALL(rank, ncclReduceScatter(s, r, C, ncclInt32, ncclSum, comm, NULL));
  EXPECT(rank, WHAT("reduce-scatter"), C, r[i],
         (int32_t)((rank + 1) * n * (n + 1) / 2 + n * (i % 5)));
  CALL(rank, ncclReduceScatter(s, s + rank * C, C, ncclInt32, ncclSum, comm, NULL));
  EXPECT(rank, WHAT("reduce-scatter in place"), C, s[rank * C + i],
         (int32_t)((rank + 1) * n * (n + 1) / 2 + n * (i % 5)));
  /* all-to-all */
  for (long i = 0; i < C * n; i++) s[i] = rank * 1000000 + (int32_t)(i / C) * 1000 + (int32_t)(i % C % 1000);
  for (long i = 0; i < C * n; i++) r[i] = -1;
  CALL(rank, ncclAlltoAll(s, r, C, ncclInt32, comm, NULL));
  EXPECT(rank, WHAT("all-to-all"), C * n, r[i],
         (int32_t)((i / C) * 1000000 + rank * 1000 + i % C % 1000));
  /* a send/recv ring */
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (long i = 0; i < C; i++) s[i] = rank * 10 + (int32_t)i, r[i] = -1;
  CALL(rank, ncclGroupStart());
  CALL(rank, ncclSend(s, C, ncclInt32, next, comm, NULL));
  CALL(rank, ncclRecv(r, C, ncclInt32, prev, comm, NULL));
  CALL(rank, ncclGroupEnd());
  EXPECT(rank, WHAT("send/recv ring"), C, r[i], (int32_t)(prev * 10 + i));
#undef WHAT
  return failures;
}

static int run_rank(int rank) {
  int failures = 0, n = nranks;
  ncclComm_t comm = NULL;
  CALL(rank, ncclCommInitRank(&comm, n, the_id, rank));
  size_t bytes = sizeof(int32_t) * COUNT * n;
  int32_t *s = NULL, *r = NULL;
  float* f = NULL;
  CALL(rank, ncclMemAlloc((void**)&s, bytes));
  CALL(rank, ncclMemAlloc((void**)&r, bytes));
  CALL(rank, ncclMemAlloc((void**)&f, sizeof(float) * COUNT));
  if ((uintptr_t)s % 4096 || (uintptr_t)r % 4096 || (uintptr_t)f % 4096)
    FAIL(rank, "ncclMemAlloc pointers %p %p %p are not 4 KiB aligned", (void*)s, (void*)r, (void*)f);
  if (s == r) FAIL(rank, "two allocations share an address");
  /* The whole rounded-up size is usable. */
  memset(s, 0x5a, (bytes + 4095) / 4096 * 4096);
  failures += collectives(comm, rank, n, s, r, f, "ncclMemAlloc");

  void *hs = NULL, *hr = NULL, *hf = NULL;
  CALL(rank, ncclCommRegister(comm, s, bytes, &hs));
  CALL(rank, ncclCommRegister(comm, r, bytes, &hr));
  CALL(rank, ncclCommRegister(comm, f, sizeof(float) * COUNT, &hf));
  if (!hs || !hr || hs == hr) FAIL(rank, "registration handles %p %p", hs, hr);
  failures += collectives(comm, rank, n, s, r, f, "registered");
  CALL(rank, ncclCommDeregister(comm, hs));
  CALL(rank, ncclCommDeregister(comm, hr));
  CALL(rank, ncclCommDeregister(comm, hf));

  /* Windows: registered collectively, the user pointer comes back, collectives still exact. */
  ncclWindow_t ws = NULL, wr = NULL;
  CALL(rank, ncclCommWindowRegister(comm, s, bytes, &ws, NCCL_WIN_COLL_SYMMETRIC));
  CALL(rank, ncclCommWindowRegister(comm, r, bytes, &wr, NCCL_WIN_DEFAULT));
  void* user = NULL;
  CALL(rank, ncclWinGetUserPtr(comm, ws, &user));
  if (user != (void*)s) FAIL(rank, "ncclWinGetUserPtr: %p, registered %p", user, (void*)s);
  failures += collectives(comm, rank, n, s, r, f, "windows");
  /* Sizes that differ across ranks fail on every rank; so does one rank's bad argument. */
  ncclWindow_t bad = NULL;
  BAD(rank, ncclInvalidUsage,
      ncclCommWindowRegister(comm, s, rank == 0 ? bytes : bytes / 2, &bad, NCCL_WIN_DEFAULT));
  if (rank == 0)
    BAD(rank, ncclInvalidArgument, ncclCommWindowRegister(comm, s, bytes, &bad, 0x40));
  else
    BAD(rank, ncclInvalidUsage, ncclCommWindowRegister(comm, s, bytes, &bad, NCCL_WIN_DEFAULT));
  CALL(rank, ncclCommWindowDeregister(comm, ws));
  CALL(rank, ncclCommWindowDeregister(comm, wr));
  BAD(rank, ncclInvalidArgument, ncclCommWindowDeregister(comm, ws));
  BAD(rank, ncclInvalidArgument, ncclWinGetUserPtr(comm, ws, &user));
  failures += collectives(comm, rank, n, s, r, f, "after the windows");

  /* Plain malloc'd buffers may be registered too (host memory is the emulator's device memory). */
  int32_t* plain = malloc(bytes);
  void* hp = NULL;
  CALL(rank, ncclCommRegister(comm, plain, bytes, &hp));
  failures += collectives(comm, rank, n, plain, r, f, "registered malloc buffer");
  CALL(rank, ncclCommDeregister(comm, hp));
  free(plain);

  /* Bad arguments: each its code and a message; the communicator still works. */
  void* p = NULL;
  BAD(rank, ncclInvalidArgument, ncclMemAlloc(NULL, 4096));
  BAD(rank, ncclInvalidArgument, ncclMemAlloc(&p, 0));
  BAD(rank, ncclInvalidArgument, ncclMemAlloc(&p, SIZE_MAX));
  int on_stack = 0;
  BAD(rank, ncclInvalidArgument, ncclMemFree(&on_stack));
  BAD(rank, ncclInvalidArgument, ncclMemFree(NULL));
  BAD(rank, ncclInvalidArgument, ncclMemFree((char*)s + 4096)); /* inside, not the start */
  void* h = NULL;
  BAD(rank, ncclInvalidArgument, ncclCommRegister(comm, NULL, 64, &h));
  BAD(rank, ncclInvalidArgument, ncclCommRegister(comm, s, 0, &h));
  BAD(rank, ncclInvalidArgument, ncclCommRegister(comm, s, 64, NULL));
  BAD(rank, ncclInvalidArgument, ncclCommRegister(NULL, s, 64, &h));
  BAD(rank, ncclInvalidArgument, ncclCommRegister(comm, (char*)s + 4096, bytes * 2, &h));
  BAD(rank, ncclInvalidArgument, ncclCommDeregister(comm, hs)); /* deregistered already */
  BAD(rank, ncclInvalidArgument, ncclCommDeregister(comm, (void*)&on_stack));
  BAD(rank, ncclInvalidArgument, ncclCommDeregister(comm, NULL));
  failures += collectives(comm, rank, n, s, r, f, "after bad calls");

  CALL(rank, ncclMemFree(s));
  BAD(rank, ncclInvalidArgument, ncclMemFree(s)); /* freed already */
  CALL(rank, ncclMemFree(r));
  CALL(rank, ncclMemFree(f));
  CALL(rank, ncclCommDestroy(comm));
  return failures;
}

int main(int argc, char** argv) {
  int started = start_program(argc, argv, "threads", MAX_RANKS, &nranks, &the_id);
  if (started) return started;
  if (strcmp(argv[1], "threads")) return 2;
  int failures = run_as_threads(nranks, run_rank);
  printf("memory %d: %s (%d failed checks)\n", nranks, failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}

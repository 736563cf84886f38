/* Logging through NCCL_DEBUG: two ranks as threads make a communicator, run one all-reduce and
 * destroy it; c_api.rs runs this under NCCL_DEBUG* settings and reads what was logged (stderr or
 * NCCL_DEBUG_FILE).  Usage: logging */
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

static ncclUniqueId id;

static void* rank_main(void* arg) {
  int rank = (int)(intptr_t)arg;
  ncclComm_t comm = NULL;
  int32_t x[3] = {rank, rank, rank};
  ncclResult_t r = ncclCommInitRank(&comm, 2, id, rank);
  if (r == ncclSuccess) r = ncclAllReduce(x, x, 3, ncclInt32, ncclSum, comm, NULL);
  if (r == ncclSuccess) r = ncclCommDestroy(comm);
  if (r != ncclSuccess) fprintf(stderr, "rank %d: %d: %s\n", rank, (int)r, ncclGetLastError(NULL));
  int ok = r == ncclSuccess && x[0] == 1 && x[1] == 1 && x[2] == 1;
  return (void*)(intptr_t)ok;
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
  pthread_t t[2];
  for (int r = 0; r < 2; r++) pthread_create(&t[r], NULL, rank_main, (void*)(intptr_t)r);
  int ok = 1;
  for (int r = 0; r < 2; r++) {
    void* res;
    pthread_join(t[r], &res);
    ok = ok && (intptr_t)res;
  }
  printf("logging: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

/* LD_PRELOAD replaces NCCL: this program's libnccl.so.2 (found through its RPATH) is a stand-in
 * for NVIDIA's library, whose ncclGetVersion says 1 and which has nothing else. Preloading
 * symcomm-nccl, whose SONAME is libnccl.so.2, satisfies the program's NEEDED entry, so the
 * stand-in is never loaded: the version is ours and a one-rank all-reduce runs. */
#include <nccl.h>
#include <stdio.h>

int main(void) {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) {
    printf("preload: ncclGetVersion says %d, not %d: FAIL\n", version, NCCL_VERSION_CODE);
    return 1;
  }
  ncclComm_t comm;
  float x[4] = {1, 2, 3, 4};
  if (ncclCommInitAll(&comm, 1, NULL) != ncclSuccess ||
      ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, NULL) != ncclSuccess ||
      ncclCommDestroy(comm) != ncclSuccess) {
    printf("preload: %s: FAIL\n", ncclGetLastError(NULL));
    return 1;
  }
  int ok = x[0] == 1 && x[1] == 2 && x[2] == 3 && x[3] == 4;
  printf("preload: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

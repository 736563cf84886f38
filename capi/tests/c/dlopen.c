/* dlopen of the library as Python loads PyTorch's extensions (RTLD_NOW): every NCCL symbol
 * libtorch_cuda.so (torch 2.15) resolves exists; an unimplemented one called through its
 * address returns ncclInvalidUsage with a message naming it.  Usage: dlopen <library path> */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const char* const names[] = {
    "ncclAllGather", "ncclAllReduce", "ncclAlltoAll", "ncclBcast", "ncclBroadcast",
    "ncclCommAbort", "ncclCommCount", "ncclCommDeregister", "ncclCommDestroy",
    "ncclCommFinalize", "ncclCommGetAsyncError", "ncclCommGetUniqueId", "ncclCommGrow",
    "ncclCommInitAll", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable",
    "ncclCommMemStats", "ncclCommRegister", "ncclCommResume", "ncclCommRevoke", "ncclCommShrink",
    "ncclCommSplit", "ncclCommSuspend", "ncclCommUserRank", "ncclCommWindowDeregister",
    "ncclCommWindowRegister", "ncclDevCommCreate", "ncclDevCommDestroy", "ncclGather",
    "ncclGetErrorString", "ncclGetLastError", "ncclGetLsaMultimemDevicePointer",
    "ncclGetPeerDevicePointer", "ncclGetUniqueId", "ncclGetVersion", "ncclGroupEnd",
    "ncclGroupSimulateEnd", "ncclGroupStart", "ncclMemAlloc", "ncclMemFree", "ncclPutSignal",
    "ncclRecv", "ncclRedOpCreatePreMulSum", "ncclRedOpDestroy", "ncclReduce",
    "ncclReduceScatter", "ncclSend", "ncclSignal", "ncclWaitSignal", "ncclWinGetUserPtr",
};

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  int missing = 0, n = (int)(sizeof names / sizeof names[0]);
  for (int i = 0; i < n; i++) {
    if (!dlsym(lib, names[i])) {
      fprintf(stderr, "missing symbol %s\n", names[i]);
      missing++;
    }
  }
  int (*get_version)(int*) = (int (*)(int*))dlsym(lib, "ncclGetVersion");
  int (*simulate)(void*) = (int (*)(void*))dlsym(lib, "ncclGroupSimulateEnd");
  const char* (*last_error)(void*) = (const char* (*)(void*))dlsym(lib, "ncclGetLastError");
  int version = 0, failures = missing;
  if (!get_version || get_version(&version) != 0 || version != 22105) {
    fprintf(stderr, "ncclGetVersion: %d\n", version);
    failures++;
  }
  if (!simulate || !last_error || simulate(NULL) != 5 ||
      !strstr(last_error(NULL), "ncclGroupSimulateEnd")) {
    fprintf(stderr, "ncclGroupSimulateEnd did not refuse with ncclInvalidUsage and a message\n");
    failures++;
  }
  printf("dlopen: %d of %d symbols resolved: %s\n", n - missing, n, failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}

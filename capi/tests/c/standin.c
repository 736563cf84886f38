/* A stand-in for NVIDIA's libnccl.so.2 (same SONAME): only ncclGetVersion, saying 1. */
int ncclGetVersion(int* version) {
  *version = 1;
  return 0;
}

/* The ABI as a header declares it: compiled once against our include/nccl.h and once against
 * NVIDIA's (the nvidia-nccl-cu13 wheel, scripts/nccl-header), it prints one `name value` line per
 * layout fact (sizes, field offsets, enum values, initializer values); c_api.rs compares the two
 * listings. Then, linked to our library, it makes a one-rank communicator with this header's
 * ncclConfig_t (NVIDIA's is longer than ours: config.size tells the library) and runs an
 * all-reduce on it.  Usage: abi (prints the listing, then PASS or FAIL) */
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define SIZE(T) printf("sizeof %s %zu\n", #T, sizeof(T))
#define FIELD(T, f) printf("offsetof %s.%s %zu\n", #T, #f, offsetof(T, f))
#define VALUE(v) printf("value %s %lld\n", #v, (long long)(v))

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  SIZE(ncclUniqueId);
  VALUE(NCCL_UNIQUE_ID_BYTES);
  SIZE(ncclComm_t);
  SIZE(ncclResult_t);
  SIZE(ncclDataType_t);
  SIZE(ncclRedOp_t);
  SIZE(ncclScalarResidence_t);
  /* Our ncclConfig_t's fields: NVIDIA's must have each at the same offset. */
  FIELD(ncclConfig_t, size);
  FIELD(ncclConfig_t, magic);
  FIELD(ncclConfig_t, version);
  FIELD(ncclConfig_t, blocking);
  FIELD(ncclConfig_t, cgaClusterSize);
  FIELD(ncclConfig_t, minCTAs);
  FIELD(ncclConfig_t, maxCTAs);
  FIELD(ncclConfig_t, netName);
  FIELD(ncclConfig_t, splitShare);
  printf("config-size ncclConfig_t %zu\n", sizeof(ncclConfig_t));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (config.size != sizeof(ncclConfig_t)) printf("initializer size %zu is not sizeof\n", config.size);
  VALUE(config.magic);
  VALUE(config.blocking);
  VALUE(config.cgaClusterSize);
  VALUE(config.minCTAs);
  VALUE(config.maxCTAs);
  VALUE(config.netName == NULL);
  VALUE(config.splitShare);
  VALUE(NCCL_CONFIG_UNDEF_INT);
  VALUE(NCCL_SPLIT_NOCOLOR);
  printf("version NCCL_VERSION_CODE %d\n", NCCL_VERSION_CODE);
  VALUE(NCCL_VERSION(2, 8, 4));
  VALUE(NCCL_VERSION(2, 21, 5));
  VALUE(ncclSuccess);
  VALUE(ncclUnhandledCudaError);
  VALUE(ncclSystemError);
  VALUE(ncclInternalError);
  VALUE(ncclInvalidArgument);
  VALUE(ncclInvalidUsage);
  VALUE(ncclRemoteError);
  VALUE(ncclInProgress);
  VALUE(ncclSum);
  VALUE(ncclProd);
  VALUE(ncclMax);
  VALUE(ncclMin);
  VALUE(ncclAvg);
  VALUE(ncclNumOps);
  VALUE(ncclMaxRedOp);
  VALUE(ncclInt8);
  VALUE(ncclChar);
  VALUE(ncclUint8);
  VALUE(ncclInt32);
  VALUE(ncclInt);
  VALUE(ncclUint32);
  VALUE(ncclInt64);
  VALUE(ncclUint64);
  VALUE(ncclFloat16);
  VALUE(ncclHalf);
  VALUE(ncclFloat32);
  VALUE(ncclFloat);
  VALUE(ncclFloat64);
  VALUE(ncclDouble);
  VALUE(ncclBfloat16);
  VALUE(ncclFloat8e4m3);
  VALUE(ncclFloat8e5m2);
  VALUE(ncclScalarDevice);
  VALUE(ncclScalarHostImmediate);

  /* The library with this header's config: blocking, the other fields set as a caller might. */
  int failures = 0;
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  config.blocking = 1;
  config.minCTAs = 2;
  config.netName = "Socket";
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r == ncclSuccess) r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
  int x[5] = {1, 2, 3, 4, 5};
  if (r == ncclSuccess) r = ncclAllReduce(x, x, 5, ncclInt32, ncclSum, comm, NULL);
  if (r == ncclSuccess) r = ncclCommDestroy(comm);
  if (r != ncclSuccess) {
    fprintf(stderr, "init with a %zu-byte config: %d: %s\n", sizeof(ncclConfig_t), (int)r,
            ncclGetLastError(NULL));
    failures++;
  }
  for (int i = 0; i < 5; i++)
    if (x[i] != i + 1) fprintf(stderr, "x[%d] = %d\n", i, x[i]), failures++;
  /* A size smaller than the header is refused, the magic checked. */
  config.size = 8;
  if (ncclCommInitRankConfig(&comm, 1, id, 0, &config) != ncclInvalidArgument)
    fprintf(stderr, "config.size 8 was not refused\n"), failures++;
  config.size = sizeof(ncclConfig_t);
  config.magic = 0;
  if (ncclCommInitRankConfig(&comm, 1, id, 0, &config) != ncclInvalidArgument)
    fprintf(stderr, "a config without the magic was not refused\n"), failures++;
  printf("abi: %s (%d failed checks)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}

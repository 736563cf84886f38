/*
 * nccl.h — symcomm's declaration of NCCL's C API (symcomm-nccl, libnccl.so.2).
 *
 * Written for symcomm; the types, values and layouts are those of NCCL 2.21 so that programs
 * built against NVIDIA's header run unchanged on this library and the other way round. The
 * library reports version 2.21.5 (ncclGetVersion, NCCL_VERSION_CODE).
 *
 * What runs (see the README section "Using symcomm as NCCL"): communicator creation
 * (ncclGetUniqueId, ncclCommInitRank, ncclCommInitRankConfig, blocking and non-blocking,
 * ncclCommInitAll, ncclCommSplit), destruction (ncclCommFinalize, ncclCommDestroy,
 * ncclCommAbort), queries (ncclCommCount, ncclCommCuDevice, ncclCommUserRank,
 * ncclCommGetAsyncError), errors (ncclGetErrorString, ncclGetLastError), the collectives
 * ncclAllReduce, ncclBroadcast, ncclBcast, ncclReduce, ncclAllGather, ncclReduceScatter,
 * ncclAlltoAll, ncclGather, ncclScatter, pre-multiplied sums (ncclRedOpCreatePreMulSum,
 * ncclRedOpDestroy), point-to-point ncclSend / ncclRecv, groups (ncclGroupStart /
 * ncclGroupEnd), and memory (ncclMemAlloc / ncclMemFree, ncclCommRegister /
 * ncclCommDeregister, ncclCommWindowRegister / ncclCommWindowDeregister, ncclWinGetUserPtr).
 *
 * Every other function declared here exists in the library and returns ncclInvalidUsage, with
 * ncclGetLastError() naming it: nothing succeeds without doing its work.
 *
 * Streams: on a GPU, the caller's cudaStream_t orders the work, as with NCCL. On the emulator
 * (SYMCOMM_DEVICE=emu) buffers are host memory and every call is synchronous: it returns when
 * its result is in place (which satisfies any stream order; the stream argument is not used).
 */
#ifndef SYMCOMM_NCCL_H_
#define SYMCOMM_NCCL_H_

/* cudaStream_t: the CUDA runtime's when its header is at hand, else the same opaque pointer
 * type (define SYMCOMM_NCCL_NO_CUDA_RUNTIME to never include it). */
#if !defined(SYMCOMM_NCCL_NO_CUDA_RUNTIME) && defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#define SYMCOMM_NCCL_HAVE_CUDA_RUNTIME 1
#endif
#endif
#ifndef SYMCOMM_NCCL_HAVE_CUDA_RUNTIME
#ifndef __CUDA_RUNTIME_H__
typedef struct CUstream_st* cudaStream_t;
#endif
#endif

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 21
#define NCCL_PATCH 5
#define NCCL_SUFFIX ""

/* Versions up to 2.8 were coded X*1000 + Y*100 + Z; later ones X*10000 + Y*100 + Z. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE 22105

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator: one rank's handle, from ncclCommInitRank* or ncclCommInitAll. */
typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

/* The rendezvous id that every rank of a communicator receives from the rank that made it.
 * It is a credential (it carries the rendezvous secret): do not print or log it. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1

/* Communicator options (the 2.17 layout that 2.21 uses: a size/magic/version header, then the
 * fields). Initialize with NCCL_CONFIG_INITIALIZER, then set what you need. symcomm reads
 * `blocking` (0: creation returns ncclInProgress and runs in the background; poll
 * ncclCommGetAsyncError) and ignores the tuning fields (CTAs, cluster size, network name, split
 * share). */
typedef struct ncclConfig_v21700 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                \
  {                                                                                            \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),        \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                   \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT                    \
  }

/* Reduction operations. */
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

/* Element types. The two FP8 types carry the numbers later NCCL releases gave them. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* --- Version, ids, errors ------------------------------------------------------------------ */

/* *version = NCCL_VERSION_CODE of this library (22105). */
ncclResult_t ncclGetVersion(int* version);

/* A fresh id (its root listens on this process: call it on the process of rank 0, then hand the
 * id to every rank). NCCL_COMM_ID=<ip>:<port> fixes the root's address; the secret is then
 * SYMCOMM_SECRET (32 hex digits, the same on every rank) when set, else random. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);

/* A static description of `result`. */
const char* ncclGetErrorString(ncclResult_t result);

/* The message of the last error on the calling thread ("" when none). Valid until this thread's
 * next call into the library. `comm` may be NULL. */
const char* ncclGetLastError(ncclComm_t comm);

/* --- Communicators ------------------------------------------------------------------------- */

/* Joins communicator `commId` as `rank` of `nranks`. Collective: every rank calls it at the
 * same time (other threads or processes; or one thread inside ncclGroupStart/ncclGroupEnd, in
 * which case the communicators are made, concurrently, by ncclGroupEnd). The device: the
 * emulator when SYMCOMM_DEVICE=emu, GPU n for SYMCOMM_DEVICE=cuda:n, else the device of the
 * calling thread's current CUDA context (cudaSetDevice), else local rank % GPU count. */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
/* With config->blocking = 0 it returns ncclInProgress at once with *comm set; the communicator
 * is ready when ncclCommGetAsyncError reports ncclSuccess (until then other calls with it are
 * ncclInvalidUsage, except ncclCommDestroy / ncclCommAbort). */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);

/* `ndev` communicators of one process, rank i on GPU devlist[i] (NULL: GPU i; the emulator when
 * SYMCOMM_DEVICE=emu), made concurrently. */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/* The ranks of `comm` passing the same `color` form a new communicator, ranked by `key` (ties by
 * their rank in `comm`); color NCCL_SPLIT_NOCOLOR joins none (*newcomm = NULL). Collective over
 * `comm`, which stays usable. config NULL: `comm`'s blocking mode. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);

/* Waits for this communicator's work, then refuses further calls except destroy/abort. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
/* Frees the communicator (waiting for its work; the other ranks are told it left). */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
/* Aborts (kernels waiting on this communicator return, the other ranks are told) and frees it. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
/* *asyncError: ncclSuccess, or the communicator's sticky error (a lost peer, a timeout, a
 * mismatched call, an abort); ncclInProgress while a non-blocking creation runs, then its
 * failure if it failed. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
/* The GPU ordinal (0 on the emulator). */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);

/* --- Reduction ops ------------------------------------------------------------------------ */

/* A pre-multiplied sum on `comm`: each rank's input times that rank's `scalar` (one element of
 * `datatype`: copied now for ncclScalarHostImmediate, read from device memory by every call for
 * ncclScalarDevice), then summed. Usable by the reductions of `comm` on `datatype` until
 * ncclRedOpDestroy. *op is written on success only. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* --- Collectives (counts in elements; in place when the buffers coincide as NCCL defines) -- */

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
/* In-place broadcast (the older name). */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
/* `sendcount` elements per rank; recvbuff holds nranks * sendcount. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
/* `recvcount` elements per rank; sendbuff holds nranks * recvcount. */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
/* `count` elements to and from each rank; both buffers hold nranks * count. */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Rank i's `sendcount` elements land at recvbuff + i * sendcount on `root` (recvbuff is used on
 * the root only); in place when sendbuff == recvbuff + root * sendcount on the root. The NCCL 2.28
 * signature. */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
/* `root`'s sendbuff + i * recvcount (sendbuff is used on the root only) lands in rank i's
 * recvbuff; in place when recvbuff == sendbuff + root * recvcount on the root. The NCCL 2.28
 * signature. */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* --- Memory --------------------------------------------------------------------------------- */

/* `size` bytes (rounded up to 4 KiB) of device memory, 4 KiB aligned: on the device a
 * communicator created on this thread now would use (the emulator's host memory with
 * SYMCOMM_DEVICE=emu). ncclInvalidArgument for ptr == NULL or size == 0. */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
/* Frees what ncclMemAlloc returned (ncclInvalidArgument for anything else, NULL included). */
ncclResult_t ncclMemFree(void* ptr);
/* Registers `size` bytes at `buff` with `comm` (a range starting in an ncclMemAlloc allocation
 * must end in it); *handle names the registration. Collectives on registered buffers take the
 * same path as on others (no zero-copy registration yet). */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
/* Ends a registration of `comm` (ncclInvalidArgument for an unknown handle). */
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);

/* Windows (NCCL 2.27): `size` bytes at `buff` on every rank, registered collectively (the same
 * size and flags on every rank, else ncclInvalidUsage on all); like ncclCommRegister they do not
 * change how collectives run yet. ncclWinGetUserPtr returns the registered buffer. */
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);

/* --- Point-to-point and groups ------------------------------------------------------------ */

/* Inside a group, the sends and receives of one communicator (on one stream) progress together
 * and may come in any order, several to and from one peer too (matched in call order); alone, a
 * send completes when the peer receives it. */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);

/* Groups nest; the calls of the outermost group run at its ncclGroupEnd (per communicator: the
 * collectives in call order, then its sends and receives together), the communicators of one
 * group concurrently. Errors of arguments come from the call; errors of the work from
 * ncclGroupEnd. Group state is per thread. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

/* --- Exported, not implemented yet: each returns ncclInvalidUsage ------------------------- */

ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
#ifdef __cplusplus
}
#endif

#endif /* SYMCOMM_NCCL_H_ */

/* The checks of the C test programs: each counts into a local `failures` of the calling
 * function and reports on stderr, naming the rank. */
#ifndef SYMCOMM_CAPI_TEST_CHECK_H_
#define SYMCOMM_CAPI_TEST_CHECK_H_

#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAIL(rank, ...)                             \
  do {                                              \
    fprintf(stderr, "rank %d: ", (rank));           \
    fprintf(stderr, __VA_ARGS__);                   \
    fprintf(stderr, "\n");                          \
    failures++;                                     \
  } while (0)

#define CALL(rank, call)                                                                   \
  do {                                                                                     \
    ncclResult_t r_ = (call);                                                              \
    if (r_ != ncclSuccess) {                                                               \
      FAIL(rank, "%s returned %d (%s): %s", #call, (int)r_, ncclGetErrorString(r_),       \
           ncclGetLastError(NULL));                                                        \
      return failures;                                                                     \
    }                                                                                      \
  } while (0)

/* Counts elements that differ from `want(i)`, reports the first. */
#define EXPECT(rank, what, n, got, want)                                                   \
  do {                                                                                     \
    long wrong_ = 0;                                                                       \
    for (long i = 0; i < (long)(n); i++) {                                                 \
      if ((got) != (want)) {                                                               \
        if (wrong_ == 0)                                                                   \
          FAIL(rank, "%s: element %ld is %.17g, expected %.17g", what, i, (double)(got),  \
               (double)(want));                                                            \
        wrong_++;                                                                          \
      }                                                                                    \
    }                                                                                      \
    if (wrong_) fprintf(stderr, "rank %d: %s: #wrong %ld\n", rank, what, wrong_);        \
  } while (0)

/* One bad call: its code must be `want` and the thread's last error must say something. */
#define BAD(rank, want, call)                                                                  \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    const char* why_ = ncclGetLastError(NULL);                                                 \
    if (r_ != (want)) FAIL(rank, "%s returned %d, expected %d (%s)", #call, r_, want, why_);   \
    else if (why_ == NULL || why_[0] == 0) FAIL(rank, "%s: no ncclGetLastError message", #call); \
  } while (0)

/* The failed checks of `rank_main(r)` on ranks 0..n-1 as threads. */
static int (*check_rank_main_)(int);
static void* check_thread_main_(void* arg) {
  return (void*)(intptr_t)check_rank_main_((int)(intptr_t)arg);
}
static inline int run_as_threads(int n, int (*rank_main)(int)) {
  pthread_t t[64];
  int failures = 0;
  check_rank_main_ = rank_main;
  for (int r = 0; r < n; r++) pthread_create(&t[r], NULL, check_thread_main_, (void*)(intptr_t)r);
  for (int r = 0; r < n; r++) {
    void* f;
    pthread_join(t[r], &f);
    failures += (int)(intptr_t)f;
  }
  return failures;
}

/* `rank_main(r)` on ranks 0..n-1 as forked processes: the ranks that failed (rank `killed`,
 * -1 for none, must instead die of SIGKILL). */
static inline int run_as_processes(int n, int (*rank_main)(int), int killed) {
  pid_t pid[64];
  for (int r = 0; r < n; r++) {
    pid[r] = fork();
    if (pid[r] == 0) _exit(rank_main(r) ? 1 : 0);
    if (pid[r] < 0) return 1;
  }
  int failures = 0;
  for (int r = 0; r < n; r++) {
    int status = 0;
    waitpid(pid[r], &status, 0);
    int ok = r == killed ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                         : WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) {
      fprintf(stderr, "rank %d (process) failed, status %#x\n", r, status);
      failures++;
    }
  }
  return failures;
}

/* The programs' common start: `prog <mode> <ranks 1..max>` (usage naming `modes` otherwise),
 * unbuffered stdout, and an id in `id`. 0, or the exit code to return. */
static inline int start_program(int argc, char** argv, const char* modes, int max, int* nranks,
                                ncclUniqueId* id) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc != 3 || (*nranks = atoi(argv[2])) < 1 || *nranks > max) {
    fprintf(stderr, "usage: %s %s <ranks 1..%d>\n", argv[0], modes, max);
    return 2;
  }
  if (ncclGetUniqueId(id) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  return 0;
}

#endif

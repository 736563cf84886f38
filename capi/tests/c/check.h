/* The checks the C test programs share. Each counts into a local `int failures` and reports on
 * stderr with the rank that failed.
 *   FAIL(rank, fmt, ...)            one failed check
 *   CALL(rank, call)                a call that must succeed (else: FAIL and return failures)
 *   BAD(rank, want, call)           a call that must return `want` with a ncclGetLastError text
 *   EXPECT(rank, what, n, got, want) n elements (index i) bit-exact, #wrong counted
 * and run_threads, which runs ranks as threads. */
#ifndef SYMCOMM_TEST_CHECK_H_
#define SYMCOMM_TEST_CHECK_H_

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#define FAIL(rank, ...)                   \
  do {                                    \
    fprintf(stderr, "rank %d: ", (rank)); \
    fprintf(stderr, __VA_ARGS__);         \
    fprintf(stderr, "\n");                \
    failures++;                           \
  } while (0)

#define CALL(rank, call)                                                             \
  do {                                                                               \
    ncclResult_t r_ = (call);                                                        \
    if (r_ != ncclSuccess) {                                                         \
      FAIL(rank, "%s returned %d (%s): %s", #call, (int)r_, ncclGetErrorString(r_), \
           ncclGetLastError(NULL));                                                  \
      return failures;                                                               \
    }                                                                                \
  } while (0)

#define BAD(rank, want, call)                                                                  \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    const char* why_ = ncclGetLastError(NULL);                                                 \
    if (r_ != (want)) FAIL(rank, "%s returned %d, expected %d (%s)", #call, r_, want, why_);   \
    else if (why_ == NULL || why_[0] == 0) FAIL(rank, "%s: no ncclGetLastError message", #call); \
  } while (0)

/* Counts elements that differ from `want` (an expression of the index i), reports the first. */
#define EXPECT(rank, what, n, got, want)                                                  \
  do {                                                                                    \
    long wrong_ = 0;                                                                      \
    for (long i = 0; i < (long)(n); i++) {                                                \
      if ((got) != (want)) {                                                              \
        if (wrong_ == 0)                                                                  \
          FAIL(rank, "%s: element %ld is %.17g, expected %.17g", what, i, (double)(got), \
               (double)(want));                                                           \
        wrong_++;                                                                         \
      }                                                                                   \
    }                                                                                     \
    if (wrong_) fprintf(stderr, "rank %d: %s: #wrong %ld\n", rank, what, wrong_);       \
  } while (0)

/* Runs `rank_main((void*)rank)` for ranks 0..n-1 (n <= 64), each on a thread of its own; returns
 * the sum of what they return (their failed checks, as intptr_t). */
static inline int run_threads(int n, void* (*rank_main)(void*)) {
  pthread_t t[64];
  int failures = 0;
  if (n < 0 || n > 64) return 1;
  for (int r = 0; r < n; r++) pthread_create(&t[r], NULL, rank_main, (void*)(intptr_t)r);
  for (int r = 0; r < n; r++) {
    void* f;
    pthread_join(t[r], &f);
    failures += (int)(intptr_t)f;
  }
  return failures;
}

#endif /* SYMCOMM_TEST_CHECK_H_ */

// The core tests' CHECK: counts passes and failures (a failure names the
// rank, file, line and condition) instead of stopping at the first one; each
// test binary prints the counts at the end and exits 1 on any failure.
#ifndef TFHVD_TESTS_CORE_CHECK_H_
#define TFHVD_TESTS_CORE_CHECK_H_

#include <cstdio>

namespace {

int g_passed = 0, g_failed = 0;
int g_rank = 0;  // set by the test once the backend knows it

}  // namespace

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (cond) {                                                                       \
      ++g_passed;                                                                     \
    } else {                                                                          \
      ++g_failed;                                                                     \
      std::fprintf(stderr, "rank %d: FAILED %s:%d: %s\n", g_rank, __FILE__, __LINE__, \
                   #cond);                                                            \
    }                                                                                 \
  } while (0)

#endif  // TFHVD_TESTS_CORE_CHECK_H_

// What the harnesses in tests/fuzz share: a check that stops the run with
// the broken property (libFuzzer saves the input as a crash-* file).
#ifndef KILN_TESTS_FUZZ_FUZZ_CHECK_H_
#define KILN_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

// A property the parser promises for every input it accepts.
#define KILN_FUZZ_CHECK(cond)                                                               \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

#endif  // KILN_TESTS_FUZZ_FUZZ_CHECK_H_

// Progress of a long run (kiln build, kiln verify), for progress lines.
#ifndef KILN_PROGRESS_H_
#define KILN_PROGRESS_H_

#include <cstdint>

namespace kiln {

struct Progress {
  uint64_t done = 0, total = 0;  // items (images, records) done, of all
  uint64_t bytes = 0;            // bytes written (build) or checksummed (verify) so far
  double seconds = 0;            // since the start
  bool final = false;            // the last update
};

}  // namespace kiln

#endif  // KILN_PROGRESS_H_

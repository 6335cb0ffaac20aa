// The launcher's environment (internal): the rank, world size and local rank
// that torchrun (or any launcher that follows it) sets, read by one rule for
// kiln train and the Python package.
#ifndef KILN_SRC_CORE_LAUNCH_ENV_H_
#define KILN_SRC_CORE_LAUNCH_ENV_H_

#include "kiln/status.h"

namespace kiln {

struct LaunchEnvironment {
  bool launched = false;  // WORLD_SIZE is set
  int rank = 0;           // RANK: 0 <= rank < world_size
  int world_size = 1;     // WORLD_SIZE: 1 .. 65536
  int local_rank = 0;     // LOCAL_RANK: the rank on this machine (its GPU); 0 when unset
};

// Reads RANK, WORLD_SIZE and LOCAL_RANK. Without WORLD_SIZE: one process
// (rank 0 of 1, local rank 0), whatever RANK says. Returns InvalidArgument
// naming the variable and its value when one is set but is not a decimal
// number in its range (RANK is required when WORLD_SIZE > 1).
Status ReadLaunchEnvironment(LaunchEnvironment* out);

}  // namespace kiln

#endif  // KILN_SRC_CORE_LAUNCH_ENV_H_

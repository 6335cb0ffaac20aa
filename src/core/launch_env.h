// The launcher's environment (internal): the rank, world size and local rank
// that torchrun (or any launcher that follows it) sets, read by one rule for
// kiln train and the Python package.
#ifndef KILN_SRC_CORE_LAUNCH_ENV_H_
#define KILN_SRC_CORE_LAUNCH_ENV_H_

#include "kiln/status.h"

namespace kiln {

struct LaunchEnvironment {
  int rank = 0;         // RANK: 0 <= rank < world
  int world = 1;        // WORLD_SIZE; 1: not distributed (unset or 1)
  int local_rank = -1;  // LOCAL_RANK (its GPU on this machine), -1 when unset
};

// Reads RANK, WORLD_SIZE and LOCAL_RANK. Without WORLD_SIZE, or with 1, one
// process (rank 0 of 1) whatever RANK says; LOCAL_RANK is read whenever it
// is set. Returns InvalidArgument naming the variable and its value when one
// is not a decimal number in its range (RANK is required, below
// WORLD_SIZE, when WORLD_SIZE > 1).
Status ReadLaunchEnvironment(LaunchEnvironment* out);

// The launcher's variable `name` as a decimal number in lo..hi (MASTER_PORT,
// ...). InvalidArgument "NAME is not set" or "NAME=value is not a number in
// lo..hi".
Status LaunchVariable(const char* name, long lo, long hi, long* out);

}  // namespace kiln

#endif  // KILN_SRC_CORE_LAUNCH_ENV_H_

// The launcher's environment (internal): the rank, world size and local rank
// that torchrun (or any launcher that follows it) sets, read by one rule for
// kiln train and the Python package; and the environment kiln starts its
// LibTorch processes in, which a Python training loop can start in too.
#ifndef KILN_SRC_CORE_LAUNCH_ENV_H_
#define KILN_SRC_CORE_LAUNCH_ENV_H_

#include <string>
#include <utility>
#include <vector>

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

// The variables kiln train and kiln-train's commands are started with when
// they are unset, read by libraries before main (libgomp, glibc):
//  * OMP_WAIT_POLICY=PASSIVE: LibTorch's OpenMP threads wait for work by
//    sleeping, not by spinning. With the default (spinning) wait, two
//    intra-op threads on a 2-core machine that other processes also use
//    trained the benchmark CNN 2.5x slower than one thread (each spun
//    through its time slice at every barrier while the other waited to be
//    scheduled); with passive waits two threads were no slower than one
//    there, and faster on an idle machine.
//  * GLIBC_TUNABLES: glibc's malloc keeps the memory a training step frees
//    for the next step. By default it hands freed blocks back to the kernel
//    (blocks above its mmap threshold are unmapped, the top of the heap is
//    trimmed), so every step's activations and gradients fault in fresh,
//    zeroed pages: on the CPU that was the larger part of the step. Here
//    blocks up to 32 MB (the largest mmap threshold glibc accepts) come from
//    the heap, and the heap is never trimmed; larger ones are still mapped
//    and unmapped. Measured (issue 26; 1 thread, bf16, thread CPU time per
//    step): built-in cnn 28x28 batch 128 114 -> 64 ms, resnet18 64x64 batch
//    128 847 -> 586 ms, resnet18 224x224 batch 32 5045 -> 1967 ms, peak RSS
//    +2-7%. The price: the process keeps its peak heap until it exits.
// Python reaches it as kiln.train_environment().
const std::vector<std::pair<std::string, std::string>>& TorchProcessEnvironment();

}  // namespace kiln

#endif  // KILN_SRC_CORE_LAUNCH_ENV_H_

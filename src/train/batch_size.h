// --batch-size auto (internal to kiln::train, reached by its tests): the
// search over batch sizes, separated from LibTorch, and what a trial must
// count that it cannot measure.
#ifndef KILN_SRC_TRAIN_BATCH_SIZE_H_
#define KILN_SRC_TRAIN_BATCH_SIZE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "kiln/train/trainer.h"

namespace kiln::train {

struct BatchTrial {
  int64_t batch = 0;
  bool out_of_memory = false;
  double samples_per_second = 0;
  int64_t peak_bytes = 0;  // peak memory of the trial
  std::string note;        // why the search stopped here, if it did
  Status error;            // the trial failed otherwise (bad data): the search ends with it
};

// Tries batch sizes first, 2*first, ... up to `max_batch` with `trial`
// until one runs out of memory, needs more than `budget` bytes, or gains
// less than 5% samples/s over the best so far. Returns the batch with the
// best samples/s among those that fit (at least `first` is required to
// fit: InvalidArgument otherwise) - the fastest that fits, not the largest:
// a doubling that is under 5% faster is not worth its memory. A trial with
// an error ends the search with that error. `table` gets every trial.
using BatchTrialFn = std::function<BatchTrial(int64_t batch)>;
Status SearchBatchSize(int64_t first, int64_t max_batch, int64_t budget, const BatchTrialFn& trial,
                       int64_t* chosen, std::vector<BatchTrial>* table);

// The bytes of optimizer state that training will hold for `trainable_bytes`
// bytes of trainable parameters: SGD with momentum one buffer like them,
// without momentum none; AdamW two (exp_avg, exp_avg_sq). The batch-size
// trials run before the optimizer exists, so this is added to each trial's
// measured peak.
int64_t OptimizerStateBytes(const TrainOptions& o, int64_t trainable_bytes);

}  // namespace kiln::train

#endif  // KILN_SRC_TRAIN_BATCH_SIZE_H_

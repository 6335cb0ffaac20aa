// Learning-rate schedules (internal to kiln::train, reached by its tests).
#ifndef KILN_SRC_TRAIN_OPTIMIZER_H_
#define KILN_SRC_TRAIN_OPTIMIZER_H_

#include <cstdint>

#include "kiln/train/trainer.h"

namespace kiln::train {

// The learning rate of optimizer step `step` (0-based) of `total`, for a
// base rate `lr` (schedule, warm-up; see TrainOptions). Pure.
double ScheduledLr(const TrainOptions& o, double lr, int64_t step, int64_t steps_per_epoch,
                   int64_t total_steps);

}  // namespace kiln::train

#endif  // KILN_SRC_TRAIN_OPTIMIZER_H_

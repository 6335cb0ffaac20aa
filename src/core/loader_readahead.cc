// kiln::Loader's read-ahead (loader_impl.h): for a cache not in memory, a
// thread asks the kernel for the next records of the epoch's order within a
// byte budget, and each epoch starts by sampling whether its records are
// resident.
#include <algorithm>
#include <mutex>

#include "core/fault_guard.h"
#include "core/loader_impl.h"

namespace kiln {

uint64_t Loader::Impl::FilledFrontier() const {
  uint64_t f = next_claim_;
  for (size_t s = 0; s < state_.size(); ++s)
    if (state_[s] == SlotState::kFilling) f = std::min(f, slot_batch_[s]);
  return f;
}

uint64_t Loader::Impl::BytesAhead() const {
  const uint64_t f = FilledFrontier();
  if (ra_pos_ <= f * opt_.batch_size) return 0;
  return ra_total_ - ra_cum_[f % kReadAheadBatches];
}

void Loader::Impl::AdvanceReadAhead(uint64_t pos) {
  const uint64_t b = opt_.batch_size;
  for (uint64_t next = (ra_pos_ / b + 1) * b; next <= pos; next += b)
    ra_cum_[(next / b) % kReadAheadBatches] = ra_total_;
  ra_pos_ = pos;
}

bool Loader::Impl::ReadAheadCanStep(uint64_t generation) const {
  return active_ && ra_on_ && generation == ra_generation_ && ra_pos_ < ep_per_rank_ &&
         ra_pos_ / opt_.batch_size + 1 < FilledFrontier() + kReadAheadBatches;
}

bool Loader::Impl::EpochResident(uint64_t from) {
  const uint64_t n = ep_per_rank_ - from;
  bool resident = true;
  for (uint64_t k = 0; k < std::min(n, kResidencySamples) && resident; ++k) {
    const uint64_t idx = order_[from + k * n / std::min(n, kResidencySamples)];
    const uint8_t* p = nullptr;
    uint64_t size = 0;
    Status st;
    if (!GuardedRead([&] { st = ra_txn_->Locate(idx, &p, &size); }, nullptr) || !st.ok())
      resident = false;  // the workers will meet the problem and report it
    else
      resident = ra_advisor_->Resident(p, size);
  }
  ra_txn_->Reset();
  return resident;
}

void Loader::Impl::ReadAhead() {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t generation = 0;
  for (;;) {
    ra_cv_.wait(lock, [&] {
      return stop_ || (active_ && generation != ra_generation_) || ReadAheadCanStep(generation);
    });
    if (stop_) return;
    if (generation != ra_generation_) {  // a new epoch (StartEpoch judged it)
      generation = ra_generation_;
      continue;
    }
    // The next record: where it lies (LMDB's tree pages only), then, when
    // the budget has room, the request for its bytes.
    const uint64_t pos = ra_pos_;
    const uint64_t idx = order_[pos];
    ra_busy_ = true;
    lock.unlock();
    const uint8_t* p = nullptr;
    uint64_t size = 0;
    Status st;
    const bool located =
        GuardedRead([&] { st = ra_txn_->Locate(idx, &p, &size); }, nullptr) && st.ok();
    lock.lock();
    if (!located) {
      // The worker that copies the record reports what is wrong with it.
      ra_on_ = false;
    } else {
      ra_cv_.wait(lock, [&] {
        return stop_ || generation != ra_generation_ || size > ra_budget_ ||
               BytesAhead() + size <= ra_budget_;
      });
    }
    bool ask = false;
    if (located && !stop_ && generation == ra_generation_ && ra_pos_ == pos) {
      const uint64_t frontier = FilledFrontier() * opt_.batch_size;
      if (pos < frontier) {
        AdvanceReadAhead(frontier);  // the workers got there first
      } else {
        // A record larger than the whole budget is left to the workers.
        ask = size <= ra_budget_;
        if (ask) ra_total_ += size;
        AdvanceReadAhead(pos + 1);
      }
    }
    lock.unlock();
    if (ask) ra_advisor_->WillNeed(p, size);
    ra_txn_->Reset();
    lock.lock();
    ra_busy_ = false;
    if (starting_) cv_.notify_all();
  }
}

}  // namespace kiln

#include "core/memcpy_floor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace kiln {

Status MeasureMemcpyFloor(const CacheReader* reader, const std::vector<uint64_t>& order,
                          uint64_t batch, int threads, const std::vector<void*>& ring, int reps,
                          double* samples_per_s) {
  *samples_per_s = 0;
  if (order.empty() || batch == 0 || threads < 1 || ring.empty()) return Status::OK();
  const uint64_t sample = reader->record_bytes();
  std::vector<const uint8_t*> src(order.size());
  auto txn = reader->BeginRead();
  for (size_t i = 0; i < order.size(); ++i) {
    RecordView v;
    KILN_RETURN_IF_ERROR(txn->Get(order[i], &v));
    src[i] = v.data;
  }
  const uint64_t batches = (order.size() + batch - 1) / batch;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> th;
    for (int w = 0; w < threads; ++w)
      th.emplace_back([&, w] {
        for (uint64_t b = w; b < batches; b += threads) {
          uint8_t* dst = static_cast<uint8_t*>(ring[b % ring.size()]);
          const uint64_t end = std::min<uint64_t>(order.size(), (b + 1) * batch);
          for (uint64_t i = b * batch; i < end; ++i)
            std::memcpy(dst + (i - b * batch) * sample, src[i], sample);
        }
      });
    for (auto& t : th) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) *samples_per_s = std::max(*samples_per_s, order.size() / s);
  }
  return Status::OK();
}

}  // namespace kiln

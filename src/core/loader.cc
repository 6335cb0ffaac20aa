#include "kiln/loader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/fault_guard.h"
#include "core/loader_impl.h"
#include "core/loader_output.h"
#include "core/page_cache.h"
#include "core/sample_transform.h"
#include "kiln/shuffle.h"

namespace kiln {

namespace {

// SplitMix64: the seed mixer for per-epoch and per-sample random streams.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

using internal::ImageSpec;
using internal::UsesWriter;

Status Loader::Impl::Init() {
  const Manifest& m = reader_->manifest();
  if (opt_.batch_size == 0) return Status::InvalidArgument("loader: batch size must be > 0");
  if (opt_.workers < 1) return Status::InvalidArgument("loader: need at least one worker");
  if (opt_.world_size < 1 || opt_.rank < 0 || opt_.rank >= opt_.world_size)
    return Status::InvalidArgument("loader: rank " + std::to_string(opt_.rank) +
                                   " outside world size " + std::to_string(opt_.world_size));
  if (slots_.empty()) return Status::InvalidArgument("loader: no batch slots");
  if (m.count == 0) return Status::InvalidArgument(reader_->dir() + ": the cache is empty");
  KILN_RETURN_IF_ERROR(LoaderOutputShape(m, opt_, &out_shape_));
  KILN_RETURN_IF_ERROR(LoaderOutputDType(m, opt_, &out_dtype_));
  uint64_t slot_bytes = 0;  // the caller's to allocate; checks max_crop against crop
  KILN_RETURN_IF_ERROR(LoaderSlotBytes(m, opt_, &slot_bytes));
  elem_ = DTypeSize(m.dtype);
  in_shape_ = m.shape;
  crop_ = opt_.crop;
  max_crop_ = std::max(opt_.crop, opt_.max_crop);
  sample_bytes_ = out_shape_.NumElements() * DTypeSize(out_dtype_);
  if (UsesWriter(m, opt_)) {
    std::vector<double> mean, std;
    if (out_dtype_ != DType::kUint8)
      KILN_RETURN_IF_ERROR(InputNormalization(m, reader_->dir(), &mean, &std));
    // The largest stored image (its max_shape) and output: every
    // buffer is grown once, here, not per sample.
    const FieldSpec image = ImageSpec(m);
    const int max_h = image.ndim == 3 ? static_cast<int>(image.max_dims[1]) : 1;
    const int max_w = image.ndim == 3 ? static_cast<int>(image.max_dims[2]) : 1;
    const int max_out =
        static_cast<int>(std::max<uint32_t>({max_crop_, out_shape_.dims[1], out_shape_.dims[2]}));
    for (int i = 0; i < opt_.workers; ++i) {
      writers_.push_back(std::make_unique<internal::SampleWriter>(
          static_cast<int>(out_shape_.dims[0]), out_dtype_, mean, std));
      writers_.back()->Reserve(max_h, max_w, max_out);
      if (image.codec != Codec::kRaw)
        decoders_.push_back(std::make_unique<internal::EncodedImageReader>());
    }
  }
  // A whole epoch (one that starts after no samples: StartEpoch's skip).
  per_rank_ = PerRank(m.count);
  batches_ = BatchesFor(per_rank_);
  // Transactions are made here, not in the workers: a worker that starts
  // late (on a busy machine) must not allocate after warm-up.
  for (int i = 0; i < opt_.workers; ++i) txns_.push_back(reader_->BeginRead());
  // What ReadTxn::Read keeps besides the image payload: a record's header
  // and its other fields.
  headers_.assign(opt_.workers, std::vector<uint8_t>(reader_->read_header_bytes()));
  // The other fields, when the slots take them.
  if (!slots_.front().fields.empty()) {
    KILN_RETURN_IF_ERROR(LoaderFields(m, opt_, &fields_));
    for (const BatchSlot& slot : slots_)
      if (slot.fields.size() != fields_.size())
        return Status::InvalidArgument("loader: slots of " + std::to_string(slot.fields.size()) +
                                       " fields, the cache's records have " +
                                       std::to_string(fields_.size()) +
                                       " besides the image and the label");
    field_writers_.resize(opt_.workers);
    for (auto& fw : field_writers_) fw.Reserve(static_cast<int>(std::max(max_crop_, 1u)));
  }
  ra_budget_ =
      opt_.readahead_bytes == kAutoReadAhead ? DefaultReadAheadBytes() : opt_.readahead_bytes;
  if (ra_budget_ > 0) {
    // Cold epochs read a record whole before a crop or flip copies it.
    if ((opt_.crop > 0 || opt_.random_flip || !writers_.empty()) && reader_->record_bytes() > 0)
      scratch_.assign(opt_.workers, std::vector<uint8_t>(reader_->record_bytes()));
    ra_txn_ = reader_->BeginRead();
    ra_advisor_ = MakePageAdvisor();
    ra_cum_.assign(kReadAheadBatches, 0);
  }
  for (int i = 0; i < opt_.workers; ++i) threads_.emplace_back([this, i] { Work(i); });
  if (ra_budget_ > 0) ra_thread_ = std::thread([this] { ReadAhead(); });
  return Status::OK();
}

uint64_t Loader::Impl::PerRank(uint64_t n) const {
  const uint64_t w = static_cast<uint64_t>(opt_.world_size);
  return (opt_.drop_last && n % w != 0) ? n / w : (n + w - 1) / w;
}

uint64_t Loader::Impl::BatchesFor(uint64_t per_rank) const {
  return opt_.drop_last ? per_rank / opt_.batch_size
                        : (per_rank + opt_.batch_size - 1) / opt_.batch_size;
}

std::vector<uint64_t> Loader::Impl::Order(uint64_t epoch, uint64_t skip) const {
  const uint64_t n = reader_->size();
  std::vector<uint64_t> all(n);
  for (uint64_t i = 0; i < n; ++i) all[i] = i;
  // kiln's one seeded shuffle (kiln/shuffle.h), seeded per epoch.
  if (opt_.shuffle) SeededShuffle(&all, Mix(opt_.seed ^ Mix(epoch + 0x51ED270B7A3Full)));
  skip = std::min(skip, n);
  const uint64_t rest = n - skip;
  const uint64_t w = static_cast<uint64_t>(opt_.world_size);
  const uint64_t per_rank = PerRank(rest);
  const uint64_t total = per_rank * w;
  std::vector<uint64_t> mine;
  mine.reserve(per_rank);
  for (uint64_t k = static_cast<uint64_t>(opt_.rank); k < total; k += w)
    mine.push_back(all[skip + k % rest]);  // wrap-around padding
  return mine;
}

Status Loader::Impl::StartEpoch(uint64_t epoch, uint64_t start, uint64_t skip) {
  std::unique_lock<std::mutex> lock(mu_);
  for (SlotState s : state_)
    if (s == SlotState::kInUse)
      return Status::InvalidArgument("loader: StartEpoch with a slot still in use");
  // Workers claim no more of the old epoch and finish what they are filling.
  active_ = false;
  ++ra_generation_;  // the read-ahead drops what it was doing
  ra_cv_.notify_all();
  starting_ = true;
  cv_.wait(lock, [&] {
    return !ra_busy_ && std::none_of(state_.begin(), state_.end(),
                                     [](SlotState s) { return s == SlotState::kFilling; });
  });
  starting_ = false;
  order_ = Order(epoch, skip);
  ep_per_rank_ = order_.size();
  ep_batches_ = BatchesFor(ep_per_rank_);
  skip_ = std::min<uint64_t>(skip, reader_->size());
  if (start > ep_batches_) start = ep_batches_;
  epoch_ = epoch;
  next_claim_ = next_consume_ = start;
  ra_pos_ = start * opt_.batch_size;
  // Cold or not, judged from a sample of the epoch's records before any
  // worker starts (the read-ahead thread is idle: active_ is false).
  ra_on_ = ra_budget_ > 0 && ra_pos_ < ep_per_rank_ && !EpochResident(ra_pos_);
  ra_total_ = 0;
  if (!ra_cum_.empty()) ra_cum_[start % kReadAheadBatches] = 0;
  std::fill(state_.begin(), state_.end(), SlotState::kFree);
  failed_ = Status::OK();
  active_ = true;
  lock.unlock();
  cv_.notify_all();
  ra_cv_.notify_all();
  return Status::OK();
}

Status Loader::Impl::SetResolution(uint32_t crop) {
  std::lock_guard<std::mutex> lock(mu_);
  for (SlotState st : state_)
    if (st == SlotState::kInUse || st == SlotState::kFilling)
      return Status::InvalidArgument(
          "loader: SetResolution with a batch still held or being filled: call it between "
          "epochs");
  if (crop == crop_) return Status::OK();
  if (crop > max_crop_)
    return Status::InvalidArgument("loader: resolution " + std::to_string(crop) +
                                   " is larger than the " + std::to_string(max_crop_) +
                                   " the slots were sized for (max_crop)");
  Shape shape;
  LoaderOptions o = opt_;
  o.crop = crop;
  KILN_RETURN_IF_ERROR(LoaderOutputShape(reader_->manifest(), o, &shape));
  // Workers claim nothing until StartEpoch.
  active_ = false;
  std::vector<LoaderField> fields;
  if (!fields_.empty()) KILN_RETURN_IF_ERROR(LoaderFields(reader_->manifest(), o, &fields));
  opt_.crop = crop_ = crop;
  out_shape_ = shape;
  if (!fields_.empty()) fields_ = std::move(fields);
  sample_bytes_ = out_shape_.NumElements() * DTypeSize(out_dtype_);
  return Status::OK();
}

Status Loader::Impl::Next(Batch* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  if (!active_ || next_consume_ >= ep_batches_) return Status::NotFound("end of epoch");
  const uint64_t b = next_consume_;
  const size_t s = b % slots_.size();
  if (state_[s] == SlotState::kInUse)  // waiting would never end
    return Status::InvalidArgument(
        "loader: batch " + std::to_string(b) + " goes into slot " + std::to_string(s) +
        ", which the consumer still holds: Release() a batch before asking for more than " +
        std::to_string(slots_.size()) + " at once");
  cv_.wait(lock, [&] { return state_[s] == SlotState::kReady && slot_batch_[s] == b; });
  if (!slot_status_[s].ok()) {
    // The epoch's stream ends here: the slot goes back, workers stop, and
    // the position stays at this batch, so StartEpoch(position) - after a
    // repair, say - loads it again. Until then Next() repeats the error.
    failed_ = slot_status_[s];
    state_[s] = SlotState::kFree;
    active_ = false;
    return failed_;
  }
  state_[s] = SlotState::kInUse;
  ++next_consume_;
  out->slot = static_cast<int>(s);
  out->epoch = epoch_;
  out->index = b;
  out->size = BatchSize(b);
  return Status::OK();
}

void Loader::Impl::Release(int slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot >= 0 && static_cast<size_t>(slot) < state_.size() && state_[slot] == SlotState::kInUse)
      state_[slot] = SlotState::kFree;
  }
  cv_.notify_all();
}

LoaderPosition Loader::Impl::Position() const {
  std::lock_guard<std::mutex> lock(mu_);
  LoaderPosition p;
  p.epoch = epoch_;
  p.batch = next_consume_;
  p.skip = skip_;
  p.consumed = Consumed(skip_, next_consume_);
  return p;
}

uint64_t Loader::Impl::Consumed(uint64_t skip, uint64_t batch) const {
  return ConsumedSamples(reader_->size(), skip, batch, opt_.batch_size,
                         static_cast<uint64_t>(opt_.world_size));
}

uint64_t Loader::Impl::EpochBatches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ep_batches_;
}

uint64_t Loader::Impl::BatchSize(uint64_t b) const {
  return std::min<uint64_t>(opt_.batch_size, ep_per_rank_ - b * opt_.batch_size);
}

void Loader::Impl::Work(int worker) {
  ReadTxn* txn = txns_[worker].get();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] {
      return stop_ || (active_ && next_claim_ < ep_batches_ &&
                       state_[next_claim_ % slots_.size()] == SlotState::kFree);
    });
    if (stop_) return;
    const uint64_t b = next_claim_++;
    const size_t s = b % slots_.size();
    state_[s] = SlotState::kFilling;
    slot_batch_[s] = b;
    const bool cold = ra_on_;
    lock.unlock();
    // order_ and epoch_ stay put meanwhile: StartEpoch waits for kFilling.
    Status st = Fill(txn, b, slots_[s], cold, worker);
    txn->Reset();
    lock.lock();
    slot_status_[s] = st;
    state_[s] = SlotState::kReady;
    cv_.notify_all();
    ra_cv_.notify_all();  // the filled frontier may have moved
  }
}

Status Loader::Impl::Fill(ReadTxn* txn, uint64_t b, const BatchSlot& slot, bool cold, int worker) {
  const uint64_t first = b * opt_.batch_size, count = BatchSize(b);
  uint8_t* dst = static_cast<uint8_t*>(slot.data);
  const bool direct = opt_.crop == 0 && !opt_.random_flip && writers_.empty();
  Status st;
  volatile uint64_t reading = order_[first];  // the record a fault interrupts
  std::string fault;
  const bool finished = GuardedRead(
      [&] {
        uint8_t* header = headers_[worker].data();
        for (uint64_t j = 0; j < count; ++j) {
          const uint64_t idx = order_[first + j];
          reading = idx;
          uint8_t* out = dst + j * sample_bytes_;
          RecordView v;
          if (cold) {
            uint8_t* into = direct ? out : scratch_.empty() ? nullptr : scratch_[worker].data();
            st = txn->Read(idx, header, into, &v, opt_.verify_checksums);
          } else {
            st = txn->Get(idx, &v, opt_.verify_checksums);
          }
          if (!st.ok()) return;
          slot.labels[j] = v.label;
          int64_t* box = slot.boxes != nullptr ? slot.boxes + j * 5 : nullptr;
          internal::SamplePlan plan;
          if (v.data != out || box != nullptr || !slot.fields.empty()) {
            st = CopySample(v, idx, out, worker, box, &plan);
            if (!st.ok()) return;
          }
          for (size_t k = 0; k < slot.fields.size(); ++k) {
            const LoaderField& f = fields_[k];
            const FieldSlot& fs = slot.fields[k];
            st = field_writers_[worker].Write(
                f, v.fields[f.index], idx, plan, static_cast<int>(v.shape.dims[1]),
                static_cast<int>(v.shape.dims[2]), static_cast<int>(out_shape_.dims[1]),
                static_cast<int>(out_shape_.dims[2]),
                static_cast<uint8_t*>(fs.data) + j * f.sample_bytes,
                fs.lengths != nullptr ? fs.lengths + j * f.variable_dims : nullptr);
            if (!st.ok()) {
              st = Status::Corruption(reader_->dir() + ": " + st.message());
              return;
            }
          }
        }
      },
      &fault);
  if (!finished) return FaultStatus(reading, fault);
  return st;
}

Status Loader::Impl::FaultStatus(uint64_t index, const std::string& fault) const {
  const Manifest& m = reader_->manifest();
  const int si = m.ShardFor(index);
  const std::string shard = si >= 0 ? reader_->dir() + "/" + m.shards[si].file : reader_->dir();
  return Status::Corruption(shard + ": record " + std::to_string(index) + ": " + fault +
                            "; check it with kiln verify, then rebuild (kiln build --force) "
                            "or restore the shard");
}

Status Loader::Impl::CopySample(const RecordView& v, uint64_t idx, uint8_t* dst, int worker,
                                int64_t* box, internal::SamplePlan* plan_out) {
  const bool chw = v.shape.ndim == 3;
  const int h = chw ? static_cast<int>(v.shape.dims[1]) : 1;
  const int w = chw ? static_cast<int>(v.shape.dims[2]) : 1;
  if (!chw && (!writers_.empty() || opt_.crop > 0 || opt_.random_flip))
    return Status::Corruption(reader_->dir() + ": record " + std::to_string(idx) +
                              ": its image is " + v.shape.ToString() + ", not CHW");
  const uint32_t size = opt_.crop_kind == CropKind::kWindow && opt_.crop == 0 ? 0 : crop_;
  const internal::SamplePlan plan = internal::PlanSample(opt_, size, epoch_, idx, h, w);
  *plan_out = plan;
  if (box != nullptr) {
    box[0] = plan.box.top;
    box[1] = plan.box.left;
    box[2] = plan.box.height;
    box[3] = plan.box.width;
    box[4] = plan.flip ? 1 : 0;
  }
  if (!writers_.empty() && v.codec != Codec::kRaw) {
    // Only the box, decoded at the scale it allows, then written as a
    // stored image would be.
    internal::EncodedImageReader& d = *decoders_[worker];
    internal::SamplePlan p = plan;
    KILN_RETURN_IF_ERROR(d.Decode({v.data, v.bytes, v.dtype, v.shape, v.codec}, opt_.dct_scaling,
                                  reader_->dir() + ": record " + std::to_string(idx) +
                                      ": its image",
                                  &p));
    writers_[worker]->Write(d.planes(), d.height(), d.width(), p,
                            static_cast<int>(out_shape_.dims[1]),
                            static_cast<int>(out_shape_.dims[2]), dst);
    return Status::OK();
  }
  if (!writers_.empty()) {
    writers_[worker]->Write(v.data, h, w, plan, static_cast<int>(out_shape_.dims[1]),
                            static_cast<int>(out_shape_.dims[2]), dst);
    return Status::OK();
  }
  if (opt_.crop == 0 && !opt_.random_flip) {
    if (v.data != dst) std::memcpy(dst, v.data, sample_bytes_);
    return Status::OK();
  }
  const uint32_t c = in_shape_.dims[0];
  const uint32_t oh = out_shape_.dims[1], ow = out_shape_.dims[2];
  const uint32_t y0 = static_cast<uint32_t>(plan.box.top);
  const uint32_t x0 = static_cast<uint32_t>(plan.box.left);
  const uint8_t* src = v.data;
  const size_t row = static_cast<size_t>(ow) * elem_;
  for (uint32_t ch = 0; ch < c; ++ch) {
    for (uint32_t y = 0; y < oh; ++y) {
      const uint8_t* s = src + ((static_cast<size_t>(ch) * h + y0 + y) * w + x0) * elem_;
      uint8_t* d = dst + (static_cast<size_t>(ch) * oh + y) * row;
      if (!plan.flip) {
        std::memcpy(d, s, row);
      } else {
        for (uint32_t x = 0; x < ow; ++x)
          std::memcpy(d + x * elem_, s + (ow - 1 - x) * elem_, elem_);
      }
    }
  }
  return Status::OK();
}

Loader::Loader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Loader::~Loader() = default;

Status Loader::Open(const CacheReader* reader, const LoaderOptions& options,
                    std::vector<BatchSlot> slots, std::unique_ptr<Loader>* out) {
  auto impl = std::make_unique<Impl>(reader, options, std::move(slots));
  KILN_RETURN_IF_ERROR(impl->Init());
  out->reset(new Loader(std::move(impl)));
  return Status::OK();
}

const Shape& Loader::sample_shape() const { return impl_->out_shape(); }
uint64_t Loader::sample_bytes() const { return impl_->sample_bytes(); }
uint64_t Loader::samples_per_epoch() const { return impl_->per_rank(); }
uint64_t Loader::batches_per_epoch() const { return impl_->batches(); }
uint64_t Loader::epoch_batches() const { return impl_->EpochBatches(); }

uint64_t ConsumedSamples(uint64_t n, uint64_t skip, uint64_t batches, uint64_t batch_size,
                         uint64_t world_size) {
  const uint64_t taken = batches * batch_size * world_size;
  return std::min(n, skip + taken);
}
uint64_t Loader::readahead_bytes() const { return impl_->readahead_budget(); }
Status Loader::SetResolution(uint32_t crop) { return impl_->SetResolution(crop); }
Status Loader::StartEpoch(uint64_t epoch, uint64_t start_batch, uint64_t skip) {
  return impl_->StartEpoch(epoch, start_batch, skip);
}
Status Loader::Next(Batch* out) { return impl_->Next(out); }
void Loader::Release(int slot) { impl_->Release(slot); }
LoaderPosition Loader::position() const { return impl_->Position(); }
uint64_t Loader::Consumed(uint64_t skip, uint64_t batch) const {
  return impl_->Consumed(skip, batch);
}
std::vector<uint64_t> Loader::EpochOrder(uint64_t epoch, uint64_t skip) const {
  return impl_->Order(epoch, skip);
}

}  // namespace kiln

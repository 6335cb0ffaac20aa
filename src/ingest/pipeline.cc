#include "pipeline.h"

#include <tbb/parallel_pipeline.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

namespace kiln::ingest {

namespace {

constexpr size_t kChunk = 16;  // items per pipeline token

struct Chunk {
  size_t begin = 0, end = 0;  // positions of the job's order
  std::vector<uint8_t> payload;  // kChunk records of record_bytes
  // Whole images (record_bytes 0): each record's payload and shape.
  std::vector<std::vector<uint8_t>> whole;
  std::vector<Shape> shapes;
  std::vector<Codec> codecs;  // how each whole image is stored (--encode)
  // Masks (--masks): each record's mask and its shape.
  std::vector<std::vector<uint8_t>> masks;
  std::vector<Shape> mask_shapes;
  std::vector<Status> status;
  // The stages done with the chunk. oneTBB passes a token from stage to
  // stage with synchronization of its own, which ThreadSanitizer cannot see
  // (oneTBB is not instrumented): each stage ends with a release store here
  // and the next begins with an acquire load, so that it can. Two atomic
  // operations per kChunk items.
  std::atomic<int> stages_done{0};
  void Published(int stage) { stages_done.store(stage, std::memory_order_release); }
  void Receive() const { (void)stages_done.load(std::memory_order_acquire); }
};

// One call of a serial stage: the stage's calls come one at a time, in
// order, but on any thread, and oneTBB's ordering of them is invisible to
// ThreadSanitizer (see Chunk::stages_done); an acquire at the start and a
// release at the end of each call show it.
class SerialCall {
 public:
  explicit SerialCall(std::atomic<uint64_t>* calls) : calls_(calls) {
    (void)calls_->load(std::memory_order_acquire);
  }
  ~SerialCall() { calls_->fetch_add(1, std::memory_order_release); }
  SerialCall(const SerialCall&) = delete;
  SerialCall& operator=(const SerialCall&) = delete;

 private:
  std::atomic<uint64_t>* calls_;
};

// Chunks reused from token to token.
class ChunkPool {
 public:
  explicit ChunkPool(uint64_t record_bytes) : record_bytes_(record_bytes) {}
  Chunk* Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (pool_.empty()) {
      auto c = std::make_unique<Chunk>();
      c->payload.resize(kChunk * record_bytes_);
      if (record_bytes_ == 0) {
        c->whole.resize(kChunk);
        c->shapes.resize(kChunk);
        c->codecs.resize(kChunk);
      }
      c->masks.resize(kChunk);
      c->mask_shapes.resize(kChunk);
      c->status.resize(kChunk);
      return c.release();
    }
    Chunk* c = pool_.back().release();
    pool_.pop_back();
    return c;
  }
  void Give(Chunk* c) {
    std::lock_guard<std::mutex> lock(mu_);
    pool_.emplace_back(c);
  }
  // Called once every chunk is back (parallel_pipeline returned): the last
  // stage gave each back under this lock, so taking it orders what was done
  // to the chunks before what the caller does next, for ThreadSanitizer.
  void AllReturned() { std::lock_guard<std::mutex> lock(mu_); }

 private:
  const uint64_t record_bytes_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Chunk>> pool_;
};

}  // namespace

Status RunPipeline(const PipelineJob& job, CacheWriter* writer, RejectLog* rejects,
                   const std::function<void(const PipelineCounts&)>& tick, PipelineCounts* counts) {
  const SourceList& src = *job.sources;
  const std::vector<size_t>& order = *job.order;
  const Preprocessor& pre = *job.preprocessor;
  const uint64_t record_bytes = pre.record_bytes();
  const int threads = job.threads > 0 ? job.threads : tbb::this_task_arena::max_concurrency();
  // Enough chunks in flight that decoding goes on while the serial writer
  // commits (8 per thread: 3.6 s instead of 4.4 s for the 4000-image corpus
  // on 2 threads; 16 per thread gains nothing more).
  const size_t tokens = static_cast<size_t>(std::max(4, threads * 8));
  ChunkPool pool(record_bytes);
  size_t next = job.start;
  Status failure;
  std::atomic<bool> failed{false};  // `failure` set: read no more input, decode no more
  *counts = PipelineCounts();
  auto last_tick = std::chrono::steady_clock::now();

  std::atomic<uint64_t> read_calls{0}, write_calls{0};  // SerialCall
  auto read_stage = [&](tbb::flow_control& fc) -> Chunk* {
    const SerialCall call(&read_calls);
    if (next >= order.size() || failed) {
      fc.stop();
      return nullptr;
    }
    Chunk* c = pool.Take();
    c->begin = next;
    c->end = std::min(next + kChunk, order.size());
    next = c->end;
    c->Published(1);
    return c;
  };
  auto decode_stage = [&](Chunk* c) -> Chunk* {
    c->Receive();
    Preprocessor::Scratch scratch;
    for (size_t k = c->begin; k < c->end; ++k) {
      Status& s = c->status[k - c->begin];
      if (rejects->before().count(k) || failed) {
        s = Status::NotFound("skip");
        continue;
      }
      const size_t j = k - c->begin;
      s = pre.whole() ? pre.TryProcessWhole(src.root, src.items[order[k]], &scratch, &c->whole[j],
                                            &c->shapes[j], &c->codecs[j])
                      : pre.TryProcess(src.root, src.items[order[k]], &scratch,
                                       c->payload.data() + j * record_bytes);
      if (s.ok() && pre.masks())
        s = pre.TryProcessMask(src.items[order[k]], &scratch, &c->masks[j], &c->mask_shapes[j]);
    }
    c->Published(2);
    return c;
  };
  auto write_stage = [&](Chunk* c) {
    const SerialCall call(&write_calls);
    c->Receive();
    for (size_t k = c->begin; k < c->end && failure.ok(); ++k) {
      const Status& s = c->status[k - c->begin];
      const SourceItem& it = src.items[order[k]];
      if (s.ok()) {
        const size_t j = k - c->begin;
        if (job.fields) {
          const FieldData image =
              pre.whole()
                  ? FieldData{pre.recipe_dtype(), c->shapes[j], c->whole[j].data(), c->codecs[j],
                              c->codecs[j] == Codec::kRaw ? 0 : c->whole[j].size()}
                          : FieldData{pre.recipe_dtype(), pre.shape(),
                                      c->payload.data() + j * record_bytes};
          FieldData fields[kMaxBuildFields];
          const int n = BuildRecordFields(
              src, pre, it, image, {DType::kUint8, c->mask_shapes[j], c->masks[j].data()}, fields);
          failure = writer->AppendFields(writer->next_index(), fields, n);
          if (failure.ok()) counts->bytes += pre.whole() ? c->whole[j].size() : record_bytes;
        } else {
          failure =
              writer->Append(writer->next_index(), it.label, c->payload.data() + j * record_bytes);
          if (failure.ok()) counts->bytes += record_bytes;
        }
        if (failure.ok()) ++counts->written;  // a record that failed to append is not written
      } else if (!rejects->before().count(k)) {
        ++counts->rejected;
        const std::string path = src.root + "/" + it.rel_path;
        failure = rejects->Add(k, path, s.message(), Retryable(s));
        if (job.strict && failure.ok())
          failure =
              Status::Corruption(rejects->entries().back().Text() + " (rejected under --strict)");
      }
    }
    if (!failure.ok()) failed = true;
    pool.Give(c);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_tick > std::chrono::milliseconds(500)) {
      last_tick = now;
      tick(*counts);
    }
  };

  InArena(job.threads, [&] {
    tbb::parallel_pipeline(
        tokens, tbb::make_filter<void, Chunk*>(tbb::filter_mode::serial_in_order, read_stage) &
                    tbb::make_filter<Chunk*, Chunk*>(tbb::filter_mode::parallel, decode_stage) &
                    tbb::make_filter<Chunk*, void>(tbb::filter_mode::serial_in_order, write_stage));
  });
  // Every stage call is over. Acquire what the last ones released - the
  // pool's lock, the serial stages' counters - so that ThreadSanitizer sees
  // that too before this thread reads what they wrote.
  pool.AllReturned();
  (void)read_calls.load(std::memory_order_acquire);
  (void)write_calls.load(std::memory_order_acquire);
  return failure;
}

int BuildRecordFields(const SourceList& src, const Preprocessor& pre, const SourceItem& it,
                      const FieldData& image, const FieldData& mask, FieldData* out) {
  int n = 0;
  out[n++] = image;
  if (pre.masks()) out[n++] = mask;
  if (src.multi_label) {
    Shape ls;
    ls.ndim = 1;
    ls.dims[0] = static_cast<uint32_t>(it.labels.size());
    out[n++] = {DType::kInt64, ls, it.labels.data()};
  } else {
    out[n++] = {DType::kInt64, Shape{}, &it.label};
  }
  if (!src.target_names.empty()) {
    Shape ts;
    ts.ndim = 1;
    ts.dims[0] = static_cast<uint32_t>(it.targets.size());
    out[n++] = {DType::kFloat32, ts, it.targets.data()};
  }
  return n;
}

Status RemakeRecord(const SourceList& src, const Preprocessor& pre, const SourceItem& item,
                    Preprocessor::Scratch* scratch, RemadeRecord* out) {
  Codec codec = Codec::kRaw;
  if (pre.whole()) {
    KILN_RETURN_IF_ERROR(
        pre.TryProcessWhole(src.root, item, scratch, &out->image, &out->image_shape, &codec));
  } else {
    out->image.resize(pre.record_bytes());
    out->image_shape = pre.shape();
    KILN_RETURN_IF_ERROR(pre.TryProcess(src.root, item, scratch, out->image.data()));
  }
  if (pre.masks())
    KILN_RETURN_IF_ERROR(pre.TryProcessMask(item, scratch, &out->mask, &out->mask_shape));
  out->num_fields =
      BuildRecordFields(src, pre, item,
                        {pre.recipe_dtype(), out->image_shape, out->image.data(), codec,
                         codec == Codec::kRaw ? 0 : out->image.size()},
                        {DType::kUint8, out->mask_shape, out->mask.data()}, out->fields);
  return Status::OK();
}

bool BuildWritesFields(const SourceList& src, const Preprocessing& recipe) {
  return recipe.whole || src.multi_label || !src.target_names.empty() || !recipe.masks.empty();
}

std::vector<FieldSpec> BuildFieldSpecs(const SourceList& src, const Preprocessor& pre,
                                       std::string* label_field) {
  FieldSpec image;
  image.name = "image";
  image.dtype = pre.recipe_dtype();
  image.ndim = 3;
  image.codec = pre.codec();
  image.dims[0] = pre.shape().dims[0];
  for (int i = 1; i < 3; ++i)
    image.dims[i] = pre.whole() ? FieldSpec::kVariableDim : int64_t{pre.shape().dims[i]};
  std::vector<FieldSpec> out = {image};
  if (pre.masks()) {  // the image's H x W, class indices
    FieldSpec mask;
    mask.name = kMaskFieldName;
    mask.dtype = DType::kUint8;
    mask.ndim = 2;
    mask.dims[0] = image.dims[1];
    mask.dims[1] = image.dims[2];
    out.push_back(mask);
  }
  FieldSpec label;
  label.dtype = DType::kInt64;
  if (src.multi_label) {
    label.name = "labels";
    label.ndim = 1;
    label.dims[0] = FieldSpec::kVariableDim;
    label_field->clear();
  } else {
    label.name = "label";
    *label_field = "label";
  }
  out.push_back(label);
  if (!src.target_names.empty()) {
    FieldSpec target;
    target.name = "target";
    target.dtype = DType::kFloat32;
    target.ndim = 1;
    target.dims[0] = static_cast<int64_t>(src.target_names.size());
    out.push_back(target);
  }
  return out;
}

}  // namespace kiln::ingest

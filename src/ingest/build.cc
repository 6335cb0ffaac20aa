// BuildCache: the oneTBB pipeline from source files to a kiln cache.
#include "kiln/ingest/build.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_pipeline.h>
#include <tbb/task_arena.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>

#include "core/file_util.h"
#include "kiln/cache_reader.h"
#include "kiln/cache_writer.h"
#include "kiln/image/decode.h"
#include "kiln/image/transform.h"
#include "kiln/manifest.h"
#include "kiln/verify.h"
#include "sources_tsv.h"

namespace kiln::ingest {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr size_t kChunk = 16;            // items per pipeline token
constexpr const char* kBuildState = "build.json";  // the options of the build in progress
constexpr const char* kRejectLog = "rejects.partial";
constexpr const char* kRejects = "rejects.tsv";

image::DType ImageDType(DType d) {
  switch (d) {
    case DType::kUint8: return image::DType::kUint8;
    case DType::kFloat16: return image::DType::kFloat16;
    case DType::kFloat32: return image::DType::kFloat32;
  }
  return image::DType::kUint8;
}

// A rejects.tsv / rejects.partial line ("path<TAB>reason") as "path: reason".
std::string RejectText(std::string line) {
  const size_t tab = line.find('\t');
  if (tab != std::string::npos) line.replace(tab, 1, ": ");
  return line;
}

Status ReadFileBytes(const std::string& path, std::vector<uint8_t>* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::IOError("cannot stat");
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t off = 0;
  while (off < out->size()) {
    ssize_t n = ::read(fd, out->data() + off, out->size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return Status::IOError("read failed");
    }
    off += static_cast<size_t>(n);
  }
  ::close(fd);
  return Status::OK();
}


// Everything about one output cache of a build.
struct Plan {
  std::string dir;
  std::string split;                 // "", "train" or "val"
  std::vector<size_t> order;         // item positions in record order (this part's slice)
  uint64_t first = 0;                // global index of order[0] (a part: its slice's start)
  uint64_t files = 0;                // sources of the whole split, all parts together
};

class Builder {
 public:
  Builder(const BuildOptions& o, const ProgressFn& p, const InfoFn& i, BuildResult* r)
      : opt_(o), progress_(p), info_(i), res_(r) {}

  Status Run() {
    KILN_RETURN_IF_ERROR(CheckOptions());
    KILN_RETURN_IF_ERROR(opt_.list_file.empty() ? ListImageFolder(opt_.src, &src_)
                                                : ReadSourceList(opt_.src, opt_.list_file, &src_));
    spec_.resize_shorter = opt_.resize;
    spec_.crop = opt_.crop;
    spec_.squash_w = opt_.size_w;
    spec_.squash_h = opt_.size_h;
    KILN_RETURN_IF_ERROR(PlanShape());
    KILN_RETURN_IF_ERROR(ChooseNormalization());
    std::vector<Plan> plans = MakePlans();
    for (Plan& p : plans) p.files = p.order.size();
    if (opt_.num_parts > 1) {
      // Part i of N: the i-th contiguous slice of every split's record order,
      // into DIR/part-IIIII-of-NNNNN; kiln merge joins them.
      for (Plan& p : plans) {
        const uint64_t n = p.order.size(), parts = static_cast<uint64_t>(opt_.num_parts);
        const uint64_t lo = n * opt_.part / parts, hi = n * (opt_.part + 1) / parts;
        p.order = std::vector<size_t>(p.order.begin() + lo, p.order.begin() + hi);
        p.first = lo;
        p.dir += "/" + PartDirName(opt_.part, opt_.num_parts);
        if (p.order.empty())
          return Status::InvalidArgument(p.dir + ": part " + std::to_string(opt_.part) + " of " +
                                         std::to_string(opt_.num_parts) + " gets no sources (" +
                                         std::to_string(n) + " in all); use fewer parts");
      }
    }
    for (Plan& p : plans) KILN_RETURN_IF_ERROR(opt_.repair ? RepairOne(p) : BuildOne(p));
    return Status::OK();
  }

 private:
  Status CheckOptions() {
    if (opt_.num_parts < 1 || opt_.part < 0 || opt_.part >= opt_.num_parts)
      return Status::InvalidArgument("--part " + std::to_string(opt_.part) + " of --num-parts " +
                                     std::to_string(opt_.num_parts) +
                                     ": need 0 <= part < num-parts");
    if (opt_.num_parts > 1 && opt_.repair)
      return Status::InvalidArgument("--repair works on a whole cache: merge the parts first "
                                     "(kiln merge), then repair the merged cache");
    if (opt_.channels != 1 && opt_.channels != 3)
      return Status::InvalidArgument("--channels must be 1 or 3");
    if ((opt_.size_w > 0) != (opt_.size_h > 0))
      return Status::InvalidArgument("--size needs both width and height (WxH)");
    if (opt_.size_w > 0 && opt_.resize > 0)
      return Status::InvalidArgument("--size and --resize exclude each other");
    if (opt_.val_fraction < 0 || opt_.val_fraction >= 1)
      return Status::InvalidArgument("--val-fraction must be in [0, 1)");
    return Status::OK();
  }

  // The record shape: fixed by --crop or --size; otherwise that of the first
  // image, which every other image must then share.
  Status PlanShape() {
    int w = 0, h = 0;
    if (opt_.crop > 0) {
      w = h = opt_.crop;
    } else if (opt_.size_w > 0) {
      w = opt_.size_w;
      h = opt_.size_h;
    } else {
      // The first image that decodes fixes the size.
      for (const SourceItem& it : src_.items) {
        std::vector<uint8_t> bytes;
        if (!ReadFileBytes(src_.root + "/" + it.rel_path, &bytes).ok()) continue;
        int iw, ih;
        if (!image::ReadHeader(bytes.data(), bytes.size(), it.rel_path, &iw, &ih).ok()) continue;
        if (!image::PlanGeometry(iw, ih, spec_, &w, &h).ok()) continue;
        break;
      }
      if (w == 0) return Status::InvalidArgument(src_.root + ": no readable image to size the cache");
    }
    shape_.ndim = 3;
    shape_.dims = {static_cast<uint32_t>(opt_.channels), static_cast<uint32_t>(h),
                   static_cast<uint32_t>(w), 0};
    record_bytes_ = shape_.NumElements() * DTypeSize(opt_.dtype);
    return Status::OK();
  }

  // Decodes one source into `dst` (record_bytes_), or says why not.
  Status Process(const SourceItem& it, std::vector<uint8_t>* scratch, image::ImageU8* decoded,
                 image::ImageU8* resized, void* dst, bool normalize) {
    const std::string path = src_.root + "/" + it.rel_path;
    KILN_RETURN_IF_ERROR(ReadFileBytes(path, scratch));
    if (scratch->empty()) return Status::Corruption("empty file");
    int iw = 0, ih = 0;
    KILN_RETURN_IF_ERROR(image::ReadHeader(scratch->data(), scratch->size(), it.rel_path, &iw, &ih));
    if (static_cast<int64_t>(iw) * ih > opt_.max_pixels)
      return Status::InvalidArgument(std::to_string(iw) + "x" + std::to_string(ih) +
                                     " is over --max-pixels " + std::to_string(opt_.max_pixels));
    image::DecodeOptions dopt;
    dopt.channels = opt_.channels;
    dopt.max_pixels = opt_.max_pixels;
    KILN_RETURN_IF_ERROR(image::PlanResize(iw, ih, spec_, &dopt.min_width, &dopt.min_height));
    KILN_RETURN_IF_ERROR(image::Decode(scratch->data(), scratch->size(), it.rel_path, dopt, decoded));
    KILN_RETURN_IF_ERROR(image::ResizeAndCrop(*decoded, spec_, resized));
    if (resized->width != static_cast<int>(shape_.dims[2]) ||
        resized->height != static_cast<int>(shape_.dims[1]))
      return Status::InvalidArgument("size " + std::to_string(resized->width) + "x" +
                                     std::to_string(resized->height) + " differs from the cache's " +
                                     std::to_string(shape_.dims[2]) + "x" +
                                     std::to_string(shape_.dims[1]) +
                                     "; pass --resize/--crop or --size");
    if (!normalize) {
      std::memcpy(dst, resized->pixels.data(), resized->pixels.size());
      return Status::OK();
    }
    return image::ToCHW(*resized, ImageDType(opt_.dtype), mean_f_.data(), std_f_.data(), dst);
  }

  Status ChooseNormalization() {
    const int c = opt_.channels;
    if (opt_.norm == "none") {
      mean_.assign(c, 0.0);
      std_.assign(c, 1.0);
    } else if (opt_.norm == "imagenet") {
      if (c != 3) return Status::InvalidArgument("--norm imagenet needs --channels 3");
      mean_ = {0.485, 0.456, 0.406};
      std_ = {0.229, 0.224, 0.225};
    } else if (opt_.norm == "explicit") {
      if (static_cast<int>(opt_.mean.size()) != c || static_cast<int>(opt_.std.size()) != c)
        return Status::InvalidArgument("--mean and --std need " + std::to_string(c) + " values each");
      mean_ = opt_.mean;
      std_ = opt_.std;
    } else if (opt_.norm == "auto") {
      KILN_RETURN_IF_ERROR(ComputeStats());
    } else {
      return Status::InvalidArgument("--norm must be none, imagenet or auto (or give --mean/--std)");
    }
    for (double s : std_)
      if (!(s > 0)) return Status::InvalidArgument("--std values must be > 0");
    mean_f_.assign(mean_.begin(), mean_.end());
    std_f_.assign(std_.begin(), std_.end());
    return Status::OK();
  }

  // Exact per-channel statistics of the preprocessed pixels: integer sums,
  // so the result does not depend on the thread count.
  Status ComputeStats() {
    std::vector<size_t> pick(src_.items.size());
    std::iota(pick.begin(), pick.end(), 0);
    if (opt_.stats_sample > 0 && opt_.stats_sample < pick.size()) {
      std::mt19937_64 rng(12345);
      std::shuffle(pick.begin(), pick.end(), rng);
      pick.resize(opt_.stats_sample);
      std::sort(pick.begin(), pick.end());
    }
    const int c = opt_.channels;
    std::mutex mu;
    std::vector<uint64_t> sum(c, 0), sq(c, 0);
    uint64_t pixels = 0;
    Arena([&] {
      tbb::parallel_for(tbb::blocked_range<size_t>(0, pick.size(), 8), [&](const auto& r) {
        std::vector<uint8_t> scratch, buf(shape_.NumElements());
        image::ImageU8 dec, res;
        std::vector<uint64_t> ls(c, 0), lq(c, 0);
        uint64_t lp = 0;
        for (size_t k = r.begin(); k != r.end(); ++k) {
          if (!Process(src_.items[pick[k]], &scratch, &dec, &res, buf.data(), false).ok()) continue;
          for (size_t p = 0; p < res.pixels.size(); ++p) {
            const uint64_t v = res.pixels[p];
            ls[p % c] += v;
            lq[p % c] += v * v;
          }
          lp += res.pixels.size() / c;
        }
        std::lock_guard<std::mutex> lock(mu);
        for (int i = 0; i < c; ++i) {
          sum[i] += ls[i];
          sq[i] += lq[i];
        }
        pixels += lp;
      });
    });
    if (pixels == 0) return Status::InvalidArgument("--norm auto: no image could be read");
    mean_.resize(c);
    std_.resize(c);
    for (int i = 0; i < c; ++i) {
      const double m = static_cast<double>(sum[i]) / pixels;
      const double var = static_cast<double>(sq[i]) / pixels - m * m;
      mean_[i] = m / 255.0;
      std_[i] = std::sqrt(std::max(var, 0.0)) / 255.0;
      if (std_[i] == 0) std_[i] = 1.0;
    }
    return Status::OK();
  }

  template <typename F>
  void Arena(F&& f) {
    if (opt_.threads > 0) {
      tbb::task_arena arena(opt_.threads);
      arena.execute(f);
    } else {
      f();
    }
  }

  std::vector<Plan> MakePlans() {
    std::vector<Plan> plans;
    auto ordered = [&](std::vector<size_t> v) {
      if (opt_.shuffle_seed >= 0) {
        std::mt19937_64 rng(static_cast<uint64_t>(opt_.shuffle_seed));
        // Fisher-Yates with our own index draw, so the order is the same
        // with every standard library.
        for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng() % i]);
      }
      return v;
    };
    if (opt_.val_fraction <= 0) {
      std::vector<size_t> all(src_.items.size());
      std::iota(all.begin(), all.end(), 0);
      plans.push_back({opt_.out, "", ordered(all)});
      return plans;
    }
    std::vector<size_t> train, val;
    for (size_t i = 0; i < src_.items.size(); ++i) {
      const std::string& p = src_.items[i].rel_path;
      // A stable hash of the path: adding files never moves another file.
      const double u = static_cast<double>(XXH3_64bits(p.data(), p.size()) >> 11) / 9007199254740992.0;
      (u < opt_.val_fraction ? val : train).push_back(i);
    }
    plans.push_back({opt_.out + "/train", "train", ordered(train)});
    plans.push_back({opt_.out + "/val", "val", ordered(val)});
    return plans;
  }

  json Preprocessing(const Plan& p) const {
    json j;
    j["source"] = {{"root", src_.root}, {"layout", src_.layout}, {"files", p.files},
                   {"digest", SourceDigest(src_)}};
    // A part's own record; kiln merge drops it, so that a merged cache has
    // the preprocessing of a one-part build.
    if (opt_.num_parts > 1) j["part"] = {{"index", opt_.part}, {"of", opt_.num_parts}};
    if (!opt_.list_file.empty()) j["source"]["list_file"] = fs::absolute(opt_.list_file).string();
    j["resize"] = opt_.resize;
    j["crop"] = opt_.crop;
    j["size"] = {opt_.size_w, opt_.size_h};
    j["interpolation"] = "bilinear, antialiased (PIL/torchvision)";
    j["channels"] = opt_.channels;
    j["dtype"] = DTypeName(opt_.dtype);
    j["norm"] = opt_.norm;
    j["mean"] = mean_;
    j["std"] = std_;
    j["normalized"] = opt_.dtype != DType::kUint8;
    j["max_pixels"] = opt_.max_pixels;
    j["shuffle_seed"] = opt_.shuffle_seed;
    j["val_fraction"] = opt_.val_fraction;
    j["split"] = p.split;
    j["stats_sample"] = opt_.stats_sample;
    j["libraries"] = {{"kiln", KilnVersion()}};
    for (const auto& [name, version] : image::CodecVersions()) j["libraries"][name] = version;
    return j;
  }

  // Says which top-level preprocessing fields differ.
  static std::string Diff(const json& a, const json& b) {
    if (!a.is_object()) return "the recorded options are unreadable";
    std::set<std::string> keys;
    for (auto it = a.begin(); it != a.end(); ++it) keys.insert(it.key());
    for (auto it = b.begin(); it != b.end(); ++it) keys.insert(it.key());
    std::string out;
    for (const auto& k : keys) {
      const json va = a.contains(k) ? a[k] : json(), vb = b.contains(k) ? b[k] : json();
      if (va != vb) out += (out.empty() ? "" : "; ") + k + ": " + va.dump() + " -> " + vb.dump();
    }
    return out;
  }

  Status BuildOne(const Plan& plan) {
    const auto t0 = std::chrono::steady_clock::now();
    const json pre = Preprocessing(plan);
    res_->caches.push_back(plan.dir);
    bool resume = false;
    Manifest old;
    if (ReadManifest(plan.dir, &old).ok()) {
      const json old_pre = json::parse(old.preprocessing_json, nullptr, false);
      if (old_pre == pre) {
        res_->up_to_date = true;
        info_(plan.dir + ": up to date (" + std::to_string(old.count) +
              " records; same sources and options) - nothing to do");
        if (opt_.strict) {  // --strict holds for a cache built without it, too
          std::ifstream rj(plan.dir + "/" + kRejects);
          std::string line;
          if (std::getline(rj, line) && std::getline(rj, line) && !line.empty())
            return Status::Corruption(RejectText(line) + " (rejected when the cache was built; under "
                                      "--strict every input must be written: fix or remove it, "
                                      "then rebuild with --force)");
        }
        return Status::OK();
      }
      if (!opt_.force)
        return Status::Stale(plan.dir + ": holds a cache made from other sources or options (" +
                             Diff(old_pre, pre) + "); pass --force to rebuild it");
      info_(plan.dir + ": sources or options changed, rebuilding (--force): " + Diff(old_pre, pre));
    } else {
      std::string state;
      std::ifstream in(plan.dir + "/" + kBuildState);
      if (in) {
        std::stringstream ss;
        ss << in.rdbuf();
        const json prev = json::parse(ss.str(), nullptr, false);
        if (prev == pre && !opt_.force) {
          resume = true;
        } else if (opt_.force) {
          info_(plan.dir + ": discarding an unfinished build and starting over (--force)");
        } else {
          return Status::Stale(plan.dir + ": holds an unfinished build with other sources or options (" +
                               Diff(prev, pre) + "); pass --force to start over");
        }
      }
    }
    // A fresh start discards what an earlier build left - under the
    // writer's directory lock, after the manifest is gone, so that neither
    // a running build nor an interrupted discard can leave DIR looking
    // complete (CacheWriter::Open runs this).
    auto discard = [&]() -> Status {
      if (resume) return Status::OK();
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(plan.dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(kShardPrefix, 0) == 0 || n == kRejectLog || n == kRejects || n == kBuildState ||
            n == kSourcesTsv)
          fs::remove(e.path(), ec);
      }
      if (ec) return Status::IOError(plan.dir + ": cannot clear (" + ec.message() + ")");
      return WriteFileAtomic(plan.dir, kBuildState, std::string(kBuildState) + ".tmp", pre.dump(2) + "\n");
    };

    WriterOptions wo;
    wo.dtype = opt_.dtype;
    wo.shape = shape_;
    wo.shard_size = opt_.shard_size;
    wo.resume = resume;
    wo.first_index = plan.first;
    wo.prepare = discard;
    std::unique_ptr<CacheWriter> writer;
    const Status opened = CacheWriter::Open(wo, plan.dir, &writer);
    if (resume && (opened.IsCorruption() || opened.IsInvalidArgument()))
      return Status::Corruption(opened.message() + "; the interrupted build cannot be resumed: "
                                "pass --force to discard it and start over");
    KILN_RETURN_IF_ERROR(opened);
    // Rejections already logged by the interrupted run, by source position.
    std::set<size_t> rejected_before;
    std::vector<std::string> reject_lines;
    if (resume) {
      std::ifstream rl(plan.dir + "/" + kRejectLog);
      std::string line;
      while (std::getline(rl, line)) {
        const size_t tab = line.find('\t');
        if (tab == std::string::npos) continue;
        rejected_before.insert(std::stoull(line.substr(0, tab)));
        reject_lines.push_back(line.substr(tab + 1));
      }
    }
    // The interrupted run rejected inputs: --strict fails on the first, as
    // it would have in one go.
    if (opt_.strict && !reject_lines.empty())
      return Status::Corruption(RejectText(reject_lines.front()) +
                                " (rejected by the interrupted run; under --strict every input "
                                "must be written: fix or remove it and build again)");
    // Find the first source position not yet written or rejected.
    size_t start = 0;
    for (uint64_t good = 0; start < plan.order.size() && good < writer->next_index() - plan.first;
         ++start)
      if (!rejected_before.count(start)) ++good;
    while (start < plan.order.size() && rejected_before.count(start)) ++start;
    if (resume) {
      res_->resumed = true;
      info_(plan.dir + ": resuming an interrupted build at record " +
            std::to_string(writer->next_index()) + " (" + std::to_string(start) + " of " +
            std::to_string(plan.order.size()) + " sources done)");
    }
    const int fd_log = ::open((plan.dir + "/" + kRejectLog).c_str(),
                              O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_log < 0) return Status::IOError(plan.dir + "/" + kRejectLog + ": cannot write");

    struct Chunk {
      size_t begin = 0, end = 0;
      std::vector<uint8_t> payload;
      std::vector<Status> status;
    };
    const int threads = opt_.threads > 0 ? opt_.threads : tbb::this_task_arena::max_concurrency();
    // Enough chunks in flight that decoding goes on while the serial writer
    // commits (8 per thread: 3.6 s instead of 4.4 s for the 4000-image corpus
    // on 2 threads; 16 per thread gains nothing more).
    const size_t tokens = static_cast<size_t>(std::max(4, threads * 8));
    std::mutex pool_mu;
    std::vector<std::unique_ptr<Chunk>> pool;
    auto take = [&] {
      std::lock_guard<std::mutex> lock(pool_mu);
      if (pool.empty()) {
        auto c = std::make_unique<Chunk>();
        c->payload.resize(kChunk * record_bytes_);
        c->status.resize(kChunk);
        return c.release();
      }
      Chunk* c = pool.back().release();
      pool.pop_back();
      return c;
    };
    auto give = [&](Chunk* c) {
      std::lock_guard<std::mutex> lock(pool_mu);
      pool.emplace_back(c);
    };

    size_t next = start;
    std::set<size_t> rejected_now;
    Status failure;
    std::atomic<bool> failed{false};  // `failure` set: read no more input, decode no more
    uint64_t written = 0, rejected = 0;
    auto last_report = std::chrono::steady_clock::now();
    auto report = [&](bool final) {
      Progress bp;
      bp.done = written + rejected + start;
      bp.total = plan.order.size();
      bp.bytes = written * record_bytes_;
      bp.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bp.final = final;
      progress_(plan.dir, bp);
    };
    Arena([&] {
      tbb::parallel_pipeline(
          tokens,
          tbb::make_filter<void, Chunk*>(tbb::filter_mode::serial_in_order,
                                         [&](tbb::flow_control& fc) -> Chunk* {
                                           if (next >= plan.order.size() || failed) {
                                             fc.stop();
                                             return nullptr;
                                           }
                                           Chunk* c = take();
                                           c->begin = next;
                                           c->end = std::min(next + kChunk, plan.order.size());
                                           next = c->end;
                                           return c;
                                         }) &
              tbb::make_filter<Chunk*, Chunk*>(
                  tbb::filter_mode::parallel,
                  [&](Chunk* c) -> Chunk* {
                    std::vector<uint8_t> scratch;
                    image::ImageU8 dec, res;
                    for (size_t k = c->begin; k < c->end; ++k) {
                      if (rejected_before.count(k) || failed) {
                        c->status[k - c->begin] = Status::NotFound("skip");
                        continue;
                      }
                      try {
                        c->status[k - c->begin] =
                            Process(src_.items[plan.order[k]], &scratch, &dec, &res,
                                    c->payload.data() + (k - c->begin) * record_bytes_, true);
                      } catch (const std::exception& e) {
                        c->status[k - c->begin] = Status::Corruption(e.what());
                      }
                    }
                    return c;
                  }) &
              tbb::make_filter<Chunk*, void>(
                  tbb::filter_mode::serial_in_order, [&](Chunk* c) {
                    for (size_t k = c->begin; k < c->end && failure.ok(); ++k) {
                      const Status& s = c->status[k - c->begin];
                      const SourceItem& it = src_.items[plan.order[k]];
                      if (s.ok()) {
                        failure = writer->Append(writer->next_index(), it.label,
                                                 c->payload.data() + (k - c->begin) * record_bytes_);
                        ++written;
                      } else if (!rejected_before.count(k)) {
                        ++rejected;
                        rejected_now.insert(k);
                        std::string reason = s.message();
                        for (char& ch : reason)
                          if (ch == '\t' || ch == '\n') ch = ' ';
                        const std::string line = src_.root + "/" + it.rel_path + "\t" + reason;
                        reject_lines.push_back(line);
                        const std::string rec = std::to_string(k) + "\t" + line + "\n";
                        if (::write(fd_log, rec.data(), rec.size()) < 0) {
                          failure = Status::IOError(plan.dir + "/" + kRejectLog + ": write failed");
                        }
                        if (opt_.strict && failure.ok())
                          failure = Status::Corruption(src_.root + "/" + it.rel_path + ": " + reason +
                                                       " (rejected under --strict)");
                      }
                    }
                    if (!failure.ok()) failed = true;
                    give(c);
                    const auto now = std::chrono::steady_clock::now();
                    if (now - last_report > std::chrono::milliseconds(500)) {
                      last_report = now;
                      report(false);
                    }
                  }));
    });
    ::close(fd_log);
    res_->written += writer->next_index() - plan.first;
    res_->rejected += reject_lines.size();
    res_->bytes += written * record_bytes_;
    if (!reject_lines.empty() && res_->first_reject.empty()) res_->first_reject = reject_lines[0];
    if (!failure.ok()) {
      (void)writer->Commit();  // keep what is good for a resume
      return failure;
    }
    // rejects.tsv lists every rejected file of the build, in source order.
    {
      std::string tsv = "path\treason\n";
      for (const auto& l : reject_lines) tsv += l + "\n";
      std::ofstream out(plan.dir + "/" + kRejects, std::ios::trunc);
      out << tsv;
      if (!out) return Status::IOError(plan.dir + "/" + kRejects + ": cannot write");
    }
    if (writer->next_index() == plan.first)
      return Status::Corruption(plan.dir + ": every input was rejected (see " + kRejects + ")");
    KILN_RETURN_IF_ERROR(WriteSourcesTsv(plan, rejected_before, rejected_now));
    Manifest m;
    m.classes = src_.classes;
    m.preprocessing_json = pre.dump();
    if (opt_.num_parts > 1) {
      m.part_index = opt_.part;
      m.part_count = opt_.num_parts;
    }
    KILN_RETURN_IF_ERROR(writer->Finish(&m));
    std::error_code ec;
    fs::remove(plan.dir + "/" + kBuildState, ec);
    fs::remove(plan.dir + "/" + kRejectLog, ec);
    res_->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report(true);
    return Status::OK();
  }

  // --repair: rewrites only the records that verify finds bad, from their
  // sources; everything else stays as it is.
  Status RepairOne(const Plan& plan) {
    const json pre = Preprocessing(plan);
    res_->caches.push_back(plan.dir);
    Manifest m;
    Status s = ReadManifest(plan.dir, &m);
    if (!s.ok())
      return Status::InvalidArgument(s.message() + "; --repair needs a finished cache (run the "
                                     "build without --repair to resume or rebuild it)");
    const json old_pre = json::parse(m.preprocessing_json, nullptr, false);
    if (old_pre != pre)
      return Status::InvalidArgument(plan.dir + ": --repair needs the original build's sources and "
                                     "arguments; they differ (" + Diff(old_pre, pre) + ")");
    VerifyReport rep;
    VerifyOptions vo;
    vo.threads = opt_.threads;
    KILN_RETURN_IF_ERROR(VerifyCache(plan.dir, vo, &rep));
    std::set<uint64_t> bad;
    for (const VerifyProblem& p : rep.problems) {
      // A record count or size that is off follows from records damaged or
      // deleted; the shards holding them are rewritten.
      const bool follows = p.what.rfind("shard holds", 0) == 0 ||
                           p.what.find("(modified)") != std::string::npos ||
                           p.what.find("digest differs") != std::string::npos;
      if (p.index < 0 && follows) continue;
      if (p.index < 0 || p.what.find("shard file missing") != std::string::npos ||
          p.what.find("outside the shard") != std::string::npos)
        return Status::Corruption(plan.dir + ": cannot repair record by record: " +
                                  (p.shard.empty() ? "" : p.shard + ": ") + p.what +
                                  "; rebuild with --force");
      bad.insert(static_cast<uint64_t>(p.index));
    }
    if (bad.empty() && !rep.clean())
      return Status::Corruption(plan.dir + ": no single record is at fault (" +
                                rep.problems[0].what + "); rebuild with --force");
    if (bad.empty()) {
      info_(plan.dir + ": verified clean, nothing to repair");
      res_->up_to_date = true;
      return Status::OK();
    }
    std::vector<RecordedSource> recorded;
    KILN_RETURN_IF_ERROR(ReadSourcesTsv(plan.dir + "/" + kSourcesTsv, &recorded));
    std::map<int64_t, const RecordedSource*> by_record;
    for (const auto& r : recorded)
      if (r.record >= 0) by_record[r.record] = &r;
    std::vector<std::vector<uint8_t>> payloads;
    std::vector<RecordFix> fixes;
    payloads.reserve(bad.size());
    for (uint64_t idx : bad) {
      auto it = by_record.find(static_cast<int64_t>(idx));
      if (it == by_record.end())
        return Status::Corruption(plan.dir + ": record " + std::to_string(idx) +
                                  " has no source in sources.tsv; rebuild with --force");
      payloads.emplace_back(record_bytes_);
      std::vector<uint8_t> scratch;
      image::ImageU8 dec, res;
      KILN_RETURN_IF_ERROR(Process(it->second->item, &scratch, &dec, &res, payloads.back().data(), true)
                               .WithContext("repairing record " + std::to_string(idx) + " from " +
                                            src_.root + "/" + it->second->item.rel_path));
      fixes.push_back({idx, it->second->item.label, payloads.back().data()});
    }
    KILN_RETURN_IF_ERROR(RewriteRecords(plan.dir, fixes));
    KILN_RETURN_IF_ERROR(VerifyCache(plan.dir, vo, &rep));
    if (!rep.clean())
      return Status::Corruption(plan.dir + ": still damaged after repair: " + rep.problems[0].what);
    std::string list;
    for (uint64_t idx : bad) list += (list.empty() ? "" : ", ") + std::to_string(idx);
    info_(plan.dir + ": repaired " + std::to_string(bad.size()) + " record(s) from their sources: " +
          list + "; the cache verifies clean");
    res_->written += bad.size();
    return Status::OK();
  }

  // sources.tsv: every source file of the build with its size and mtime,
  // and the record it became (-1: rejected or in the other split), so that
  // verify can say which files were added, removed or changed, and map a
  // record back to its file.
  Status WriteSourcesTsv(const Plan& plan, const std::set<size_t>& a, const std::set<size_t>& b) {
    std::vector<RecordedSource> sources(src_.items.size());
    for (size_t i = 0; i < src_.items.size(); ++i) sources[i].item = src_.items[i];
    int64_t next = static_cast<int64_t>(plan.first);
    for (size_t k = 0; k < plan.order.size(); ++k)
      if (!a.count(k) && !b.count(k)) sources[plan.order[k]].record = next++;
    return ingest::WriteSourcesTsv(plan.dir + "/" + kSourcesTsv, sources);
  }

 public:
  // Sets up preprocessing from a finished cache's manifest, for re-checks.
  Status InitFromManifest(const Manifest& m, const json& pre) {
    try {
      const json& src = pre.at("source");
      opt_.src = src.at("root").get<std::string>();
      opt_.list_file = src.value("list_file", std::string());
      opt_.resize = pre.at("resize").get<int>();
      opt_.crop = pre.at("crop").get<int>();
      opt_.size_w = pre.at("size").at(0).get<int>();
      opt_.size_h = pre.at("size").at(1).get<int>();
      opt_.channels = pre.at("channels").get<int>();
      KILN_RETURN_IF_ERROR(ParseDType(pre.at("dtype").get<std::string>(), &opt_.dtype));
      opt_.max_pixels = pre.at("max_pixels").get<int64_t>();
      mean_ = pre.at("mean").get<std::vector<double>>();
      std_ = pre.at("std").get<std::vector<double>>();
    } catch (const json::exception& e) {
      return Status::Corruption("manifest preprocessing lacks what a re-check needs (" +
                                std::string(e.what()) + "); was the cache made by kiln build?");
    }
    mean_f_.assign(mean_.begin(), mean_.end());
    std_f_.assign(std_.begin(), std_.end());
    spec_.resize_shorter = opt_.resize;
    spec_.crop = opt_.crop;
    spec_.squash_w = opt_.size_w;
    spec_.squash_h = opt_.size_h;
    shape_ = m.shape;
    record_bytes_ = shape_.NumElements() * DTypeSize(opt_.dtype);
    src_.root = opt_.src;
    return Status::OK();
  }
  Status ListSources(SourceList* out) const {
    return opt_.list_file.empty() ? ListImageFolder(opt_.src, out)
                                  : ReadSourceList(opt_.src, opt_.list_file, out);
  }
  Status Reprocess(const SourceItem& it, void* dst) {
    std::vector<uint8_t> scratch;
    image::ImageU8 dec, res;
    return Process(it, &scratch, &dec, &res, dst, true);
  }
  uint64_t record_bytes() const { return record_bytes_; }

 private:
  BuildOptions opt_;
  const ProgressFn& progress_;
  const InfoFn& info_;
  BuildResult* res_;
  SourceList src_;
  image::ResizeSpec spec_;
  Shape shape_;
  uint64_t record_bytes_ = 0;
  std::vector<double> mean_, std_;
  std::vector<float> mean_f_, std_f_;
};

}  // namespace

Status BuildCache(const BuildOptions& options, const ProgressFn& progress, const InfoFn& info,
                  BuildResult* result) {
  *result = BuildResult();
  ProgressFn p = progress ? progress : [](const std::string&, const Progress&) {};
  InfoFn i = info ? info : [](const std::string&) {};
  return Builder(options, p, i, result).Run();
}

}  // namespace kiln::ingest

namespace kiln::ingest {

Status VerifyWithSources(const std::string& dir, const VerifyOptions& options, uint64_t sample,
                         uint64_t seed, VerifyReport* report) {
  VerifyOptions core = options;
  if (core.level > VerifyLevel::kFull) core.level = VerifyLevel::kFull;
  KILN_RETURN_IF_ERROR(VerifyCache(dir, core, report));
  report->level = options.level;
  if (options.level <= VerifyLevel::kFull) return Status::OK();
  const auto t0 = std::chrono::steady_clock::now();
  auto problem = [&](int64_t index, const std::string& source, const std::string& what) {
    report->problems.push_back({index, "", source, what});
  };
  Manifest m;
  if (!ReadManifest(dir, &m).ok()) return Status::OK();  // already reported
  std::vector<RecordedSource> recorded;
  Status s = ReadSourcesTsv(dir + "/" + kSourcesTsv, &recorded);
  if (!s.ok()) {
    problem(-1, "", s.message() + "; cannot compare with the sources");
    return Status::OK();
  }
  std::map<std::string, const RecordedSource*> by_path;
  std::map<int64_t, const RecordedSource*> by_record;
  for (const auto& r : recorded) {
    by_path[r.item.rel_path] = &r;
    if (r.record >= 0) by_record[r.record] = &r;
  }
  // Name the source of every record-level problem found so far.
  for (auto& p : report->problems)
    if (p.index >= 0 && by_record.count(p.index) && p.source.empty())
      p.source = by_record[p.index]->item.rel_path;

  const json pre = json::parse(m.preprocessing_json, nullptr, false);
  BuildOptions bo;
  ProgressFn no_progress = [](const std::string&, const Progress&) {};
  InfoFn no_info = [](const std::string&) {};
  BuildResult unused;
  Builder builder(bo, no_progress, no_info, &unused);
  s = builder.InitFromManifest(m, pre);
  if (!s.ok()) {
    problem(-1, "", s.message());
    return Status::OK();
  }
  SourceList now;
  s = builder.ListSources(&now);
  if (!s.ok()) {
    problem(-1, "", "cannot list the sources again: " + s.message());
    return Status::OK();
  }
  std::set<std::string> seen;
  for (const SourceItem& it : now.items) {
    seen.insert(it.rel_path);
    auto f = by_path.find(it.rel_path);
    if (f == by_path.end()) {
      problem(-1, it.rel_path, "source file added since the build (the cache is stale)");
    } else if (f->second->item.size != it.size || f->second->item.mtime_ns != it.mtime_ns ||
               f->second->item.label != it.label) {
      problem(f->second->record, it.rel_path,
              "source file changed since the build (size, mtime or label; the cache is stale)");
    }
  }
  for (const auto& r : recorded)
    if (!seen.count(r.item.rel_path))
      problem(r.record, r.item.rel_path, "source file removed since the build (the cache is stale)");

  if (options.level >= VerifyLevel::kDeep && !by_record.empty()) {
    std::vector<int64_t> records;
    for (const auto& kv : by_record) records.push_back(kv.first);
    std::mt19937_64 rng(seed);
    std::shuffle(records.begin(), records.end(), rng);
    if (sample > 0 && sample < records.size()) records.resize(sample);
    std::sort(records.begin(), records.end());
    std::unique_ptr<CacheReader> reader;
    s = CacheReader::Open(dir, ReaderOptions(), &reader);
    if (s.ok()) {
      auto txn = reader->BeginRead();
      std::vector<uint8_t> buf(builder.record_bytes());
      for (int64_t rec : records) {
        const SourceItem& it = by_record[rec]->item;
        RecordView v;
        if (!txn->Get(static_cast<uint64_t>(rec), &v).ok()) continue;  // reported by full
        Status ps = builder.Reprocess(it, buf.data());
        if (!ps.ok()) {
          problem(rec, it.rel_path, "cannot preprocess the source again: " + ps.message());
        } else if (v.bytes != buf.size() || std::memcmp(v.data, buf.data(), buf.size()) != 0) {
          problem(rec, it.rel_path,
                  "preprocessing the source again gives different bytes than the record");
        }
      }
    }
  }
  std::stable_sort(report->problems.begin(), report->problems.end(),
                   [](const VerifyProblem& a, const VerifyProblem& b) { return a.index < b.index; });
  report->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

}  // namespace kiln::ingest

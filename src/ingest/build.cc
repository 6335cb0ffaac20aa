// BuildCache: plan -> journal -> pipeline -> finish, for each output cache.
#include "kiln/ingest/build.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>

#include "append_plan.h"
#include "duplicate_report.h"
#include "journal.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_writer.h"
#include "core/escape.h"
#include "kiln/image/decode.h"
#include "kiln/manifest.h"
#include "kiln/shuffle.h"
#include "pipeline.h"
#include "preprocessor.h"
#include "repair.h"
#include "sources_tsv.h"

namespace kiln::ingest {

namespace fs = std::filesystem;

namespace {

// Everything about one output cache of a build.
struct Plan {
  std::string dir;
  std::string split;          // "", "train" or "val"
  std::vector<size_t> order;  // item positions in record order (this part's slice)
  uint64_t first = 0;         // global index of order[0] (a part: its slice's start)
  uint64_t files = 0;         // sources of the whole split, all parts together
  const AppendPlan* append = nullptr;  // --append: the cache DIR holds and what is new
};

Status CheckOptions(const BuildOptions& o) {
  if (o.num_parts < 1 || o.part < 0 || o.part >= o.num_parts)
    return Status::InvalidArgument("--part " + std::to_string(o.part) + " of --num-parts " +
                                   std::to_string(o.num_parts) + ": need 0 <= part < num-parts");
  if (o.num_parts > 1 && o.repair)
    return Status::InvalidArgument(
        "--repair works on a whole cache: merge the parts first "
        "(kiln merge), then repair the merged cache");
  if (o.repair && (o.force || o.rebuild_if_changed))
    return Status::InvalidArgument(
        "--repair rewrites only the bad records of a cache; --force and --rebuild-if-changed "
        "rebuild it: give one of them");
  if (o.append && (o.force || o.rebuild_if_changed || o.repair || o.num_parts > 1))
    return Status::InvalidArgument(
        "--append adds new sources to a finished cache: it excludes --force, "
        "--rebuild-if-changed, --repair and --num-parts");
  if (o.channels != 1 && o.channels != 3)
    return Status::InvalidArgument("--channels must be 1 or 3");
  // What the recipe records must read back (Preprocessing::FromJson's ranges).
  if (o.resize < 0 || o.crop < 0 || o.size_w < 0 || o.size_h < 0)
    return Status::InvalidArgument("--resize, --crop and --size must not be negative");
  if (o.max_pixels < 1) return Status::InvalidArgument("--max-pixels must be at least 1");
  if ((o.size_w > 0) != (o.size_h > 0))
    return Status::InvalidArgument("--size needs both width and height (WxH)");
  if (o.size_w > 0 && o.resize > 0)
    return Status::InvalidArgument("--size and --resize exclude each other");
  if (o.max_side < 0 || o.shorter_side < 0)
    return Status::InvalidArgument("--max-side and --shorter-side must not be negative");
  if (o.max_side > 0 || o.shorter_side > 0) {
    if (o.resize > 0 || o.crop > 0 || o.size_w > 0)
      return Status::InvalidArgument(
          "--max-side/--shorter-side store each image whole, at its own size: they exclude "
          "--resize, --crop and --size (crop at load time instead)");
    if (o.max_side > 0 && o.shorter_side >= o.max_side)
      return Status::InvalidArgument(
          "--max-side must be larger than --shorter-side (as "
          "torchvision's Resize(size, max_size) requires)");
  }
  if (!o.encode.empty()) {
    if (o.encode != "jpeg" && o.encode != "auto")
      return Status::InvalidArgument("--encode " + o.encode + ": expected jpeg or auto");
    if (o.encode_quality < 1 || o.encode_quality > 100)
      return Status::InvalidArgument("--encode: JPEG quality " + std::to_string(o.encode_quality) +
                                     " outside 1..100");
    if (o.max_side == 0 && o.shorter_side == 0)
      return Status::InvalidArgument(
          "--encode stores whole images: give --max-side N and/or --shorter-side S (a cache of "
          "JPEGs is cropped and resized at load time)");
    if (o.dtype && *o.dtype != DType::kUint8)
      return Status::InvalidArgument(std::string("--encode stores uint8 pixels as JPEG, not ") +
                                     DTypeName(*o.dtype) + ": drop --dtype (or give uint8)");
  }
  if (!o.masks.empty() && !fs::is_directory(o.masks))
    return Status::InvalidArgument("--masks " + o.masks +
                                   ": not a directory (of PNG masks at the images' relative "
                                   "paths)");
  if (o.val_fraction < 0 || o.val_fraction >= 1)
    return Status::InvalidArgument("--val-fraction must be in [0, 1)");
  return Status::OK();
}

}  // namespace

DType RecordDType(const BuildOptions& o) {
  if (o.dtype) return *o.dtype;
  return o.max_side > 0 || o.shorter_side > 0 ? DType::kUint8 : DType::kFloat16;
}

namespace {

Rebuild RebuildOf(const BuildOptions& o) {
  if (o.force) return Rebuild::kAlways;
  return o.rebuild_if_changed ? Rebuild::kIfChanged : Rebuild::kNo;
}

class Builder {
 public:
  Builder(const BuildOptions& o, const ProgressFn& p, const InfoFn& i, BuildResult* r)
      : opt_(o), progress_(p), info_(i), res_(r) {}

  Status Run() {
    KILN_RETURN_IF_ERROR(CheckOptions(opt_));
    KILN_RETURN_IF_ERROR(CheckOutsideSources());
    KILN_RETURN_IF_ERROR(image::CheckDecoders());
    // OUT may lie inside SRC: its folder is not listed, so that a second
    // build does not take the first one's cache for a class.
    KILN_RETURN_IF_ERROR(ListSources(opt_.src, opt_.list_file, &src_, opt_.out));
    if (opt_.strict && !src_.rejected.empty())
      return Status::Corruption(src_.rejected[0].path + ": " + src_.rejected[0].reason +
                                " (rejected under --strict: fix it, or build without --strict)");
    recipe_ = BaseRecipe();
    KILN_RETURN_IF_ERROR(Preprocessor::PlanShape(recipe_, src_, &shape_));
    std::vector<AppendPlan> appends;
    if (opt_.append) KILN_RETURN_IF_ERROR(PlanAppends(&appends));
    KILN_RETURN_IF_ERROR(ChooseNormalization());
    if (opt_.append) KILN_RETURN_IF_ERROR(CheckAppendRecipe(appends.front().base));
    std::vector<Plan> plans = MakePlans();
    for (Plan& p : plans) p.files = p.order.size();
    for (size_t k = 0; k < appends.size(); ++k) {
      // Only the new sources, in record order.
      std::vector<bool> added(src_.items.size(), false);
      for (size_t pos : appends[k].added) added[pos] = true;
      std::vector<size_t> order;
      for (size_t pos : plans[k].order)
        if (added[pos]) order.push_back(pos);
      plans[k].order = std::move(order);
      plans[k].append = &appends[k];
    }
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
    first_dir_ = plans.front().dir;
    const Preprocessor pre(recipe_, shape_);
    for (Plan& p : plans) {
      const Preprocessing recipe = RecipeOf(p);
      KILN_RETURN_IF_ERROR(opt_.repair
                               ? RepairCache(p.dir, src_, recipe, pre, opt_.threads, info_, res_)
                               : BuildOne(p, recipe, pre));
    }
    // Duplicates need every record of every split: a part's are found by kiln merge.
    if (opt_.repair || opt_.num_parts > 1) return Status::OK();
    std::error_code ec;
    const std::string report = opt_.out + "/" + kDuplicatesTsvName;
    if (!built_any_ && fs::exists(report, ec)) return Status::OK();
    std::vector<SplitCache> caches;
    for (const Plan& p : plans) caches.push_back({p.split, p.dir});
    KILN_RETURN_IF_ERROR(ReportDuplicates(opt_.out, caches, opt_.threads, &res_->duplicates));
    res_->duplicates_file = report;
    return Status::OK();
  }

 private:
  // A cache written into the source folder itself would be taken for
  // sources by the next build: refused before anything is read or written.
  Status CheckOutsideSources() const {
    struct stat src, out;
    if (::stat(opt_.src.c_str(), &src) != 0) return Status::OK();  // ListSources says why
    std::vector<std::string> dirs = {opt_.out};
    if (opt_.val_fraction > 0)
      for (const std::string& split : SplitDirs()) dirs.push_back(opt_.out + "/" + split);
    for (const std::string& dir : dirs)
      if (::stat(dir.c_str(), &out) == 0 && out.st_dev == src.st_dev && out.st_ino == src.st_ino)
        return Status::InvalidArgument(
            dir + ": is the source folder " + opt_.src +
            " itself; give an OUT outside it (or a new folder inside it, which is not listed "
            "as a source)");
    return Status::OK();
  }

  // --append: the finished cache of each output directory and its new
  // sources (the same for every split: each split's sources.tsv lists all
  // sources); the new sources' labels follow the cache's classes.
  Status PlanAppends(std::vector<AppendPlan>* out) {
    std::vector<std::string> dirs = {opt_.out};
    if (opt_.val_fraction > 0) {
      dirs.clear();
      for (const std::string& split : SplitDirs()) dirs.push_back(opt_.out + "/" + split);
    }
    out->resize(dirs.size());
    for (size_t k = 0; k < dirs.size(); ++k) KILN_RETURN_IF_ERROR(PlanAppend(dirs[k], src_, &(*out)[k]));
    AppendClasses(out->front().base.classes, out->front().added, &src_);
    base_for_stats_ = out->front().base;
    return Status::OK();
  }

  // --append: the new records must be made as the cache's were.
  Status CheckAppendRecipe(const Manifest& base) const {
    std::vector<std::string> diff = TensorRecipeDifferences(base.preprocessing, recipe_);
    if (base.preprocessing.dtype != recipe_.dtype)
      diff.push_back(std::string("dtype: ") + DTypeName(base.preprocessing.dtype) + " vs " +
                     DTypeName(recipe_.dtype));
    if (diff.empty()) return Status::OK();
    std::string d;
    for (const std::string& x : diff) d += (d.empty() ? "" : "; ") + x;
    return Status::InvalidArgument(opt_.out + ": the cache was built with other options (" + d +
                                   "): --append needs the cache's own; rebuild it otherwise");
  }

  // The recipe's fields that come from the options and the sources.
  Preprocessing BaseRecipe() const {
    Preprocessing r;
    r.complete = true;
    // Names in the manifest are escaped as in sources.tsv (core/escape.h).
    r.source.root = EscapeName(src_.root);
    r.source.layout = src_.layout;
    r.source.digest = SourceDigest(src_);
    r.source.unreadable = src_.retryable();
    if (!opt_.list_file.empty()) r.source.list_file = EscapeName(fs::absolute(opt_.list_file).string());
    // A part's own record; kiln merge drops it, so that a merged cache has
    // the recipe of a one-part build.
    if (opt_.num_parts > 1) {
      r.part_index = opt_.part;
      r.part_count = opt_.num_parts;
    }
    r.resize = opt_.shorter_side > 0 ? opt_.shorter_side : opt_.resize;
    r.crop = opt_.crop;
    r.whole = opt_.max_side > 0 || opt_.shorter_side > 0;
    r.max_side = opt_.max_side;
    r.encode = opt_.encode;
    r.encode_quality = opt_.encode.empty() ? 0 : opt_.encode_quality;
    if (!opt_.masks.empty()) {
      const std::string masks = fs::absolute(opt_.masks).lexically_normal().string();
      r.masks = EscapeName(masks);
      r.source.masks_digest = MasksDigest(src_, masks);
    }
    r.size_w = opt_.size_w;
    r.size_h = opt_.size_h;
    r.channels = opt_.channels;
    r.dtype = RecordDType(opt_);
    r.norm = opt_.norm;
    r.normalized = r.dtype != DType::kUint8;
    r.max_pixels = opt_.max_pixels;
    r.shuffle_seed = opt_.shuffle_seed;
    r.val_fraction = opt_.val_fraction;
    r.stats_sample = opt_.stats_sample;
    // A CSV's float target columns, by name, in the order of the "target"
    // field's values.
    if (!src_.target_names.empty()) {
      std::string names = "[";
      for (size_t i = 0; i < src_.target_names.size(); ++i)
        names += (i ? ", \"" : "\"") + EscapeName(src_.target_names[i]) + "\"";
      r.extra["targets"] = names + "]";
    }
    r.libraries["kiln"] = KilnVersion();
    for (const auto& [name, version] : image::CodecVersions()) r.libraries[name] = version;
    return r;
  }

  // The recipe of one output cache: its split and source count.
  Preprocessing RecipeOf(const Plan& p) const {
    Preprocessing r = recipe_;
    r.source.files = p.files;
    r.split = p.split;
    return r;
  }

  Status ChooseNormalization() {
    const int c = opt_.channels;
    switch (opt_.norm) {
      case NormKind::kNone:
        recipe_.mean.assign(c, 0.0);
        recipe_.std.assign(c, 1.0);
        break;
      case NormKind::kImagenet:
        if (c != 3) return Status::InvalidArgument("--norm imagenet needs --channels 3");
        recipe_.mean = {0.485, 0.456, 0.406};
        recipe_.std = {0.229, 0.224, 0.225};
        break;
      case NormKind::kExplicit:
        if (static_cast<int>(opt_.mean.size()) != c || static_cast<int>(opt_.std.size()) != c)
          return Status::InvalidArgument("--mean and --std need " + std::to_string(c) +
                                         " values each");
        recipe_.mean = opt_.mean;
        recipe_.std = opt_.std;
        break;
      case NormKind::kAuto: {
        if (opt_.append) {  // the cache's statistics: the new records are normalized alike
          const Manifest& base = base_for_stats_;
          recipe_.mean = base.preprocessing.mean;
          recipe_.std = base.preprocessing.std;
          break;
        }
        // Statistics of the preprocessed pixels of all images, or of a
        // seeded sample of --stats-sample of them.
        const std::vector<size_t> pick =
            SeededSample(src_.items.size(), opt_.stats_sample, kStatsSampleSeed);
        const Preprocessor pre(recipe_, shape_);
        uint64_t unreadable = 0;
        KILN_RETURN_IF_ERROR(
            pre.MeasureStats(src_, pick, opt_.threads, &recipe_.mean, &recipe_.std, &unreadable));
        // Statistics without some images: the next build measures again.
        recipe_.source.unreadable += unreadable;
        break;
      }
    }
    for (double s : recipe_.std)
      if (!(s > 0)) return Status::InvalidArgument("--std values must be > 0");
    return Status::OK();
  }

  std::vector<Plan> MakePlans() const {
    std::vector<Plan> plans;
    auto ordered = [&](std::vector<size_t> v) {
      if (opt_.shuffle_seed >= 0) SeededShuffle(&v, static_cast<uint64_t>(opt_.shuffle_seed));
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
      const double u =
          static_cast<double>(XXH3_64bits(p.data(), p.size()) >> 11) / 9007199254740992.0;
      (u < opt_.val_fraction ? val : train).push_back(i);
    }
    plans.push_back({opt_.out + "/" + SplitDirs()[0], SplitDirs()[0], ordered(train)});
    plans.push_back({opt_.out + "/" + SplitDirs()[1], SplitDirs()[1], ordered(val)});
    return plans;
  }

  Status BuildOne(const Plan& plan, const Preprocessing& recipe, const Preprocessor& pre) {
    const auto t0 = std::chrono::steady_clock::now();
    res_->caches.push_back(plan.dir);
    StartRequest request;
    request.recipe = recipe;
    request.rebuild = RebuildOf(opt_);
    request.strict = opt_.strict;
    request.retry = [&](const RejectEntry& e) { return ComesOutOtherwise(e, pre); };
    StartDecision start_kind;
    if (plan.append != nullptr) {
      // An append resumes the one an earlier run left unfinished (its marker).
      start_kind.start = fs::exists(plan.dir + "/" + kAppendMarkerName) ? BuildStart::kResume
                                                                        : BuildStart::kFresh;
      if (plan.order.empty()) {
        info_(plan.dir + ": nothing to append: the cache holds every source");
        res_->up_to_date = true;
        return Status::OK();
      }
    } else {
      KILN_RETURN_IF_ERROR(DecideStart(plan.dir, request, info_, &start_kind));
    }
    if (start_kind.start == BuildStart::kUpToDate) {
      res_->up_to_date = true;
      res_->retryable += start_kind.still_failing.size();
      return Status::OK();
    }
    const bool resume = start_kind.start == BuildStart::kResume;
    // OUT's duplicate report describes the finished caches: it goes until
    // this build has finished and written it anew.
    built_any_ = true;
    std::error_code ec;
    fs::remove(opt_.out + "/" + kDuplicatesTsvName, ec);
    WriterOptions wo;
    wo.dtype = RecordDType(opt_);
    wo.shape = shape_;
    // Format 2 for whole images and a CSV's several labels or targets:
    // "image" and "label", the names a format 1 cache reads as ("labels",
    // "target": BuildFieldSpecs).
    if (BuildWritesFields(src_, recipe)) wo.fields = BuildFieldSpecs(src_, pre, &wo.label_field);
    wo.shard_size = opt_.shard_size;
    wo.resume = resume;
    wo.first_index = plan.first;
    wo.append = plan.append != nullptr;
    wo.append_from = opt_.src + " (" + std::to_string(plan.order.size()) + " new sources)";
    // A fresh start discards what an earlier build left - under DIR's lock,
    // so that nothing is deleted while another build holds DIR.
    std::unique_ptr<DirLock> lock;
    KILN_RETURN_IF_ERROR(DirLock::Acquire(plan.dir, &lock));
    if (!resume && !wo.append) KILN_RETURN_IF_ERROR(BeginFreshBuild(plan.dir, recipe));
    wo.lock = lock.get();
    std::unique_ptr<CacheWriter> writer;
    const Status opened = CacheWriter::Open(wo, plan.dir, &writer);
    if (resume && (opened.IsCorruption() || opened.IsInvalidArgument()))
      return Status::Corruption(opened.message() +
                                "; the interrupted build cannot be resumed: "
                                "pass --force to discard it and start over");
    KILN_RETURN_IF_ERROR(opened);
    RejectLog rejects;
    KILN_RETURN_IF_ERROR(rejects.Open(plan.dir, resume));
    if (wo.append) {
      // The cache's rejects stay (its listing's among them); this run adds the new sources'.
      std::vector<RejectEntry> before;
      const Status had = ReadRejectsTsv(plan.dir + "/" + kRejectsName, &before);
      if (!had.IsNotFound()) KILN_RETURN_IF_ERROR(had);
      for (const RejectEntry& e : before) rejects.AddListed(RawName(e.path), RawName(e.reason), e.retry);
    } else if (plan.dir == first_dir_ && opt_.part == 0) {
      // What the listing skipped: logged once, with the first cache of part 0.
      for (const SourceReject& r : src_.rejected) rejects.AddListed(r.path, r.reason, r.retry);
    }
    // The interrupted run rejected inputs: --strict fails on the first, as
    // it would have in one go.
    if (opt_.strict && (wo.append ? !rejects.before().empty() : !rejects.entries().empty()))
      return Status::Corruption(rejects.entries().front().Text() +
                                " (rejected by the interrupted run; under --strict every input "
                                "must be written: fix or remove it and build again)");
    const uint64_t first = wo.append ? writer->append_base() : plan.first;
    const uint64_t resumed_records = writer->next_index() - first;
    const size_t start = ResumePoint(plan.order.size(), resumed_records, rejects.before());
    if (resume) {
      res_->resumed = true;
      info_(plan.dir + (wo.append ? ": resuming an interrupted append at record "
                                  : ": resuming an interrupted build at record ") +
            std::to_string(writer->next_index()) + " (" + std::to_string(start) + " of " +
            std::to_string(plan.order.size()) + " sources done)");
    }

    auto report = [&](const PipelineCounts& c, bool final) {
      Progress bp;
      bp.done = c.written + c.rejected + start;
      bp.total = plan.order.size();
      bp.bytes = c.bytes;
      bp.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bp.final = final;
      progress_(plan.dir, bp);
    };
    PipelineJob job;
    job.sources = &src_;
    job.order = &plan.order;
    job.start = start;
    job.preprocessor = &pre;
    job.threads = opt_.threads;
    job.strict = opt_.strict;
    job.fields = BuildWritesFields(src_, recipe);
    PipelineCounts counts;
    const Status failure = RunPipeline(
        job, writer.get(), &rejects, [&](const PipelineCounts& c) { report(c, false); }, &counts);
    rejects.Close();
    res_->written += resumed_records + counts.written;
    res_->rejected += rejects.entries().size();
    res_->retryable += rejects.retryable();
    res_->bytes += counts.bytes;
    if (!rejects.entries().empty() && res_->first_reject.empty())
      res_->first_reject = rejects.entries()[0].Text();
    if (!failure.ok()) {
      (void)writer->Commit();  // keep what is good for a resume
      return failure;
    }
    // rejects.tsv lists every rejected file of the build, in source order
    // (an append's lists go into place once its manifest is published).
    KILN_RETURN_IF_ERROR(wo.append ? rejects.WriteTsvAs(kPendingRejects) : rejects.WriteTsv());
    if (writer->next_index() == plan.first && !wo.append)
      return Status::Corruption(plan.dir + ": every input was rejected (see " + kRejectsName + ")");
    KILN_RETURN_IF_ERROR(WriteSources(plan, rejects, first));
    if (wo.append)
      info_(plan.dir + ": appended " + std::to_string(writer->next_index() - first) +
            " records after the " + std::to_string(first) + " it held");
    Manifest m;
    for (const std::string& c : src_.classes) m.classes.push_back(EscapeName(c));
    m.preprocessing = recipe;
    if (opt_.num_parts > 1) {
      m.part_index = opt_.part;
      m.part_count = opt_.num_parts;
    }
    KILN_RETURN_IF_ERROR(writer->Finish(&m));
    if (wo.append) KILN_RETURN_IF_ERROR(SettlePendingLists(plan.dir, m));
    EndBuild(plan.dir);
    res_->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report(counts, true);
    return Status::OK();
  }

  // Whether the retryable reject `e` of a finished cache comes out otherwise
  // now: its file, still among the sources, is made into its record again
  // (image and mask). A reject
  // of the listing itself (no file of the sources) is for the recipe to
  // tell (its source digest changes when the listing does).
  bool ComesOutOtherwise(const RejectEntry& e, const Preprocessor& pre) const {
    const std::string path = RawName(e.path), prefix = src_.root + "/";
    if (path.compare(0, prefix.size(), prefix) != 0) return false;
    const std::string rel = path.substr(prefix.size());
    const SourceItem* it = FindSource(src_, rel);
    if (it == nullptr) return false;
    // The whole record, as the pipeline makes it: a reject may have come
    // from the image's mask.
    Preprocessor::Scratch scratch;
    RemadeRecord remade;
    return !Retryable(RemakeRecord(src_, pre, *it, &scratch, &remade));
  }

  // sources.tsv: every source file of the build with its size and mtime,
  // and the record it became (-1: rejected or in the other split), so that
  // verify can say which files were added, removed or changed, and map a
  // record back to its file.
  Status WriteSources(const Plan& plan, const RejectLog& rejects, uint64_t first) {
    if (plan.append != nullptr) {
      std::vector<bool> rejected(plan.order.size());
      for (size_t k = 0; k < plan.order.size(); ++k) rejected[k] = rejects.rejected(k);
      return WriteSourcesTsv(plan.dir + "/" + kPendingSources,
                             AppendedSources(*plan.append, src_, plan.order, first, rejected));
    }
    std::vector<RecordedSource> sources(src_.items.size());
    for (size_t i = 0; i < src_.items.size(); ++i) sources[i].item = src_.items[i];
    int64_t next = static_cast<int64_t>(plan.first);
    for (size_t k = 0; k < plan.order.size(); ++k)
      if (!rejects.rejected(k)) sources[plan.order[k]].record = next++;
    return WriteSourcesTsv(plan.dir + "/" + kSourcesTsvName, sources);
  }

  // The seed of the --stats-sample draw (fixed: the sample depends only on
  // the sources and N).
  static constexpr uint64_t kStatsSampleSeed = 12345;

  const BuildOptions& opt_;
  const ProgressFn& progress_;
  const InfoFn& info_;
  BuildResult* res_;
  SourceList src_;
  Preprocessing recipe_;
  Shape shape_;
  bool built_any_ = false;  // some cache was built or resumed by this run
  Manifest base_for_stats_;  // --append: the cache's manifest (its --norm auto statistics)
  std::string first_dir_;   // the first output cache of this run
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

// kiln build SRC OUT: decode a raw image dataset once into a cache.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "progress_printer.h"
#include "kiln/ingest/build.h"
#include "core/units.h"

namespace kiln::tools {
namespace {

struct BuildArgs {
  ingest::BuildOptions o;
  int num_parts = 0, part = -1;  // 0 / -1: not given
  std::string size, dtype, norm, mean, std, shard_size = "4G", progress = "auto", encode;
};

Status ParseList(const std::string& text, std::vector<double>* out) {
  out->clear();
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      out->push_back(std::stod(item));
    } catch (...) {
      return Status::InvalidArgument("'" + text + "' is not a comma-separated list of numbers");
    }
  }
  return Status::OK();
}

// --num-parts/--part, or the rank and world size of the usual launchers.
Status ResolveParts(const BuildArgs& a, ingest::BuildOptions* o) {
  if ((a.num_parts > 0) != (a.part >= 0))
    return Status::InvalidArgument("--num-parts and --part go together");
  if (a.num_parts > 0) {
    o->num_parts = a.num_parts;
    o->part = a.part;
    return Status::OK();
  }
  static const char* const kLaunchers[][2] = {{"RANK", "WORLD_SIZE"},
                                              {"SLURM_PROCID", "SLURM_NTASKS"},
                                              {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}};
  for (const auto& l : kLaunchers) {
    const char* rank = std::getenv(l[0]);
    const char* size = std::getenv(l[1]);
    if (rank == nullptr || size == nullptr) continue;
    char* e1 = nullptr;
    char* e2 = nullptr;
    const long r = std::strtol(rank, &e1, 10), n = std::strtol(size, &e2, 10);
    if (*e1 != 0 || *e2 != 0 || n < 1 || r < 0 || r >= n)
      return Status::InvalidArgument(std::string(l[0]) + "=" + rank + " " + l[1] + "=" + size +
                                     ": not a rank within the world size");
    if (n == 1) return Status::OK();
    o->num_parts = static_cast<int>(n);
    o->part = static_cast<int>(r);
    std::cerr << "kiln build: part " << r << " of " << n << " (from " << l[0] << "/" << l[1]
              << "); join the parts with kiln merge " << o->out << "\n";
    return Status::OK();
  }
  return Status::OK();
}

// LMDB allocates the dirty pages of every commit with malloc and frees them
// after it; with glibc's defaults those ~300 KB blocks go back to the kernel
// and each commit faults its pages, freshly zeroed, in again (340,000 page
// faults for the 4000-image bench corpus with 64 MB commits). Keeping freed
// memory in the heap made that 90,000 and cut the build's CPU time by about
// 15%; the peak stays what the live blocks need (bench/build_bench.sh prints
// RssAnon).
void KeepFreedMemoryForReuse() {
#ifdef M_MMAP_THRESHOLD
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest; blocks below it come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // hand heap tops back only beyond 1 GiB free
#endif
}

int RunBuild(BuildArgs& a) {
  KeepFreedMemoryForReuse();
  ingest::BuildOptions& o = a.o;
  Status s;
  if (!a.dtype.empty()) {
    DType d = DType::kFloat16;
    s = ParseDType(a.dtype, &d);
    o.dtype = d;
  }
  if (s.ok()) s = ResolveParts(a, &o);
  if (s.ok() && !a.encode.empty() && a.encode != "none") {
    // jpeg, jpeg:Q, auto, auto:Q
    const size_t colon = a.encode.find(':');
    o.encode = a.encode.substr(0, colon);
    if (colon != std::string::npos) {
      char* end = nullptr;
      const long q = std::strtol(a.encode.c_str() + colon + 1, &end, 10);
      o.encode_quality = *end == 0 && colon + 1 < a.encode.size() ? static_cast<int>(q) : -1;
    }
    if ((o.encode != "jpeg" && o.encode != "auto") || o.encode_quality < 1 ||
        o.encode_quality > 100)
      s = Status::InvalidArgument("--encode '" + a.encode +
                                  "' (expected jpeg, jpeg:QUALITY, auto, auto:QUALITY or none; "
                                  "QUALITY 1..100, default 90)");
  }
  if (s.ok() && !a.size.empty() &&
      std::sscanf(a.size.c_str(), "%dx%d", &o.size_w, &o.size_h) != 2)
    s = Status::InvalidArgument("--size '" + a.size + "' (expected WxH, e.g. 64x64)");
  if (s.ok()) s = ParseByteSize(a.shard_size, "--shard-size", &o.shard_size);
  if (s.ok() && (!a.mean.empty() || !a.std.empty())) {
    if (!a.norm.empty() && a.norm != "explicit")
      s = Status::InvalidArgument("--mean/--std exclude --norm " + a.norm);
    else if (a.mean.empty() || a.std.empty())
      s = Status::InvalidArgument("--mean and --std go together");
    if (s.ok()) s = ParseList(a.mean, &o.mean);
    if (s.ok()) s = ParseList(a.std, &o.std);
    o.norm = NormKind::kExplicit;
  } else if (!a.norm.empty()) {
    if (a.norm == "explicit" || !ParseNormKind(a.norm, &o.norm).ok())
      s = Status::InvalidArgument("--norm must be none, imagenet or auto (or give --mean/--std)");
  }
  if (!s.ok()) return ReportError("build", s);

  ProgressPrinter print;
  s = MakeProgressPrinter("build", "images", a.progress, &print);
  if (!s.ok()) return ReportError("build", s);
  auto progress = [&](const std::string& cache, const Progress& p) {
    if (print) print(cache, p);
  };
  auto info = [](const std::string& line) { std::cerr << line << "\n"; };
  ingest::BuildResult r;
  s = ingest::BuildCache(o, progress, info, &r);
  if (!r.first_reject.empty())
    std::cerr << "rejected inputs are listed in rejects.tsv; the first: " << r.first_reject << "\n";
  if (!s.ok()) return ReportError("build", s);
  if (!r.up_to_date || r.written > 0) {
    std::cout << "kiln build: " << r.written << " written, " << r.rejected << " rejected";
    if (r.seconds > 0 && r.bytes > 0)
      std::cout << " in " << FormatDuration(r.seconds) << " (" << HumanBytes(r.bytes) << ", "
                << FormatByteRate(r.bytes, r.seconds) << ")";
    std::cout << " ->";
    for (const auto& c : r.caches) std::cout << " " << c;
    std::cout << "\n";
  }
  if (r.retryable > 0)
    std::cout << r.retryable << (r.retryable == 1 ? " rejected input can" : " rejected inputs can")
              << " be retried (retry yes in rejects.tsv: permission denied, an I/O error or no "
                 "memory, not a bad file): fix the cause and run the same command again\n";
  if (!r.duplicates_file.empty())
    std::cout << DuplicateSummary(r.duplicates_file, r.duplicates) << "\n";
  return kExitOk;
}

}  // namespace

Status VerifySources(const std::string& dir, const std::string& level,
                     const VerifyOptions& options, uint64_t sample, uint64_t seed,
                     VerifyReport* report) {
  ingest::SourceCheck check;
  KILN_RETURN_IF_ERROR(ingest::ParseSourceCheck(level, &check));
  return ingest::VerifyWithSources(dir, options, check, sample, seed, report);
}

namespace {

KILN_COMMAND(Command{
    "build", "Decode, resize and normalize an image dataset once into a cache", 10,
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<BuildArgs>();
      ingest::BuildOptions& o = a->o;
      sub->add_option("SRC", o.src, "source root (ImageFolder: SRC/<class>/<image>)")->required();
      sub->add_option("OUT", o.out,
                      "cache directory to write (inside SRC it is not listed as a source)")
          ->required();
      sub->add_option(
          "--list", o.list_file,
          "list file of 'relative/path label' lines, or a CSV with header path,label - or "
          "path,labels "
          "(several, ';'-separated) and float target columns after it (a format 2 cache "
          "of image, labels, target)");
      sub->add_option("--resize", o.resize, "shorter side to S (torchvision Resize(S))");
      sub->add_option("--crop", o.crop, "center crop C x C (torchvision CenterCrop(C))");
      sub->add_option("--size", a->size, "squash to WxH instead of --resize");
      sub->add_option("--max-side", o.max_side,
                      "store each image whole, its longer side at most N (FFCV's max_resolution; "
                      "a format 2 cache, for crops at load time)");
      sub->add_option("--shorter-side", o.shorter_side,
                      "store each image whole, its shorter side resized to S (torchvision "
                      "Resize(S); a format 2 cache, for CenterCrop at load time)");
      sub->add_option("--encode", a->encode,
                      "with --max-side/--shorter-side: store each image as a JPEG (jpeg[:QUALITY], "
                      "default 90; a source JPEG that needs no resize is kept as its own bytes), "
                      "or auto[:QUALITY] (raw pixels where the JPEG would not halve the bytes); "
                      "decoded at load time");
      sub->add_option("--masks", o.masks,
                      "segmentation masks: DIR holds a single-channel PNG (class indices) at each "
                      "image's relative path, extension .png; resized with nearest neighbour on "
                      "the image's geometry into a 'mask' field (a format 2 cache)");
      sub->add_option("--channels", o.channels, "1 or 3 (default 3)");
      sub->add_option("--dtype", a->dtype, "float16, float32 or uint8 (default: uint8 with --max-side or --shorter-side, float16 otherwise)");
      sub->add_option("--norm", a->norm, "none (default: x/255), imagenet, or auto (dataset statistics)");
      sub->add_option("--mean", a->mean, "explicit per-channel means, e.g. 0.5,0.5,0.5");
      sub->add_option("--std", a->std, "explicit per-channel stds");
      sub->add_option("--stats-sample", o.stats_sample, "--norm auto over a seeded sample of N images (0 = all)");
      sub->add_option("--val-fraction", o.val_fraction, "write OUT/train and OUT/val split by path hash");
      sub->add_option("--shuffle-seed", o.shuffle_seed, "write records in a seeded permutation");
      sub->add_option("--shard-size", a->shard_size, "record bytes per shard (default 4G)");
      sub->add_option("--threads", o.threads, "worker threads (0 = all cores)");
      sub->add_option("--max-pixels", o.max_pixels, "reject images over this many pixels (default 1e8)");
      sub->add_flag("--strict", o.strict, "any rejected input fails the build (exit 1)");
      sub->add_flag("--force", o.force,
                    "rebuild from scratch, even an up-to-date cache (discards what OUT holds)");
      sub->add_flag("--rebuild-if-changed", o.rebuild_if_changed,
                    "rebuild when sources or options changed, keep an up-to-date cache "
                    "(without it a changed cache is an error, exit 1)");
      sub->add_flag("--append", o.append,
                    "add the files new in SRC to the finished cache in OUT, after its records, "
                    "in new shards (a changed or removed source needs a rebuild)");
      sub->add_flag("--repair", o.repair,
                    "rewrite only the records that verify finds bad, from their sources "
                    "(same arguments as the original build)");
      sub->add_option("--progress", a->progress, "auto | tty | plain | json | none");
      sub->add_option("--num-parts", a->num_parts,
                      "build in N parts (on N machines): this run builds --part into "
                      "OUT/part-IIIII-of-NNNNN; default from RANK/WORLD_SIZE, SLURM_PROCID/"
                      "SLURM_NTASKS or OMPI_COMM_WORLD_RANK/SIZE");
      sub->add_option("--part", a->part, "which part, 0 <= part < num-parts");
      AddExamples(sub, {"kiln build SRC OUT --resize 256 --crop 224 --norm imagenet",
                        "kiln build SRC OUT --size 28x28 --channels 1 --norm auto "
                        "--val-fraction 0.1",
                        "kiln build SRC OUT --resize 256 --crop 224 --force   # from scratch"});
      return [a] { return RunBuild(*a); };
    }});

int RunMerge(const std::string& out, const std::vector<std::string>& parts,
             const std::vector<std::string>& from, bool keep) {
  auto info = [](const std::string& l) { std::cerr << l << "\n"; };
  ingest::MergeResult r;
  Status s;
  if (!from.empty()) {
    if (!parts.empty() || keep)
      return ReportError("merge", Status::InvalidArgument(
                                      "--from joins finished caches; PART arguments and "
                                      "--keep-parts are for the parts of one build"));
    s = ingest::MergeCaches(out, from, info, &r);
  } else {
    s = ingest::MergeParts(out, parts, keep, info, &r);
  }
  if (!s.ok()) return ReportError("merge", s);
  std::cout << "kiln merge: " << r.parts << (from.empty() ? " parts, " : " caches, ") << r.records
            << " records in " << r.shards << " shards, in " << FormatDuration(r.seconds) << " ->";
  for (const auto& c : r.caches) std::cout << " " << c;
  std::cout << " (" << (r.copied_records ? std::to_string(r.copied_records) + " records rewritten"
                                         : std::string("no tensor data copied"))
            << (r.relabelled_records ? "; " + std::to_string(r.relabelled_records) +
                                           " records' labels mapped to the merged classes"
                                     : std::string())
            << ")\n";
  std::cout << DuplicateSummary(r.duplicates_file, r.duplicates) << "\n";
  return kExitOk;
}

KILN_COMMAND(Command{
    "merge", "Join the parts of a cache built with --num-parts, or finished caches, into one", 15,
    [](CLI::App* sub) -> std::function<int()> {
      auto out = std::make_shared<std::string>();
      auto parts = std::make_shared<std::vector<std::string>>();
      auto from = std::make_shared<std::vector<std::string>>();
      auto keep = std::make_shared<bool>(false);
      sub->add_option("OUT", *out, "the merged cache's directory (the build's OUT)")->required();
      sub->add_option("--from", *from,
                      "a finished cache to join, in order (twice or more): same fields and "
                      "recipe, classes matched by name; shards are linked (no tensor data "
                      "copied), a cache's labels mapped to the merged classes where they "
                      "are numbered otherwise")
          ->expected(1)
          ->allow_extra_args(false)
          ->take_all();
      sub->add_option("PART", *parts, "part directories (default: OUT's part-*-of-*, also in "
                                      "OUT/train and OUT/val)");
      sub->add_flag("--keep-parts", *keep, "leave the part directories in place");
      AddExamples(sub, {"kiln merge OUT   # after kiln build SRC OUT --num-parts N --part i",
                        "kiln merge --from batch1 --from batch2 combined"});
      return [out, parts, from, keep] { return RunMerge(*out, *parts, *from, *keep); };
    }});

}  // namespace
}  // namespace kiln::tools

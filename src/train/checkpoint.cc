// Checkpoints of kiln train: the directory (written whole, then swapped in
// for the previous one), state.json, and --resume with its check that the
// run continues the checkpoint's settings.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <type_traits>
#include <unistd.h>

#include "core/json_read.h"
#include "core/file.h"
#include "kiln/manifest.h"
#include "trainer_internal.h"

namespace kiln::train::internal {
namespace fs = std::filesystem;
namespace {

// A checkpoint directory as a path whose last part names it: no trailing
// separator and no "." or ".." parts (an absolute path when those were its
// last part), so that DIR.partial and DIR.old are its siblings. "ck/" +
// ".partial" would be a folder inside ck, and ck cannot be renamed into it.
fs::path CheckpointDir(const std::string& dir) {
  auto normal = [](const fs::path& p) {
    std::string s = p.lexically_normal().string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return fs::path(s);
  };
  fs::path p = normal(dir);
  if (p.filename() == "." || p.filename() == "..") {
    std::error_code ec;
    const fs::path absolute = fs::absolute(p, ec);
    if (!ec) p = normal(absolute);
  }
  return p;
}

fs::path Sibling(const fs::path& dir, const std::string& suffix) {
  return fs::path(dir.string() + suffix);
}

// A checkpoint is complete once its state.json exists: SaveCheckpoint
// renames it into place after every other file is written.
bool IsComplete(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "state.json", ec);
}

// OK when a save may replace `dir`: absent, an empty directory or a
// checkpoint. Each save replaces the whole directory, so a directory of
// other files would be deleted.
Status CheckReplaceable(const fs::path& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return Status::OK();
  if (!fs::is_directory(st))
    return Status::InvalidArgument(dir.string() +
                                   " exists and is not a directory; give a new directory for the "
                                   "checkpoint or one that --save wrote");
  if (IsComplete(dir) || fs::is_empty(dir, ec)) return Status::OK();
  return Status::InvalidArgument(
      dir.string() +
      " holds other files and no kiln checkpoint (no state.json); each save replaces the whole "
      "directory, so give a new directory or one that --save wrote");
}

}  // namespace

// The start-up check of --save: that the checkpoint directory may be
// replaced, and that its parent can be created and written (a save creates
// and renames siblings there), so a bad path fails now, not after an epoch.
Status CheckSaveLocation(const std::string& save) {
  const std::string option = "--save " + save;
  const fs::path dir = CheckpointDir(save);
  if (dir.filename().empty())
    return Status::InvalidArgument(option + ": give a directory to hold the checkpoint, not " +
                                   dir.string());
  KILN_RETURN_IF_ERROR(CheckReplaceable(dir).WithContext(option));
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec)
    return Status::IOError(option + ": cannot create " + parent.string() + ": " + ec.message() +
                           "; choose a location that can be written");
  const fs::path probe = Sibling(dir, ".write-test-" + std::to_string(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  if (f == nullptr)
    return Status::IOError(option + ": cannot write in " + parent.string() + ": " +
                           std::strerror(errno) + "; choose a location that can be written");
  std::fclose(f);
  fs::remove(probe, ec);
  return Status::OK();
}

namespace {

// The checkpoint that --resume DIR names, in *found: DIR when complete.
// A save stopped between its two renames (DIR -> DIR.old, DIR.partial ->
// DIR) leaves no DIR: then DIR.partial, the newer, when complete (its
// state.json is written last), else DIR.old. *fallback says it was one of
// those.
Status FindCheckpoint(const std::string& dir, std::string* found, bool* fallback) {
  const fs::path d = CheckpointDir(dir);
  const fs::path candidates[] = {d, Sibling(d, ".partial"), Sibling(d, ".old")};
  for (const fs::path& c : candidates) {
    if (!IsComplete(c)) continue;
    *found = c == d ? dir : c.string();
    *fallback = c != d;
    return Status::OK();
  }
  return Status::NotFound(dir + ": not a kiln checkpoint (no state.json, nor a complete " +
                          candidates[1].string() + " or " + candidates[2].string() +
                          " from an interrupted save); give the directory that --save wrote");
}

// Writes DIR.partial/ in full, state.json last (by rename), then swaps it in
// for DIR: DIR -> DIR.old, DIR.partial -> DIR, DIR.old deleted. A crash at
// any point leaves a complete checkpoint as DIR, or, between the two renames,
// as DIR.partial and DIR.old (FindCheckpoint takes those). DIR.partial and
// DIR.old are deleted only while DIR is complete, so a save never deletes the
// only complete copy.
Status SaveCheckpoint(const std::string& dir, Model& model, torch::optim::Optimizer& opt,
                      const Checkpoint& c) {
  const fs::path final_dir = CheckpointDir(dir), partial = Sibling(final_dir, ".partial"),
                 old = Sibling(final_dir, ".old");
  std::error_code ec;
  if (!IsComplete(final_dir)) {
    KILN_RETURN_IF_ERROR(CheckReplaceable(final_dir));
    // An earlier save stopped between its renames: first make the newest
    // complete copy DIR again.
    for (const fs::path& spare : {partial, old}) {
      if (!IsComplete(spare)) continue;
      fs::remove(final_dir, ec);  // absent or empty
      fs::rename(spare, final_dir, ec);
      if (ec)
        return Status::IOError(dir + ": cannot restore the checkpoint " + spare.string() +
                               " left by an interrupted save: " + ec.message());
      break;
    }
  }
  fs::remove_all(partial, ec);
  fs::create_directories(partial, ec);
  if (ec) return Status::IOError(partial.string() + ": " + ec.message());
  KILN_RETURN_IF_ERROR(model.Save((partial / "model.pt").string()));
  try {
    torch::save(opt, (partial / "optimizer.pt").string());
    torch::save(at::detail::getDefaultCPUGenerator().get_state(), (partial / "rng.pt").string());
  } catch (const c10::Error& e) {
    return Status::IOError(partial.string() + ": cannot write the optimizer state: " +
                           e.what_without_backtrace());
  }
  // On disk before state.json marks the checkpoint complete: a crash of the
  // machine cannot leave a complete-looking checkpoint with missing data.
  for (const char* name : {"model.pt", "optimizer.pt", "rng.pt"})
    KILN_RETURN_IF_ERROR(SyncPath((partial / name).string()));
  json j = {{"format", 1},
            {"kiln_version", KilnVersion()},
            {"epoch", c.epoch},
            {"step_in_epoch", c.step_in_epoch},
            {"epoch_skip", c.epoch_skip},
            {"global_step", c.global_step},
            {"loss_scale", c.scale},
            {"growth_tracker", c.growth_tracker},
            {"skipped_steps", c.skipped},
            {"batch_size", c.batch_size},
            {"accum_steps", c.accum_steps},
            {"model", c.model},
            {"epoch_so_far",
             {{"loss_sum", c.so_far.loss_sum},
              {"correct", c.so_far.correct},
              {"samples", c.so_far.samples},
              {"seconds", c.so_far.seconds},
              {"data_wait_seconds", c.so_far.wait_seconds}}},
            {"settings", c.settings},
            {"param_groups", c.groups}};
  KILN_RETURN_IF_ERROR(
      WriteFileAtomic(partial.string(), "state.json", "state.json.tmp", j.dump(2) + "\n"));
  if (fs::exists(final_dir)) {  // complete, or empty
    fs::remove_all(old, ec);
    if (!ec) fs::rename(final_dir, old, ec);
    if (ec)
      return Status::IOError(dir + ": cannot replace the previous checkpoint: " + ec.message());
  }
  fs::rename(partial, final_dir, ec);
  if (ec) return Status::IOError(dir + ": " + ec.message());
  // The renames themselves, before the old copy goes.
  KILN_RETURN_IF_ERROR(SyncPath(final_dir.parent_path().empty() ? "." : final_dir.parent_path().string()));
  fs::remove_all(old, ec);
  return Status::OK();
}

// What a damaged state.json's error tells the user to do.
constexpr const char* kDamaged =
    "; the checkpoint is damaged: resume from another checkpoint or start without --resume";

// ReadCheckpointState's parsing and checks.
Status ReadStateFile(const std::string& dir, Checkpoint* c) {
  const fs::path p = fs::path(dir) / "state.json";
  const std::string where = p.string();
  std::string text;
  if (!ReadWholeFile(where, &text).ok()) return Status::IOError(where + ": cannot read");
  json j;
  KILN_RETURN_IF_ERROR(ParseJson(text, where, &j));
  // Integers through JsonInteger (core/json_read.h): 1e300 or 1.5 is a
  // Corruption naming the field, never undefined behaviour or a truncation.
  auto integer = [&](const json& parent, const char* key, auto* value, auto lo) {
    using T = std::remove_pointer_t<decltype(value)>;
    return JsonInteger<T>(parent.at(key), where, key, value, lo, std::numeric_limits<T>::max());
  };
  try {
    KILN_RETURN_IF_ERROR(integer(j, "epoch", &c->epoch, int64_t{0}));
    KILN_RETURN_IF_ERROR(integer(j, "step_in_epoch", &c->step_in_epoch, int64_t{0}));
    KILN_RETURN_IF_ERROR(integer(j, "global_step", &c->global_step, int64_t{0}));
    if (j.contains("epoch_skip"))  // older checkpoints lack it
      KILN_RETURN_IF_ERROR(integer(j, "epoch_skip", &c->epoch_skip, int64_t{0}));
    c->scale = j.at("loss_scale").get<double>();
    KILN_RETURN_IF_ERROR(
        integer(j, "growth_tracker", &c->growth_tracker, std::numeric_limits<int64_t>::min()));
    KILN_RETURN_IF_ERROR(integer(j, "skipped_steps", &c->skipped, int64_t{0}));
    KILN_RETURN_IF_ERROR(integer(j, "batch_size", &c->batch_size, int64_t{1}));
    KILN_RETURN_IF_ERROR(integer(j, "accum_steps", &c->accum_steps, 1));
    c->model = j.at("model").get<std::string>();
    // Fields older checkpoints lack.
    if (j.contains("epoch_so_far")) {
      const json& e = j.at("epoch_so_far");
      c->so_far.loss_sum = e.at("loss_sum").get<double>();
      KILN_RETURN_IF_ERROR(integer(e, "correct", &c->so_far.correct, int64_t{0}));
      KILN_RETURN_IF_ERROR(integer(e, "samples", &c->so_far.samples, int64_t{0}));
      c->so_far.seconds = e.at("seconds").get<double>();
      c->so_far.wait_seconds = e.at("data_wait_seconds").get<double>();
    }
    c->settings = {{"--model", c->model},
                   {"--batch-size", c->batch_size},
                   {"--accum-steps", c->accum_steps}};
    if (j.contains("settings")) c->settings.update(j.at("settings"));
    if (j.contains("param_groups"))
      c->groups = j.at("param_groups").get<std::vector<std::vector<std::string>>>();
  } catch (const json::exception& e) {
    return Status::Corruption(where + ": " + e.what());
  }
  // Numbers that parse but cannot be a run's: a loss scale of 0, -1 or inf
  // would skip every step from here on without a word.
  auto finite = [&](const char* key, double v, bool positive) {
    if (std::isfinite(v) && (positive ? v > 0 : v >= 0)) return Status::OK();
    return Status::Corruption(where + ": \"" + key + "\" is " + json(v).dump() + ", not a " +
                              (positive ? "positive" : "non-negative") + " finite number");
  };
  KILN_RETURN_IF_ERROR(finite("loss_scale", c->scale, true));
  KILN_RETURN_IF_ERROR(finite("epoch_so_far.seconds", c->so_far.seconds, false));
  KILN_RETURN_IF_ERROR(finite("epoch_so_far.data_wait_seconds", c->so_far.wait_seconds, false));
  if (!std::isfinite(c->so_far.loss_sum))
    return Status::Corruption(where + ": \"epoch_so_far.loss_sum\" is not a finite number");
  return Status::OK();
}

// Reads the state.json of the complete checkpoint `dir` (FindCheckpoint's).
// A damaged one is a Corruption that names it and says what to do.
Status ReadCheckpointState(const std::string& dir, Checkpoint* c) {
  Status s = ReadStateFile(dir, c);
  if (s.IsCorruption()) return Status::Corruption(s.message() + kDamaged);
  return s;
}

// How a message shows `option` set to `value` in a run: "--seed 5",
// "--flip", "no --lr-head", "WORLD_SIZE=2".
std::string Shown(const std::string& option, const json& value) {
  if (option.rfind("--", 0) != 0) return option + "=" + value.dump();
  if (value.is_boolean()) return value.get<bool>() ? option : "no " + option;
  if (value.is_array()) {
    std::string all;
    for (const auto& v : value) {
      if (!all.empty()) all += ',';  // not ("" or ",") + string&&: GCC 12's -Wrestrict (C++20)
      all += v.get<std::string>();
    }
    return all.empty() ? "no " + option : option + " " + all;
  }
  if (value.is_string()) {
    const std::string s = value.get<std::string>();
    return s.empty() ? "no " + option : option + " " + s;
  }
  if (option == "--lr-head" && value.get<double>() < 0) return "no " + option;
  return option + " " + value.dump();
}

// "2 group(s): fc1.weight ... fc2.bias (4 tensors); fc.weight ... fc.bias (2 tensors)".
std::string DescribeGroups(const std::vector<std::vector<std::string>>& groups) {
  std::string s = std::to_string(groups.size()) + " group(s)";
  for (size_t g = 0; g < groups.size(); ++g) {
    s += g == 0 ? ": " : "; ";
    s += groups[g].empty() ? "empty"
                           : groups[g].front() + " ... " + groups[g].back() + " (" +
                                 std::to_string(groups[g].size()) + " tensors)";
  }
  return s;
}

}  // namespace

// The options a checkpoint must be continued with, by option name: those
// that decide the model, the sample order and augmentation, and the
// optimizer's state, which optimizer.pt holds per group by position.
// WORLD_SIZE, --batch-size (the one used, chosen when automatic) and
// --accum-steps are recorded too, but may change (IsElastic): the epoch then
// continues with the samples the whole job had not consumed. Everything
// else may change on resume: --epochs to extend the training, --lr and the
// schedule, logging and outputs, threads.
json Trainer::Settings() const {
  json s = {{"--model", o_.model},
            {"--seed", o_.seed},
            {"--crop", crop_},
            {"--flip", o_.flip},
            {"--freeze", o_.freeze},
            {"--freeze-until", o_.freeze_until},
            {"--lr-head", o_.lr_head},
            {"--optimizer", OptimizerName(o_.optimizer)},
            {"--accum-steps", o_.accum_steps},
            {"WORLD_SIZE", dist_ ? dist_->world() : 1}};
  if (rrc_) s["--augment"] = "rrc";  // absent otherwise, as in older checkpoints
  if (res_.enabled()) s["--res-schedule"] = o_.res_schedule;  // likewise
  if (batch_ > 0) s["--batch-size"] = batch_;
  else if (o_.batch_size > 0) s["--batch-size"] = o_.batch_size;
  return s;
}

namespace {
// The settings an elastic resume may change (Trainer::Settings).
bool IsElastic(const std::string& option) {
  return option == "WORLD_SIZE" || option == "--batch-size" || option == "--accum-steps";
}
}  // namespace

// Finds and reads the --resume checkpoint and refuses settings other than
// its own (but WORLD_SIZE, --batch-size and --accum-steps), before the
// model is built.
Status Trainer::ReadResume() {
  if (o_.resume.empty()) return Status::OK();
  bool fallback = false;
  KILN_RETURN_IF_ERROR(FindCheckpoint(o_.resume, &resume_dir_, &fallback).WithContext("--resume"));
  if (fallback)
    out_ << "resume " << o_.resume << " has no state.json: a save was stopped while replacing it; "
         << "using " << resume_dir_ << ", the newest complete checkpoint it left\n";
  KILN_RETURN_IF_ERROR(ReadCheckpointState(resume_dir_, &start_));
  const json now = Settings();
  for (const auto& [option, value] : now.items()) {
    if (!start_.settings.contains(option)) continue;  // an older checkpoint
    const json& then = start_.settings.at(option);
    if (IsElastic(option)) continue;  // compared in RestoreOptimizer, once the batch is known
    // --lr-head's rate may change like --lr's; whether the head has an
    // optimizer group of its own may not.
    const bool same =
        option == "--lr-head"
            ? then.is_number() && (then.get<double>() >= 0) == (value.get<double>() >= 0)
            : then == value;
    if (!same)
      return Status::InvalidArgument("--resume " + o_.resume + ": made with " +
                                     Shown(option, then) + ", this run has " +
                                     Shown(option, value) +
                                     "; use the same options or start without --resume");
  }
  return Status::OK();
}

// The resumed checkpoint's weights, after the model is built.
Status Trainer::Resume() {
  if (o_.resume.empty()) return Status::OK();
  InitReport r;
  KILN_RETURN_IF_ERROR(model_.InitFrom(resume_dir_, &r));
  if (!r.fresh.empty())
    return Status::Corruption("--resume " + resume_dir_ + ": the checkpoint lacks " +
                              r.fresh.front() + " (" + std::to_string(r.fresh.size()) +
                              " tensors in all)");
  return Status::OK();
}

// The resumed checkpoint's optimizer, random generator, loss scaler and
// step, after the optimizer is made.
Status Trainer::RestoreOptimizer() {
  if (o_.resume.empty()) return Status::OK();
  // The settings check above covers the options; this catches the rest (a
  // TorchScript --model file whose parameters changed).
  if (!start_.groups.empty() && start_.groups != groups_)
    return Status::InvalidArgument(
        "--resume " + o_.resume + ": the checkpoint's optimizer state is for " +
        DescribeGroups(start_.groups) + ", this run optimizes " + DescribeGroups(groups_) +
        "; use the same --model, --freeze, --freeze-until and --lr-head, or start without "
        "--resume");
  try {
    torch::load(*opt_, (fs::path(resume_dir_) / "optimizer.pt").string());
    torch::Tensor rng;
    torch::load(rng, (fs::path(resume_dir_) / "rng.pt").string());
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(rng);
  } catch (const c10::Error& e) {
    return Status::Corruption("--resume " + resume_dir_ + ": cannot restore the optimizer: " +
                              e.what_without_backtrace());
  }
  scaler_.Restore(start_.scale, start_.growth_tracker, start_.skipped);
  global_step_ = start_.global_step;
  out_ << "resume " << resume_dir_ << ": epoch " << start_.epoch + 1 << ", step "
       << start_.step_in_epoch << " of it, " << global_step_ << " steps done\n";
  // Elastic: another world size, batch size or accumulation. The epoch
  // continues after the samples the whole job had consumed, shared among
  // this run's ranks (Loader::StartEpoch's skip).
  const int64_t world = dist_ ? dist_->world() : 1;
  const json& then = start_.settings;
  const int64_t world_then =
      then.contains("WORLD_SIZE") ? then.at("WORLD_SIZE").get<int64_t>() : world;
  elastic_ =
      world_then != world || start_.batch_size != batch_ || start_.accum_steps != o_.accum_steps;
  if (elastic_) {
    start_consumed_ = ConsumedSamples(
        train_->size(), static_cast<uint64_t>(start_.epoch_skip),
        static_cast<uint64_t>(start_.step_in_epoch * start_.accum_steps),
        static_cast<uint64_t>(start_.batch_size), static_cast<uint64_t>(world_then));
    out_ << "resume elastic: made with WORLD_SIZE=" << world_then << ", batch " << start_.batch_size
         << " x " << start_.accum_steps << " accumulation; this run has " << world << ", " << batch_
         << " x " << o_.accum_steps << ": epoch " << start_.epoch + 1 << " continues after "
         << start_consumed_ << " of its " << train_->size()
         << " samples, shared among this run's ranks\n";
  }
  return Status::OK();
}

Status Trainer::Save(const std::string& dir, int64_t epoch, int64_t step_in_epoch,
                     const EpochSoFar& so_far) {
  if (!lead()) return Status::OK();
  Checkpoint c;
  c.epoch = epoch;
  c.step_in_epoch = step_in_epoch;
  c.epoch_skip = epoch == epoch_now_ ? epoch_skip_ : 0;
  c.global_step = global_step_;
  c.scale = scaler_.scale();
  c.growth_tracker = scaler_.growth_tracker();
  c.skipped = scaler_.skipped_steps();
  c.batch_size = batch_;
  c.accum_steps = o_.accum_steps;
  c.model = o_.model;
  c.so_far = so_far;
  c.settings = Settings();
  c.groups = groups_;
  return SaveCheckpoint(dir, model_, *opt_, c);
}

}  // namespace kiln::train::internal

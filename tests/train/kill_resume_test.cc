// kiln train --save killed with SIGKILL at seeded random moments: every
// kill leaves a checkpoint --resume takes, training goes on from it, and a
// checkpoint is never half-written.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

// The complete checkpoint of --save DIR, where an interrupted swap may have
// left it (DIR, DIR.partial, DIR.old: src/train/checkpoint.cc), or "".
std::string CompleteCheckpoint(const std::string& dir) {
  for (const char* suffix : {"", ".partial", ".old"})
    if (fs::exists(dir + suffix + "/state.json")) return dir + suffix;
  return "";
}

int64_t GlobalStep(const std::string& checkpoint) {
  const std::string state = ReadFile(checkpoint + "/state.json");
  const size_t at = state.find("\"global_step\":");
  REQUIRE(at != std::string::npos);
  return std::stoll(state.substr(at + 14));
}

// Waits (at most two minutes) until the run has saved a checkpoint past
// `step`: LibTorch's start-up takes from a second to several on a busy
// machine, so a kill timed from the start alone may land before any save.
bool SavedPast(const std::string& dir, int64_t step) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string c = CompleteCheckpoint(dir);
    if (!c.empty()) {
      const std::string state = ReadFile(c + "/state.json");
      const size_t at = state.find("\"global_step\":");
      if (at != std::string::npos && std::stoll(state.substr(at + 14)) > step) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int StartTrain(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {KILN_BIN, "train"};
  argv.insert(argv.end(), args.begin(), args.end());
  return StartProcess(argv, log);
}

}  // namespace

TEST_CASE("kiln train --save killed at seeded random moments resumes from its last checkpoint",
          "[train][kill]") {
  TempDir dir;
  // 256 small records: an epoch (and its checkpoint) every few milliseconds,
  // so kills land before, during and after saves.
  WriteTestCache(dir / "data", 256, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  const std::string ck = dir / "ck", log = dir / "log";
  const std::vector<std::string> base = {"--data", dir / "data", "--model", "mlp", "--epochs",
                                         "100000", "--batch-size", "32", "--log-every", "0",
                                         "--precision", "fp32", "--device", "cpu", "--save", ck};
  std::mt19937_64 rng(20261203);
  // After the run's first new save: epochs (and saves) take milliseconds,
  // so the kill lands before, during or after one of its later saves.
  std::uniform_int_distribution<int> delay_ms(0, 400);
  int64_t last_step = 0;
  int resumed = 0, progressed = 0;
  for (int round = 0; round < 8; ++round) {
    std::vector<std::string> args = base;
    const std::string found = CompleteCheckpoint(ck);
    if (!found.empty()) args.insert(args.end(), {"--resume", ck});
    const int pid = StartTrain(args, log);
    const bool saved = SavedPast(ck, last_step);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(pid, SIGKILL);
    const int status = WaitExit(pid);
    INFO("round " << round << ", exit " << status << "\n" << ReadFile(log));
    REQUIRE(saved);  // the run trained and saved within two minutes
    REQUIRE(status == 128 + SIGKILL);
    resumed += !found.empty();
    // Whatever the moment, a complete checkpoint remains, and it moved on
    // from the one the run resumed (a run that started over would count
    // its steps from 0 again). Its output, buffered, died with it.
    const std::string now = CompleteCheckpoint(ck);
    if (now.empty()) continue;  // killed before the first save
    for (const char* file : {"model.pt", "optimizer.pt", "rng.pt"})
      CHECK(fs::file_size(now + "/" + file) > 0);
    const int64_t step = GlobalStep(now);
    CHECK(step >= last_step);
    if (!found.empty()) progressed += step > last_step;
    last_step = step;
  }
  REQUIRE(resumed >= 5);
  CHECK(progressed >= 4);  // most resumed runs saved again before their kill
  // The last run finishes: 3 steps past the newest checkpoint.
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--resume", ck, "--max-steps", std::to_string(last_step + 3)});
  const int status = WaitExit(StartTrain(args, log));
  INFO(ReadFile(log));
  REQUIRE(status == 0);
  CHECK(GlobalStep(ck) == last_step + 3);
}

TEST_CASE("kiln train says its epochs' and its run's times in human units", "[train]") {
  TempDir dir;
  WriteTestCache(dir / "data", 64, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  const std::string log = dir / "log";
  const int status = WaitExit(
      StartTrain({"--data", dir / "data", "--model", "mlp", "--epochs", "2", "--batch-size", "16",
                  "--log-every", "0", "--precision", "fp32", "--device", "cpu"},
                 log));
  const std::string out = ReadFile(log);
  INFO(out);
  REQUIRE(status == 0);
  const size_t at = out.find("kiln train: ");
  REQUIRE(at != std::string::npos);
  const std::string line = out.substr(at, out.find('\n', at) - at);
  // "kiln train: 2 epochs (8 steps in all) in 24 ms, 5333 samples/s": the
  // time as units.h's FormatDuration writes it, never a raw double.
  // Under a second in ms (the old epoch line said "0.0 s").
  const std::string human = R"((\d{1,3}(\.\d)? ms|[1-9]\d?\.\d{1,2} s|\d+ min \d\d s))";
  CHECK_THAT(line, Catch::Matches(R"(kiln train: 2 epochs \(8 steps in all\) in )" + human +
                                  R"(, \d+ samples/s)"));
  // Each epoch's line too: "epoch 1/2 done in 12 ms: train loss ...".
  for (const char* epoch : {"epoch 1/2 done in ", "epoch 2/2 done in "}) {
    const size_t e = out.find(epoch);
    REQUIRE(e != std::string::npos);
    CHECK_THAT(out.substr(e, out.find(':', e) - e), Catch::Matches(std::string(epoch) + human));
  }
}

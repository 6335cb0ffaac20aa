// kiln train's checkpoints: --save, --resume (mid-epoch, after Ctrl-C,
// after a save cut short) and the settings a resume must keep.
#include <torch/torch.h>
// LibTorch brings glog, whose CHECK would replace Catch's.
#undef CHECK
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <regex>
#include <sstream>

#include "kiln/train/trainer.h"
#include "test_util.h"
#include "train_test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::train;

TEST_CASE("a checkpoint resumed mid-epoch ends where an uninterrupted run ends", "[train]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  auto options = [&](std::ostringstream* log) {
    TrainOptions o = Quiet(dir / "train", log);
    o.epochs = 2;  // 300 samples / 32 = 9 steps per epoch
    o.seed = 7;
    return o;
  };
  std::ostringstream log;
  TrainOptions whole = options(&log);
  whole.save = dir / "whole";
  TrainResult r;
  REQUIRE(Train(whole, &r).ok());
  REQUIRE(r.steps == 18);

  TrainOptions first = options(&log);
  first.save = dir / "parts";
  first.max_steps = 5;  // stops inside epoch 1
  REQUIRE(Train(first, &r).ok());
  REQUIRE(r.steps == 5);
  TrainOptions rest = options(&log);
  rest.save = dir / "parts";
  rest.resume = dir / "parts";
  Status s = Train(rest, &r);
  INFO(log.str());
  REQUIRE(s.ok());
  CHECK(r.steps == 18);
  CHECK(MaxDifference(LoadTensors(dir / "whole/model.pt"), LoadTensors(dir / "parts/model.pt")) ==
        0.0);

  // Another batch size is an elastic resume (trainer_test covers its epochs).
  std::ostringstream other_log;
  TrainOptions other = options(&other_log);
  other.resume = dir / "parts";
  other.batch_size = 64;
  CHECK(Train(other, &r).ok());
  CHECK_THAT(other_log.str(), Catch::Contains("resume elastic: made with WORLD_SIZE=1, batch 32"));
}

TEST_CASE("Ctrl-C saves a checkpoint before exiting, and --resume finishes the run", "[train]") {
  TempDir dir;
  if (!BuildSampleCaches(dir)) return;
  // kiln train in a child process; SIGINT once it has logged its first steps.
  const std::string ck = dir / "ck";
  int out[2];
  REQUIRE(::pipe(out) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    const std::string data = dir / "train";
    ::execl(KILN_BIN, KILN_BIN, "train", "--data", data.c_str(), "--epochs", "10000",
            "--batch-size", "32", "--log-every", "1", "--save", ck.c_str(), "--precision", "fp32",
            "--device", "cpu", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  std::string log;
  char buf[4096];
  bool signalled = false;
  for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) > 0;) {
    log.append(buf, static_cast<size_t>(n));
    if (!signalled && log.find("epoch 1 step 3/") != std::string::npos) {
      ::kill(pid, SIGINT);
      signalled = true;
    }
  }
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO(log);
  REQUIRE(signalled);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  CHECK(log.find("interrupted: checkpoint saved to " + ck) != std::string::npos);
  REQUIRE(std::filesystem::exists(ck + "/state.json"));
  REQUIRE(std::filesystem::exists(ck + "/model.pt"));

  // Resume it for 3 more steps: it continues from the saved step.
  const std::string state = ReadFile(ck + "/state.json");
  const size_t at = state.find("\"global_step\":");
  REQUIRE(at != std::string::npos);
  const int64_t saved = std::stoll(state.substr(at + 14));
  CHECK(saved >= 3);
  std::ostringstream resumed;
  TrainOptions o = Quiet(dir / "train", &resumed);
  o.epochs = 10000;
  o.max_steps = saved + 3;
  o.resume = ck;
  TrainResult r;
  Status s = Train(o, &r);
  INFO(resumed.str());
  REQUIRE(s.ok());
  CHECK(resumed.str().find("resume " + ck) != std::string::npos);
  CHECK(r.steps == saved + 3);
}

TEST_CASE("a --save DIR/ saves beside DIR, and a --save that cannot work fails before training",
          "[train]") {
  namespace fs = std::filesystem;
  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  o.epochs = 2;  // two saves: the second replaces the first
  o.save = dir / "ck/";
  TrainResult r;
  Status s = Train(o, &r);
  INFO(s.ToString() << "\n" << log.str());
  REQUIRE(s.ok());
  CHECK(r.checkpoint == o.save);
  CHECK(fs::exists(dir / "ck/state.json"));
  CHECK_FALSE(fs::exists(dir / "ck/.partial"));
  CHECK_FALSE(fs::exists(dir / "ck.partial"));
  CHECK_FALSE(fs::exists(dir / "ck.old"));
  // "." and ".." parts, and --resume with a trailing slash.
  o.epochs = 3;
  o.resume = dir / "ck/";
  o.save = dir / "sub/../ck/./";
  REQUIRE(Train(o, &r).ok());
  CHECK(r.steps == 12);
  CHECK(fs::exists(dir / "ck/state.json"));
  CHECK_FALSE(fs::exists(dir / "sub"));
  o.resume = "";

  // A --save below a regular file: refused at start-up, naming the path,
  // before a step is trained.
  WriteFile(dir / "file", "not a directory");
  o.save = dir / "file/ck";
  std::ostringstream bad_log;
  o.log = &bad_log;
  s = Train(o, &r);
  CHECK(s.IsIOError());
  CHECK_THAT(s.message(), Catch::Contains("--save " + dir / "file/ck"));
  CHECK(bad_log.str().find("done in") == std::string::npos);
  CHECK(r.steps == 0);
  // A directory of other files would be replaced (and deleted) by the save.
  fs::create_directories(dir / "notes");
  WriteFile(dir / "notes/keep.txt", "mine");
  o.save = dir / "notes";
  s = Train(o, &r);
  CHECK(s.IsInvalidArgument());
  CHECK_THAT(s.message(), Catch::Contains(dir / "notes") && Catch::Contains("state.json"));
  CHECK(ReadFile(dir / "notes/keep.txt") == "mine");
  CHECK(bad_log.str().find("done in") == std::string::npos);
}

TEST_CASE("resume finds the checkpoint that a save stopped during its swap left behind",
          "[train]") {
  namespace fs = std::filesystem;
  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  o.seed = 3;
  // Real checkpoints after epoch 1 and after epoch 2 (4 steps each).
  TrainResult r;
  o.epochs = 1;
  o.save = dir / "one";
  REQUIRE(Train(o, &r).ok());
  o.epochs = 2;
  o.save = dir / "two";
  REQUIRE(Train(o, &r).ok());
  REQUIRE(r.steps == 8);

  // Killed between DIR -> DIR.old and DIR.partial -> DIR: both complete, no
  // DIR. The newer, DIR.partial, is the one to continue.
  fs::rename(dir / "one", dir / "ck.old");
  fs::rename(dir / "two", dir / "ck.partial");
  o.epochs = 3;
  o.resume = dir / "ck";
  o.save = dir / "ck";
  std::ostringstream resumed;
  o.log = &resumed;
  Status s = Train(o, &r);
  INFO(s.ToString() << "\n" << resumed.str());
  REQUIRE(s.ok());
  CHECK_THAT(resumed.str(), Catch::Contains("using " + dir / "ck.partial"));
  CHECK(r.steps == 12);  // from the end of epoch 2
  CHECK(fs::exists(dir / "ck/state.json"));
  CHECK_FALSE(fs::exists(dir / "ck.partial"));
  CHECK_FALSE(fs::exists(dir / "ck.old"));

  // Killed while DIR.partial was being written (no state.json yet) after
  // the previous DIR became DIR.old: DIR.old is the one.
  fs::rename(dir / "ck", dir / "ck.old");
  fs::create_directories(dir / "ck.partial");
  fs::copy_file(dir / "ck.old/model.pt", dir / "ck.partial/model.pt");
  o.epochs = 4;
  std::ostringstream from_old;
  o.log = &from_old;
  s = Train(o, &r);
  INFO(s.ToString() << "\n" << from_old.str());
  REQUIRE(s.ok());
  CHECK_THAT(from_old.str(), Catch::Contains("using " + dir / "ck.old"));
  CHECK(r.steps == 16);  // from the end of epoch 3
  CHECK(fs::exists(dir / "ck/state.json"));
  CHECK_FALSE(fs::exists(dir / "ck.old"));

  // A fresh run saving into such a DIR ends with its own checkpoint there
  // (the save first renames the complete copy back to DIR, so that DIR is
  // complete whenever DIR.partial or DIR.old is deleted).
  fs::rename(dir / "ck", dir / "ck.old");
  fs::create_directories(dir / "ck.partial");
  o.resume = "";
  o.epochs = 1;
  REQUIRE(Train(o, &r).ok());
  CHECK(fs::exists(dir / "ck/state.json"));
  CHECK(ReadFile(dir / "ck/state.json").find("\"global_step\": 4") != std::string::npos);

  // Nothing complete anywhere: not a checkpoint, as before.
  o.resume = dir / "nothing";
  s = Train(o, &r);
  CHECK(s.IsNotFound());
  CHECK_THAT(s.message(), Catch::Contains(dir / "nothing") && Catch::Contains("--save"));
}

TEST_CASE("resume refuses options that would not continue the checkpoint's training", "[train]") {
  TempDir dir;
  std::ostringstream log;
  auto options = [&] {
    TrainOptions o = SyntheticMlp(dir, &log);
    o.epochs = 2;
    o.seed = 5;
    o.freeze = {"fc1"};
    return o;
  };
  TrainOptions first = options();
  first.max_steps = 2;
  first.save = dir / "ck";
  TrainResult r;
  REQUIRE(Train(first, &r).ok());
  const std::string ck = dir / "ck";

  struct Case {
    std::function<void(TrainOptions&)> change;
    std::string then, now;  // how the message shows the two runs' settings
  };
  const std::vector<Case> cases = {
      {[](TrainOptions& o) { o.freeze = {"fc2"}; }, "--freeze fc1", "--freeze fc2"},
      {[](TrainOptions& o) { o.freeze_until = "fc2"; }, "no --freeze-until", "--freeze-until fc2"},
      {[](TrainOptions& o) { o.lr_head = 0.01; }, "no --lr-head", "--lr-head 0.01"},
      {[](TrainOptions& o) { o.optimizer = OptimizerKind::kAdamW; }, "--optimizer sgd",
       "--optimizer adamw"},
      {[](TrainOptions& o) { o.seed = 6; }, "--seed 5", "--seed 6"},
      {[](TrainOptions& o) { o.flip = true; }, "no --flip", "--flip"},
      {[](TrainOptions& o) { o.crop = 6; }, "--crop 0", "--crop 6"},
      {[](TrainOptions& o) { o.model = "cnn"; }, "--model mlp", "--model cnn"},
  };
  for (const auto& c : cases) {
    TrainOptions o = options();
    o.resume = ck;
    c.change(o);
    std::ostringstream refused;
    o.log = &refused;
    Status s = Train(o, &r);
    INFO(c.now << ": " << s.ToString());
    CHECK(s.IsInvalidArgument());
    CHECK_THAT(s.message(), Catch::Contains("--resume " + ck + ": made with " + c.then +
                                            ", this run has " + c.now));
    CHECK(refused.str().find("resume ") == std::string::npos);  // refused before training
    CHECK(r.steps == 0);
  }

  // What may change: more epochs, logging, outputs, threads, --max-steps, --lr
  // (and, elastically, WORLD_SIZE, --batch-size and --accum-steps: below).
  TrainOptions more = options();
  more.resume = ck;
  more.epochs = 3;
  more.log_every = 1;
  more.metrics = dir / "metrics.jsonl";
  more.save = dir / "elsewhere";
  more.workers = 1;
  more.threads = 1;
  more.max_steps = 3;
  more.lr = 0.01;
  more.export_path = dir / "model.pt";
  Status s = Train(more, &r);
  INFO(s.ToString() << "\n" << log.str());
  REQUIRE(s.ok());
  CHECK(r.steps == 3);

  // A checkpoint from 2 ranks, resumed by one process: elastic, the epoch
  // goes on after the samples both ranks had consumed.
  std::string state = ReadFile(ck + "/state.json");
  REQUIRE(state.find("\"WORLD_SIZE\": 1") != std::string::npos);
  WriteFile(ck + "/state.json",
            std::regex_replace(state, std::regex("\"WORLD_SIZE\": 1"), "\"WORLD_SIZE\": 2"));
  log.str("");
  TrainOptions one = options();
  one.resume = ck;
  s = Train(one, &r);
  INFO(s.ToString() << "\n" << log.str());
  CHECK(s.ok());
  CHECK_THAT(log.str(), Catch::Contains("resume elastic: made with WORLD_SIZE=2"));

  // An older checkpoint, without the settings: accepted as before.
  WriteFile(ck + "/state.json",
            std::regex_replace(state, std::regex("\"settings\": \\{[^}]*\\},?"), ""));
  REQUIRE(ReadFile(ck + "/state.json").find("settings") == std::string::npos);
  TrainOptions older = options();
  older.resume = ck;
  older.seed = 6;
  s = Train(older, &r);
  INFO(s.ToString());
  CHECK(s.ok());
}

TEST_CASE("an epoch resumed in the middle reports the loss and accuracy of the whole epoch",
          "[train]") {
  TempDir dir;
  std::ostringstream log;
  TrainOptions o = SyntheticMlp(dir, &log);
  o.epochs = 2;
  o.seed = 11;
  TrainResult whole;
  REQUIRE(Train(o, &whole).ok());
  REQUIRE(whole.epochs.size() == 2);

  o.save = dir / "ck";
  o.max_steps = 2;  // half of epoch 1
  TrainResult part;
  REQUIRE(Train(o, &part).ok());
  o.max_steps = 0;
  o.resume = dir / "ck";
  o.metrics = dir / "metrics.jsonl";
  TrainResult rest;
  Status s = Train(o, &rest);
  INFO(s.ToString() << "\n" << log.str());
  REQUIRE(s.ok());
  REQUIRE(rest.epochs.size() == 2);
  CHECK(std::abs(rest.epochs[0].train_loss - whole.epochs[0].train_loss) < 1e-6);
  CHECK(rest.epochs[0].train_acc == whole.epochs[0].train_acc);
  CHECK(rest.epochs[0].samples_per_second > 0);
  CHECK(std::abs(rest.epochs[1].train_loss - whole.epochs[1].train_loss) < 1e-6);
  // The metrics line of epoch 1 has the whole epoch's loss too.
  const std::string metrics = ReadFile(dir / "metrics.jsonl");
  const size_t at = metrics.find("\"train_loss\":");
  REQUIRE(at != std::string::npos);
  CHECK(std::abs(std::stod(metrics.substr(at + 13)) - whole.epochs[0].train_loss) < 1e-6);
}

TEST_CASE("resume refuses a damaged state.json, naming it and the field, and saves nothing",
          "[train]") {
  TempDir dir;
  std::ostringstream log;
  TrainOptions first = SyntheticMlp(dir, &log);
  first.max_steps = 3;
  first.save = dir / "ck";
  TrainResult r;
  REQUIRE(Train(first, &r).ok());
  const std::string ck = dir / "ck", state_file = ck + "/state.json";
  const std::string good = ReadFile(state_file), weights = ReadFile(ck + "/model.pt");
  // `field` set to `value` in the saved text.
  auto with = [&](const std::string& field, const std::string& value) {
    const std::regex re("\"" + field + "\": [^,\n]*");
    REQUIRE(std::regex_search(good, re));
    return std::regex_replace(good, re, "\"" + field + "\": " + value);
  };
  struct Case {
    std::string text, names;  // names: what the message points at
  };
  const std::vector<Case> cases = {
      {good.substr(0, good.size() / 2), "not valid JSON"},
      {with("epoch", "\"one\""), "epoch"},
      {with("epoch", "1e300"), "epoch"},
      {with("global_step", "-4"), "global_step"},
      {with("loss_scale", "-1.0"), "loss_scale"},
      {with("loss_scale", "0"), "loss_scale"},
      {with("loss_scale", "1e400"), "not valid JSON"},  // nlohmann refuses the overflow
      {with("seconds", "-3.5"), "seconds"},
      {with("model", "7"), "string"},
      {std::regex_replace(good, std::regex("\"batch_size\": [0-9]+,?"), ""), "batch_size"},
  };
  for (const auto& c : cases) {
    WriteFile(state_file, c.text);
    TrainOptions o = SyntheticMlp(dir, &log);
    o.resume = ck;
    o.save = ck;  // a refused resume must not replace the checkpoint either
    Status s = Train(o, &r);
    INFO(c.text << "\n-> " << s.ToString());
    CHECK(s.IsCorruption());
    CHECK_THAT(s.message(), Catch::Contains(state_file) && Catch::Contains(c.names) &&
                                Catch::Contains("start without --resume"));
    CHECK(r.steps == 0);
    CHECK(ReadFile(state_file) == c.text);
    CHECK(ReadFile(ck + "/model.pt") == weights);
  }
  WriteFile(state_file, good);  // repaired, it resumes
  TrainOptions o = SyntheticMlp(dir, &log);
  o.resume = ck;
  o.max_steps = 4;
  Status s = Train(o, &r);
  INFO(s.ToString());
  CHECK(s.ok());
  CHECK(r.steps == 4);
}

// Distributed kiln train (Gloo, launched like torchrun): validation on every
// rank's share, and the faults a run meets - a dead peer, a store nobody
// hosts - each ending the rank with a message that names it and the cause.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "kiln/train/trainer.h"
#include "test_util.h"
#include "train_test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::train;

namespace {

// Starts rank `rank` of `world` of `kiln train ARGS`, its output to LOG.
int StartRank(int rank, int world, const std::string& port, const std::string& args,
              const std::string& log) {
  return StartProcess({"/bin/sh", "-c",
                       "RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) +
                           " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " exec " + KILN_BIN +
                           " train" + args},
                      log);
}

bool WithoutGloo(const std::string& log) {
  if (log.find("without c10d") == std::string::npos) return false;
  SkipWithoutGloo(log);
  return true;
}

}  // namespace

TEST_CASE("two ranks each evaluate their share: the validation figures of one process",
          "[train][dist]") {
  TempDir dir;
  WriteTestCache(dir / "train", 64, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  // 33 records: rank 0 gets 17, rank 1 16 and one wrap-around repeat, not counted.
  WriteTestCache(dir / "val", 33, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  const std::string common = " --data " + dir / "train" + " --val " + dir / "val" +
                             " --model mlp --epochs 1 --schedule constant --lr 0.1"
                             " --precision fp32 --device cpu --log-every 0 --dist-timeout 60";
  const std::string port = FreeLocalPort();
  int pids[2];
  for (int r = 0; r < 2; ++r)
    pids[r] = StartRank(r, 2, port, common + " --batch-size 16",
                        dir / ("rank" + std::to_string(r) + ".log"));
  int status[2];
  for (int r = 0; r < 2; ++r) status[r] = WaitExit(pids[r]);
  const std::string log0 = ReadFile(dir / "rank0.log");
  if (WithoutGloo(log0)) return;
  INFO(log0 << "\nrank 1:\n" << ReadFile(dir / "rank1.log"));
  REQUIRE(status[0] == 0);
  REQUIRE(status[1] == 0);
  std::smatch m;
  REQUIRE(std::regex_search(log0, m, std::regex("val loss ([0-9.]+), top-1 ([0-9.]+)%")));
  const double loss = std::stod(m[1]), top1 = std::stod(m[2]);

  // One process, batch 32: the same update, and every val record once.
  std::ostringstream log;
  TrainOptions o;
  o.data = dir / "train";
  o.val = dir / "val";
  o.model = "mlp";
  o.epochs = 1;
  o.batch_size = 32;
  o.schedule = LrSchedule::kConstant;
  o.lr = 0.1;
  o.precision = PrecisionChoice::kFp32;
  o.device = "cpu";
  o.log_every = 0;
  o.log = &log;
  TrainResult r;
  REQUIRE(Train(o, &r).ok());
  REQUIRE(r.epochs.size() == 1);
  CHECK(loss == Approx(r.epochs[0].val_loss).epsilon(2e-4));  // printed with 4 decimals
  CHECK(top1 == Approx(100 * r.epochs[0].val_top1).margin(0.006));
}

TEST_CASE("a rank whose peer is killed exits non-zero, naming itself and the cause",
          "[train][dist]") {
  TempDir dir;
  WriteTestCache(dir / "train", 512, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  const std::string args = " --data " + dir / "train" +
                           " --model mlp --epochs 100000 --batch-size 16 --precision fp32"
                           " --device cpu --log-every 10 --dist-timeout 60";
  const std::string port = FreeLocalPort();
  const int r0 = StartRank(0, 2, port, args, dir / "rank0.log");
  const int r1 = StartRank(1, 2, port, args, dir / "rank1.log");
  // Kill rank 1 once rank 0 trains (or after 60 s, whatever happened).
  for (int i = 0; i < 600; ++i) {
    if (ReadFile(dir / "rank0.log").find("step 10/") != std::string::npos) break;
    if (WithoutGloo(ReadFile(dir / "rank0.log"))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(r1, SIGKILL);
  WaitExit(r1);
  const auto t0 = std::chrono::steady_clock::now();
  const int status = WaitExit(r0);
  const std::string log0 = ReadFile(dir / "rank0.log");
  if (WithoutGloo(log0)) return;
  INFO(log0);
  CHECK(status == 2);
  CHECK_THAT(log0, Catch::Contains("rank 0 of 2 (cpu): the ") &&
                       Catch::Contains(" failed: a peer rank is gone") &&
                       !Catch::Contains("training failed in LibTorch"));
  INFO(log0);
  WARN("rank 0 ended " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                       << " s after its peer's kill");
}

TEST_CASE("a rank that cannot join the store gives up after --dist-timeout, saying why",
          "[train][dist]") {
  TempDir dir;
  WriteTestCache(dir / "train", 64, DType::kFloat16, MakeShape({1, 8, 8}), 4);
  const std::string args = " --data " + dir / "train" +
                           " --model mlp --epochs 1 --device cpu --dist-timeout 3";
  const std::string port = FreeLocalPort();
  // Rank 1 of 2 with no rank 0 hosting the store.
  int status = WaitExit(StartRank(1, 2, port, args, dir / "rank1.log"));
  std::string log = ReadFile(dir / "rank1.log");
  if (WithoutGloo(log)) return;
  INFO(log);
  CHECK(status == 2);
  CHECK_THAT(log, Catch::Contains("rank 1 of 2: cannot join the store at 127.0.0.1:" + port +
                                  " within 3 s (--dist-timeout): is rank 0 running"));
  // Rank 0 of 2 alone: the other rank never comes.
  status = WaitExit(StartRank(0, 2, port, args, dir / "rank0.log"));
  log = ReadFile(dir / "rank0.log");
  INFO(log);
  CHECK(status == 2);
  CHECK_THAT(log, Catch::Contains("rank 0 of 2: not every rank joined the store at 127.0.0.1:" +
                                  port + " within 3 s"));
  // A timeout below a second is refused before anything starts.
  status = WaitExit(StartRank(0, 2, port, args.substr(0, args.find(" --dist-timeout")) +
                                        " --dist-timeout 0", dir / "bad.log"));
  CHECK(status == 2);
  CHECK_THAT(ReadFile(dir / "bad.log"), Catch::Contains("--dist-timeout 0: must be at least 1"));
}

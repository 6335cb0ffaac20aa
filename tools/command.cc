#include "command.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "kiln/units.h"

namespace kiln::tools {

namespace {
std::vector<Command>& Table() {
  static std::vector<Command> table;
  return table;
}
}  // namespace

bool RegisterCommand(Command command) {
  Table().push_back(std::move(command));
  return true;
}

std::vector<Command> RegisteredCommands() {
  std::vector<Command> v = Table();
  std::sort(v.begin(), v.end(), [](const Command& a, const Command& b) { return a.order < b.order; });
  return v;
}

int ExecBeside(const std::string& exe, std::vector<std::string> argv) {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = ".";
  if (n > 0) {
    self[n] = 0;
    dir = self;
    dir = dir.substr(0, dir.rfind('/'));
  }
  const std::string path = dir + "/" + exe;
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  ::execv(path.c_str(), args.data());
  std::cerr << "kiln " << (argv.size() > 1 ? argv[1] : exe) << ": cannot run " << path << " ("
            << std::strerror(errno) << "); it is built beside kiln"
            << (exe == "kiln-train" ? " when LibTorch is found (cmake -DKILN_WITH_TORCH=ON)" : "")
            << ": build again with cmake --build build\n";
  return kExitUsage;
}

void AddBenchOptions(CLI::App* sub, BenchArgs* a) {
  sub->add_option("CACHE", a->dir, "cache directory")->required();
  sub->add_option("--batch", a->batch, "batch size (default 256)");
  sub->add_option("--workers", a->workers, "loader threads (default 2)");
  sub->add_option("--epochs", a->epochs, "epochs to time (default 3)");
  sub->add_option("--device", a->device,
                  "cpu (default), or cuda / cuda:N: the tensor loader onto the GPU, with the "
                  "pinned host-to-device floor (runs kiln-train)");
}

int ReportError(const std::string& cmd, const Status& s) {
  std::cerr << "kiln " << cmd << ": " << s.ToString() << "\n";
  return (s.IsCorruption() || s.IsStale() || s.IsIncomplete()) ? kExitBadData : kExitUsage;
}

std::string HumanBytes(double bytes) { return FormatByteSize(bytes); }

}  // namespace kiln::tools

#include "command.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "core/suggest.h"
#include "core/units.h"

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
  sub->add_flag("--cold", a->cold,
                "drop the cache from the page cache before each epoch (no root needed) and "
                "compare with the disk's floors measured in the same run: a sequential read of "
                "the shards and record-sized random reads at 1, 2, 8 and 32 threads");
  sub->add_option("--readahead", a->readahead,
                  "the loader's read-ahead: auto (default: 256 MB, or a quarter of the memory "
                  "available when less), 0 (off), or a size such as 64M");
  AddExamples(sub, {"kiln bench OUT/train --batch 256 --workers 2", "kiln bench OUT/train --cold",
                    "kiln bench OUT/train --device cuda"});
}

int ReportError(const std::string& cmd, const Status& s) {
  std::cerr << "kiln " << cmd << ": " << s.ToString() << "\n";
  return (s.IsCorruption() || s.IsStale() || s.IsIncomplete()) ? kExitBadData : kExitUsage;
}

void AddExamples(CLI::App* sub, const std::vector<std::string>& lines) {
  std::string s = "Examples:";
  for (const std::string& l : lines) s += "\n  " + l;
  const std::string inherited = sub->get_footer();
  sub->footer(inherited.empty() ? s : s + "\n\n" + inherited);
}

std::string UnknownNameMessage(const CLI::App& app, int argc, const char* const* argv) {
  if (argc < 2) return "";
  const std::string first = argv[1];
  const CLI::App* cmd = &app;
  std::string who = "kiln";
  int from = 1;
  if (first.empty() || first[0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), first) == names.end()) {
      const std::string near = DidYouMean(first, names);
      std::string all;
      for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
      return "kiln: unknown subcommand '" + first + "'" +
             (near.empty() ? "; the subcommands are " + all : near);
    }
    cmd = app.get_subcommand(first);
    who += " " + first;
    from = 2;
  }
  std::vector<std::string> names;  // with their dashes: --resize, -h
  for (const CLI::Option* o : cmd->get_options()) {
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
    for (const std::string& n : o->get_snames()) names.push_back("-" + n);
  }
  for (int i = from; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;  // the rest are positional
    std::string name;
    if (arg.size() > 2 && arg.compare(0, 2, "--") == 0) {
      name = arg.substr(0, arg.find('='));
    } else if (arg.size() > 1 && arg[0] == '-' && std::isalpha(static_cast<unsigned char>(arg[1]))) {
      name = arg.substr(0, 2);  // -x, -xVALUE
    } else {
      continue;
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    return who + ": unknown option " + name + DidYouMean(name, names);
  }
  return "";
}

std::string HumanBytes(double bytes) { return FormatByteSize(bytes); }

}  // namespace kiln::tools

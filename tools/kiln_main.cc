// kiln: build, verify and inspect tensor caches of image datasets.
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "command.h"
#include "kiln/manifest.h"

namespace {

// `kiln NAME ...` for a command that lives in its own executable beside
// this one: replaces this process with it. Returns only on failure.
int RunExternal(const kiln::tools::Command& c, char** argv) {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = ".";
  if (n > 0) {
    self[n] = 0;
    dir = self;
    dir = dir.substr(0, dir.rfind('/'));
  }
  const std::string path = dir + "/" + c.external;
  ::execv(path.c_str(), argv);
  std::cerr << "kiln " << c.name << ": cannot run " << path << " (" << std::strerror(errno)
            << "); it is built beside kiln when LibTorch is found (cmake -DKILN_WITH_TORCH=ON)\n";
  return kiln::tools::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln::tools;
  if (argc > 1)
    for (const Command& c : RegisteredCommands())
      if (!c.external.empty() && c.name == argv[1]) return RunExternal(c, argv);
  CLI::App app{"kiln: decode an image dataset once into a verified tensor cache, and train from it"};
  app.set_version_flag("--version", std::string("kiln ") + kiln::KilnVersion());
  app.require_subcommand(1);
  app.footer("Exit codes: 0 ok, 1 the data is bad (corrupt, stale, incomplete, rejected under "
             "--strict), 2 usage or environment error.");
  std::function<int()> run;
  for (const Command& c : RegisteredCommands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    if (!c.external.empty()) continue;  // run before parsing, above
    auto runner = c.setup(sub);
    sub->callback([&run, runner] { run = runner; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  try {
    return run ? run() : kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "kiln: unexpected error: " << e.what() << "\n";
    return kExitUsage;
  }
}

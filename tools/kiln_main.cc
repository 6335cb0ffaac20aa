// kiln: build, verify and inspect tensor caches of image datasets.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "command.h"
#include "kiln/manifest.h"

int main(int argc, char** argv) {
  using namespace kiln::tools;
  if (argc > 1) {
    for (const Command& c : RegisteredCommands()) {
      if (c.name != argv[1]) continue;
      bool set = false;
      for (const auto& [name, value] : c.environment) {
        if (std::getenv(name.c_str()) != nullptr) continue;  // the user's setting wins
        ::setenv(name.c_str(), value.c_str(), 1);
        set = true;
      }
      if (!c.external.empty())
        return ExecBeside(c.external, std::vector<std::string>(argv, argv + argc));
      if (set) {  // this executable's libraries read them at load: start again with them
        ::execv("/proc/self/exe", argv);
        std::cerr << "kiln: cannot execute /proc/self/exe again: " << std::strerror(errno)
                  << "; set " << c.environment.front().first << " yourself to go on\n";
        return kExitUsage;
      }
    }
  }
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
    // A mistyped name gets the nearest real ones; other errors CLI11's message.
    const std::string unknown = UnknownNameMessage(app, argc, argv);
    if (unknown.empty()) app.exit(e);
    else std::cerr << unknown << "\nRun with --help for more information.\n";
    return kExitUsage;
  }
  try {
    return run ? run() : kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "kiln: unexpected error: " << e.what() << "\n";
    return kExitUsage;
  }
}

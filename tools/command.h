// The subcommand table of the `kiln` tool. Each tools/cmd_*.cc registers its
// subcommands with a static KILN_COMMAND; CMake compiles only the files of
// the components that are built, so an absent component simply has no
// subcommand.
#ifndef KILN_TOOLS_COMMAND_H_
#define KILN_TOOLS_COMMAND_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "core/launch_env.h"
#include "kiln/status.h"
#include "kiln/verify.h"

namespace kiln::tools {

// Exit codes of every kiln subcommand (docs/design.md "Exit codes").
inline constexpr int kExitOk = 0;
inline constexpr int kExitBadData = 1;  // corrupt, stale, incomplete, rejected under --strict
inline constexpr int kExitUsage = 2;    // usage or environment error

// Adds options to `sub` and returns the function that runs the command
// after parsing (its return value is the exit code).
using CommandSetup = std::function<std::function<int()>(CLI::App* sub)>;

struct Command {
  std::string name;
  std::string description;
  int order;  // position in --help
  CommandSetup setup;
  // When set, the command lives in this executable beside kiln (for
  // example kiln-train, the only one that loads LibTorch): `kiln NAME ...`
  // executes it with the same arguments, and setup is unused.
  std::string external;
  // Environment variables the command sets when they are unset, before the
  // libraries that read them at load time are loaded: main sets them and,
  // for a command of this executable, executes itself again once.
  std::vector<std::pair<std::string, std::string>> environment;
};

// The environment of the commands that run LibTorch, read when the process
// starts (libgomp and glibc read it before main): core's
// TorchProcessEnvironment (src/core/launch_env.h says why each variable).
inline const std::vector<std::pair<std::string, std::string>>& TorchEnvironment() {
  return TorchProcessEnvironment();
}

bool RegisterCommand(Command command);

// `kiln verify --level sources|deep` (level: "sources" or "deep"): the
// checks against the sources, which need kiln::ingest. Defined beside the
// build subcommand (cmd_build.cc) when kiln::ingest is built, otherwise in
// verify_sources_none.cc, which says what to rebuild: CMake picks the file.
Status VerifySources(const std::string& dir, const std::string& level,
                     const VerifyOptions& options, uint64_t sample, uint64_t seed,
                     VerifyReport* report);
std::vector<Command> RegisteredCommands();  // sorted by order

// Replaces this process with the executable `exe` that lives beside kiln
// (for example kiln-train, the only one that loads LibTorch), with `argv`
// as its argv: argv[0] is kiln's own, so that help and errors name the
// command the user typed, and argv[1] the subcommand. Returns only on
// failure, with kExitUsage after saying why.
int ExecBeside(const std::string& exe, std::vector<std::string> argv);

// The options of `kiln bench` (tools/cmd_bench.cc), which hands devices
// other than the CPU to `kiln-train bench` (tools/cmd_bench_device.cc).
struct BenchArgs {
  std::string dir;
  uint64_t batch = 256;
  int workers = 2;
  int epochs = 3;
  std::string device = "cpu";
  bool cold = false;              // evict the cache before each epoch; disk floors
  std::string readahead = "auto"; // the loader's read-ahead budget: auto, 0 (off) or a size
};
void AddBenchOptions(CLI::App* sub, BenchArgs* a);

// Prints "kiln <cmd>: <status>" to stderr and returns the exit code for it:
// bad data (Corruption, Stale, Incomplete) -> 1, everything else -> 2.
int ReportError(const std::string& cmd, const Status& s);

// Puts "Examples:" and the command lines `lines`, each a complete command
// a user can adapt, at the top of the footer of `sub`'s --help (above what
// it inherited from kiln's, the exit codes).
void AddExamples(CLI::App* sub, const std::vector<std::string>& lines);

// For a command line that CLI11 refused: "kiln build: unknown option
// --resise; did you mean --resize?" for the first option that `app`'s
// chosen subcommand (or `app` itself) does not have, or "kiln: unknown
// subcommand 'biuld'; did you mean build?", with the nearest names
// (core/suggest.h). "" when every name on the line is known: then CLI11's
// own message says what is wrong.
std::string UnknownNameMessage(const CLI::App& app, int argc, const char* const* argv);

// Formats a byte count as "12.3 MB".
std::string HumanBytes(double bytes);

}  // namespace kiln::tools

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
#define KILN_COMMAND(...) \
  static const bool KILN_CONCAT(kiln_command_, __LINE__) = ::kiln::tools::RegisterCommand(__VA_ARGS__)

#endif  // KILN_TOOLS_COMMAND_H_

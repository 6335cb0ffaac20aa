#include "command.h"

#include <algorithm>
#include <cstdio>
#include <iostream>

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

namespace {
SourceVerifier& SourceVerifierSlot() {
  static SourceVerifier fn;
  return fn;
}
}  // namespace

bool RegisterSourceVerifier(SourceVerifier fn) {
  SourceVerifierSlot() = std::move(fn);
  return true;
}

const SourceVerifier* GetSourceVerifier() {
  return SourceVerifierSlot() ? &SourceVerifierSlot() : nullptr;
}

int ReportError(const std::string& cmd, const Status& s) {
  std::cerr << "kiln " << cmd << ": " << s.ToString() << "\n";
  return (s.IsCorruption() || s.IsStale()) ? kExitBadData : kExitUsage;
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

}  // namespace kiln::tools

#include "progress_printer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

namespace kiln::tools {

Status MakeProgressPrinter(const std::string& verb, const std::string& unit,
                           const std::string& want, ProgressPrinter* out) {
  const std::string mode = want == "auto" ? (::isatty(STDERR_FILENO) ? "tty" : "plain") : want;
  if (mode == "none") {
    *out = nullptr;
    return Status::OK();
  }
  if (mode != "tty" && mode != "plain" && mode != "json")
    return Status::InvalidArgument("--progress " + want +
                                   ": expected auto, tty, plain, json or none");
  // When each cache last printed (seconds since its start; -1: never).
  auto last = std::make_shared<std::map<std::string, double>>();
  *out = [verb, unit, mode, last](const std::string& what, const Progress& p) {
    double& at = last->emplace(what, -1.0).first->second;
    const double rate = p.seconds > 0 ? p.done / p.seconds : 0;
    const double eta = rate > 0 ? (p.total - p.done) / rate : 0;
    const double mbs = p.seconds > 0 ? p.bytes / p.seconds / 1e6 : 0;
    const auto done = static_cast<unsigned long long>(p.done);
    const auto total = static_cast<unsigned long long>(p.total);
    if (mode == "json") {
      if (!p.final && at >= 0 && p.seconds - at < 1) return;
      at = p.seconds;
      nlohmann::json j = {{"cache", what},         {"done", p.done},  {"total", p.total},
                          {unit + "_per_s", rate}, {"mb_per_s", mbs}, {"eta_s", eta},
                          {"final", p.final}};
      std::cerr << j.dump() << std::endl;
    } else if (mode == "tty") {
      if (!p.final && at >= 0 && p.seconds - at < 0.2) return;
      if (p.final && at < 0) return;  // finished before the first update: no line
      at = p.seconds;
      std::fprintf(stderr, "\r%s %s: %llu/%llu %s  %.0f/s  %.1f MB/s  ETA %.0f s   %s",
                   verb.c_str(), what.c_str(), done, total, unit.c_str(), rate, mbs, eta,
                   p.final ? "\n" : "");
    } else if (p.final || p.seconds - std::max(at, 0.0) >= 10) {
      at = p.seconds;
      std::fprintf(stderr, "%s %s: %llu/%llu %s, %.0f/s, %.1f MB/s, ETA %.0f s\n", verb.c_str(),
                   what.c_str(), done, total, unit.c_str(), rate, mbs, eta);
    }
  };
  return Status::OK();
}

}  // namespace kiln::tools

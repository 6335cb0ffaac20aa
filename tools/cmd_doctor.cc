// kiln doctor [CACHE]: is this machine (and this cache) set up for fast
// training? One line per finding (tools/doctor.h).
#include <iostream>

#include "command.h"
#include "doctor.h"

namespace kiln::tools {
namespace {

int RunDoctorCommand(const DoctorOptions& o) {
  std::vector<Finding> findings;
  bool cache_ok = true;
  Status s = RunDoctor(o, &findings, &cache_ok);
  if (!s.ok()) return ReportError("doctor", s);
  int warnings = 0;
  for (const Finding& f : findings) {
    std::cout << FormatFinding(f) << "\n";
    warnings += f.level == FindingLevel::kWarn;
  }
  std::cout << "kiln doctor: " << findings.size() << " checks, " << warnings << " warning"
            << (warnings == 1 ? "" : "s") << "\n";
  return cache_ok ? kExitOk : kExitBadData;
}

KILN_COMMAND(Command{"doctor",
                     "Check this machine (and a cache) for fast training: CPUs, RAM, filesystem, "
                     "GPU, pinned memory, library versions",
                     60, [](CLI::App* sub) -> std::function<int()> {
                       auto o = std::make_shared<DoctorOptions>();
                       sub->add_option("CACHE", o->cache,
                                       "cache to check too: filesystem, size against RAM, "
                                       "verify --level quick");
                       sub->add_option("--cuda-library", o->cuda_library,
                                       "the CUDA driver library to probe (default libcuda.so.1)");
                       sub->add_option("--device", o->device,
                                       "cuda or cuda:N: that GPU is needed; without it, say "
                                       "'no CUDA device: ...' and exit 2 before any other check");
                       AddExamples(sub, {"kiln doctor OUT/train", "kiln doctor",
                                         "kiln doctor --device cuda"});
                       return [o] { return RunDoctorCommand(*o); };
                     }});

}  // namespace
}  // namespace kiln::tools

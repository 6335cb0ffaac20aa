// Subcommands that live in executables of their own beside kiln, so that
// kiln itself never loads LibTorch (about 0.4 s of start-up and 1 GB of
// libraries for every build, verify or inspect).
#include "command.h"

namespace kiln::tools {
namespace {

KILN_COMMAND(Command{"train", "Train a model on a cache (LibTorch; CPU or CUDA; runs kiln-train)", 50,
                     nullptr, "kiln-train", TorchEnvironment()});

}  // namespace
}  // namespace kiln::tools

// `kiln plot`: training curves of a `kiln train --metrics` file. The work is
// a matplotlib script (tools/kiln_plot.py, built as kiln-plot beside kiln),
// so that kiln itself links no plotting library.
#include "command.h"

namespace kiln::tools {
namespace {

KILN_COMMAND(Command{"plot",
                     "Plot loss, accuracy, samples/s and data wait of a kiln train --metrics file "
                     "(runs kiln-plot; needs python3-matplotlib)",
                     60, nullptr, "kiln-plot", {}});

}  // namespace
}  // namespace kiln::tools

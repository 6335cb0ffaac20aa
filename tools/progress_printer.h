// Progress lines of the long-running subcommands (kiln build, kiln verify),
// on stderr so that stdout keeps the command's result:
//   tty    one live line, redrawn at most every 0.2 s
//   plain  a line every 10 s and a last one (logs, CI)
//   json   an object per second and a last one with "final": true
//   none   nothing;  auto: tty on a terminal, plain otherwise
#ifndef KILN_TOOLS_PROGRESS_PRINTER_H_
#define KILN_TOOLS_PROGRESS_PRINTER_H_

#include <functional>
#include <string>

#include "kiln/progress.h"
#include "kiln/status.h"

namespace kiln::tools {

using ProgressPrinter = std::function<void(const std::string& what, const Progress&)>;

// `verb` starts each line ("build", "verify"); `unit` names the items
// ("images", "records"; JSON key "<unit>_per_s"). An empty printer for
// mode none. InvalidArgument for an unknown mode.
Status MakeProgressPrinter(const std::string& verb, const std::string& unit,
                           const std::string& mode, ProgressPrinter* out);

}  // namespace kiln::tools

#endif  // KILN_TOOLS_PROGRESS_PRINTER_H_

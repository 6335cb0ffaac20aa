// How kiln writes file and class names into its text files (sources.tsv,
// rejects.tsv, duplicates.tsv, and the names in manifest.json and
// build.json): any name a filesystem allows can be a record, and every line
// of those files stays one line of UTF-8 text (docs/format.md, "Names").
//
//   \  -> \\      tab -> \t      line feed -> \n      carriage return -> \r
//   another control byte (0x00-0x1f, 0x7f), or a byte that is not part of a
//   valid UTF-8 sequence -> \xNN (two lower-case hex digits)
//
// Every other byte is kept, so an ordinary name is written as it is.
#ifndef KILN_SRC_CORE_ESCAPE_H_
#define KILN_SRC_CORE_ESCAPE_H_

#include <string>

namespace kiln {

std::string EscapeName(const std::string& name);

// The name EscapeName was given. False for text EscapeName cannot have
// written (a lone backslash, an unknown escape, bad hex digits).
bool UnescapeName(const std::string& text, std::string* name);

}  // namespace kiln

#endif  // KILN_SRC_CORE_ESCAPE_H_

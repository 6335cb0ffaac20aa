#include "kiln/cache_layout.h"

#include <cstdio>
#include <cstring>
#include <regex>

namespace kiln {

std::string ShardFileName(int i) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%05d%s", kShardPrefix, i, kShardSuffix);
  return buf;
}

bool IsShardFile(const std::string& name) {
  const size_t plen = std::strlen(kShardPrefix), slen = std::strlen(kShardSuffix);
  return name.size() > plen + slen && name.compare(0, plen, kShardPrefix) == 0 &&
         name.compare(name.size() - slen, slen, kShardSuffix) == 0;
}

std::string PartDirName(int part, int num_parts) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "part-%05d-of-%05d", part, num_parts);
  return buf;
}

bool IsPartDirName(const std::string& name) {
  static const std::regex pattern("part-[0-9]{5}-of-[0-9]{5}");
  return std::regex_match(name, pattern);
}

const std::vector<std::string>& SplitDirs() {
  static const std::vector<std::string> dirs = {"train", "val"};
  return dirs;
}

}  // namespace kiln

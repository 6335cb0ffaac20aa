#include "kiln/cache_layout.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
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

Status ResolveSplitDir(const std::string& path, const std::string& split, std::string* dir) {
  namespace fs = std::filesystem;
  const std::vector<std::string>& splits = SplitDirs();
  if (!split.empty() && std::find(splits.begin(), splits.end(), split) == splits.end())
    return Status::InvalidArgument("--split " + split + ": expected train or val");
  std::error_code ec;
  const bool cache = fs::exists(fs::path(path) / kManifestName, ec) ||
                     fs::exists(fs::path(path) / kBuildStateName, ec) ||
                     !fs::is_directory(path, ec);
  bool has_splits = false;
  for (const std::string& s : splits) has_splits |= fs::is_directory(fs::path(path) / s, ec);
  if (cache || !has_splits) {
    if (!split.empty())
      return Status::InvalidArgument("--split " + split + ": " + path +
                                     " is one cache, not the parent of train/ and val/");
    *dir = path;
    return Status::OK();
  }
  const std::string chosen = split.empty() ? splits.front() : split;
  *dir = (fs::path(path) / chosen).string();
  if (!fs::is_directory(*dir, ec))
    return Status::NotFound(path + " has no " + chosen + " split (no directory " + *dir + ")");
  return Status::OK();
}

}  // namespace kiln

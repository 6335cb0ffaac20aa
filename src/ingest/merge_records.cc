#include "merge_records.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>

#include "core/page_cache.h"
#include "kiln/cache_layout.h"
#include "kiln/cache_reader.h"
#include "kiln/cache_writer.h"
#include "kiln/verify.h"

namespace kiln::ingest {
namespace fs = std::filesystem;

Status LinkOrCopy(const std::string& from, const std::string& to, bool* copied) {
  *copied = false;
  if (::link(from.c_str(), to.c_str()) == 0) return Status::OK();
  if (errno == EEXIST) {
    std::error_code ec;
    if (fs::equivalent(from, to, ec)) return Status::OK();  // a merge run before got this far
    fs::remove(to, ec);
    if (::link(from.c_str(), to.c_str()) == 0) return Status::OK();
  }
  if (errno == EXDEV || errno == EPERM || errno == EMLINK) {
    std::error_code ec;
    fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
    if (ec) return Status::IOError(to + ": cannot copy from " + from + ": " + ec.message());
    *copied = true;
    return Status::OK();
  }
  return Status::IOError(to + ": cannot link " + from + ": " + std::strerror(errno));
}

Status CheckInputQuick(const std::string& dir, const std::string& todo) {
  VerifyOptions vo;
  vo.level = VerifyLevel::kQuick;
  VerifyReport r;
  KILN_RETURN_IF_ERROR(VerifyCache(dir, vo, &r));
  if (!r.clean())
    return Status::Corruption(dir + ": kiln verify --level quick finds " +
                              std::to_string(r.problems.size()) +
                              " problem(s), first: " + r.problems[0].what + "; " + todo);
  return Status::OK();
}

void WidenMaxDims(const Manifest& m, Manifest* merged) {
  for (size_t f = 0; f < merged->fields.size() && f < m.fields.size(); ++f)
    for (int i = 0; i < kMaxDims; ++i)
      merged->fields[f].max_dims[i] = std::max(merged->fields[f].max_dims[i], m.fields[f].max_dims[i]);
}

Status LinkShards(const std::string& dir, const std::vector<ShardInfo>& shards,
                  const std::string& out, Manifest* merged, bool* copied) {
  for (ShardInfo s : shards) {
    const std::string name = ShardFileName(static_cast<int>(merged->shards.size()));
    bool this_copied = false;
    KILN_RETURN_IF_ERROR(LinkOrCopy(dir + "/" + s.file, out + "/" + name, &this_copied));
    *copied = *copied || this_copied;
    s.file = name;
    merged->shards.push_back(s);
  }
  return Status::OK();
}

Status RemoveUnlistedShards(const std::string& out, const Manifest& merged) {
  std::set<std::string> listed;
  for (const ShardInfo& s : merged.shards) listed.insert(s.file);
  std::error_code ec;
  std::vector<fs::path> stray;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    std::string name = e.path().filename().string();
    const std::string lock = kLmdbLockSuffix;
    if (name.size() > lock.size() && name.compare(name.size() - lock.size(), lock.size(), lock) == 0)
      name.resize(name.size() - lock.size());
    if (IsShardFile(name) && !listed.count(name)) stray.push_back(e.path());
  }
  if (ec) return Status::IOError(out + ": cannot list: " + ec.message());
  for (const fs::path& p : stray)
    if (!fs::remove(p, ec) && ec)
      return Status::IOError(p.string() + ": cannot remove a shard file the merge does not "
                             "list (" + ec.message() + "); remove it, then merge again");
  return Status::OK();
}

Status RewriteRecords(const std::string& dir, const Manifest& m, uint64_t first,
                      const std::string& tmp, std::vector<ShardInfo>* shards) {
  std::error_code ec;
  fs::remove_all(tmp, ec);
  std::unique_ptr<CacheReader> reader;
  ReaderOptions ro;
  ro.allow_part = true;
  KILN_RETURN_IF_ERROR(CacheReader::Open(dir, ro, &reader));
  WriterOptions wo;
  wo.dtype = m.dtype;
  wo.shape = m.shape;
  wo.first_index = first;
  const bool v2 = m.format_version == kFormatVersion2;
  if (v2) {
    wo.fields = m.fields;
    if (m.label_field >= 0) wo.label_field = m.fields[m.label_field].name;
    wo.commit_bytes = m.commit_bytes;
    wo.pack_bytes = m.pack_bytes;
  }
  uint64_t bytes = 0;
  for (const ShardInfo& s : m.shards) bytes = std::max(bytes, s.bytes);
  wo.shard_size = std::max<uint64_t>(bytes, 1);
  std::unique_ptr<CacheWriter> writer;
  KILN_RETURN_IF_ERROR(CacheWriter::Open(wo, tmp, &writer));
  auto txn = reader->BeginRead();
  // Index order is file order: the bytes past each record are asked of the
  // disk ahead of the copy, so a cold cache is read sequentially (only the
  // first record is read a page per fault).
  SequentialReadAhead ahead;
  MappedFileEnds ends(*reader);
  for (uint64_t i = 0; i < m.count; ++i) {
    const uint64_t index = m.first_index + i;
    RecordView v;
    KILN_RETURN_IF_ERROR(txn->Get(index, &v, /*verify_checksum=*/true));
    ahead.Reached(v.data, ends.Of(v.data));
    if (v2) {
      FieldData fields[kMaxFields];
      for (int f = 0; f < v.num_fields; ++f)
        fields[f] = {v.fields[f].dtype, v.fields[f].shape, v.fields[f].data, v.fields[f].codec,
                     v.fields[f].codec == Codec::kRaw ? 0 : v.fields[f].bytes};
      KILN_RETURN_IF_ERROR(writer->AppendFields(first + i, fields, v.num_fields));
    } else {
      KILN_RETURN_IF_ERROR(writer->Append(first + i, v.label, v.data));
    }
    txn->Reset();
  }
  Manifest written = m;
  written.first_index = first;
  KILN_RETURN_IF_ERROR(writer->Finish(&written));
  *shards = written.shards;
  return Status::OK();
}

}  // namespace kiln::ingest

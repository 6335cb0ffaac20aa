// Packs of records in one LMDB value (kiln/record.h, format.md "Packs").
#include <cstring>

#include "kiln/record.h"

namespace kiln {

namespace {
uint32_t U32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian hosts only (as the rest of kiln)
  return v;
}
uint64_t U64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
size_t Align16(size_t n) { return (n + 15) & ~size_t{15}; }
}  // namespace

bool IsPack(const uint8_t* value, size_t size) {
  return size >= kPackHeaderSize && U32(value) == kPackMagic;
}

uint32_t PackCount(const uint8_t* value) { return U32(value + 4); }

Status PackEntry(const uint8_t* value, size_t size, uint64_t key, uint32_t j,
                 const uint8_t** record, size_t* record_size) {
  auto damaged = [key](const std::string& what) {
    return Status::Corruption("the pack of records under key " + std::to_string(key) +
                              " is damaged: " + what);
  };
  if (!IsPack(value, size)) return damaged("no pack magic");
  const uint64_t n = PackCount(value);
  if (n == 0 || n > (size - kPackHeaderSize) / kPackEntrySize)
    return damaged("a count of " + std::to_string(n) + " records in " + std::to_string(size) +
                   " bytes");
  if (j >= n)
    return Status::NotFound("record " + std::to_string(j) + " of the pack under key " +
                            std::to_string(key) + ", which holds " + std::to_string(n));
  const uint8_t* e = value + kPackHeaderSize + kPackEntrySize * j;
  const uint64_t offset = U64(e), length = U64(e + 8);
  // The first record starts after the table, each later one at the first
  // multiple of 16 after the one before (the layout leaves no choice), and
  // the last ends the value: every record inside the value, none overlapping.
  const uint64_t lowest =
      j == 0 ? Align16(kPackHeaderSize + kPackEntrySize * n)
             : Align16(U64(e - kPackEntrySize) + U64(e - kPackEntrySize + 8));
  if (offset != lowest || offset > size || length > size - offset ||
      (j + 1 == n && offset + length != size))
    return damaged("record " + std::to_string(j) + " at " + std::to_string(offset) + ", " +
                   std::to_string(length) + " bytes, in a value of " + std::to_string(size));
  *record = value + offset;
  *record_size = static_cast<size_t>(length);
  return Status::OK();
}

void EncodePack(const uint8_t* const* values, const size_t* sizes, size_t n,
                std::vector<uint8_t>* out) {
  size_t at = Align16(kPackHeaderSize + kPackEntrySize * n);
  size_t total = at;
  for (size_t i = 0; i < n; ++i) total = Align16(total) + sizes[i];
  out->assign(total, 0);
  uint8_t* p = out->data();
  const uint32_t magic = kPackMagic, count = static_cast<uint32_t>(n);
  std::memcpy(p, &magic, 4);
  std::memcpy(p + 4, &count, 4);
  for (size_t i = 0; i < n; ++i) {
    at = Align16(at);
    const uint64_t offset = at, length = sizes[i];
    std::memcpy(p + kPackHeaderSize + kPackEntrySize * i, &offset, 8);
    std::memcpy(p + kPackHeaderSize + kPackEntrySize * i + 8, &length, 8);
    std::memcpy(p + at, values[i], sizes[i]);
    at += sizes[i];
  }
}

}  // namespace kiln

// libFuzzer target: a stored record, as LMDB hands it to the reader.
// Input: the 8-byte big-endian key, then the value (header and payload).
// DecodeRecordHeader must never read past the value, and what it accepts
// must be consistent: version 1, the payload fills the value exactly and
// matches the shape; version 2, every field's payload lies inside the value
// where the table says, in order, and the last ends at the value's end.
// VerifyRecordChecksum then reads exactly the value. A pack of records is
// taken apart (PackEntry) and each of its records checked so.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_check.h"
#include "kiln/cache_reader.h"
#include "kiln/record.h"

namespace {

int CheckValue(uint64_t index, const std::vector<uint8_t>& value);

// A pack (kiln/record.h): each record PackEntry accepts lies inside the
// value, 16-aligned, after the one before, the last ending the value; each
// is then checked as a value of its own.
void CheckPack(uint64_t key, const std::vector<uint8_t>& value) {
  const uint32_t n = kiln::PackCount(value.data());
  uint64_t end = 0;
  for (uint32_t j = 0; j < n && j < 4096; ++j) {
    const uint8_t* rec = nullptr;
    size_t len = 0;
    const kiln::Status s = kiln::PackEntry(value.data(), value.size(), key, j, &rec, &len);
    if (!s.ok()) {
      KILN_FUZZ_CHECK(s.IsCorruption());
      return;
    }
    const uint64_t at = static_cast<uint64_t>(rec - value.data());
    KILN_FUZZ_CHECK(at % 16 == 0 && at >= end && at >= kiln::kPackHeaderSize + 16 * uint64_t{n});
    KILN_FUZZ_CHECK(at + len <= value.size());
    KILN_FUZZ_CHECK(j + 1 < n || at + len == value.size());
    end = at + len;
    CheckValue(key + j, std::vector<uint8_t>(rec, rec + len));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kiln::kKeySize) return 0;
  const uint64_t index = kiln::DecodeKey(data);
  // The value in a buffer of its own, exactly its size, so that a read past
  // its end is one past a heap block (AddressSanitizer sees it).
  const std::vector<uint8_t> value(data + kiln::kKeySize, data + size);
  if (kiln::IsPack(value.data(), value.size())) {
    CheckPack(index, value);
    return 0;
  }
  return CheckValue(index, value);
}

namespace {

int CheckValue(uint64_t index, const std::vector<uint8_t>& value) {
  kiln::RecordHeader h;
  if (!kiln::DecodeRecordHeader(index, value.data(), value.size(), &h).ok()) return 0;
  if (h.version == kiln::kRecordVersion2) {
    KILN_FUZZ_CHECK(h.num_fields >= 1 && h.num_fields <= kiln::kMaxFields);
    KILN_FUZZ_CHECK(h.value_bytes == value.size());
    uint64_t end = kiln::RecordV2TableEnd(h.num_fields);
    std::vector<kiln::FieldData> fields;
    for (int f = 0; f < h.num_fields; ++f) {
      const kiln::FieldEntry& e = h.fields[f];
      KILN_FUZZ_CHECK(e.offset >= end && e.offset % kiln::kFieldAlign == 0);
      if (e.codec == kiln::Codec::kRaw)
        KILN_FUZZ_CHECK(e.bytes == kiln::FieldElements(e.shape) * kiln::DTypeSize(e.dtype));
      else
        KILN_FUZZ_CHECK(kiln::CheckEncodedField(e.codec, e.dtype, e.shape, e.bytes).ok());
      KILN_FUZZ_CHECK(e.offset + e.bytes <= value.size());
      end = e.offset + e.bytes;
      fields.push_back({e.dtype, e.shape, value.data() + e.offset, e.codec,
                        e.codec == kiln::Codec::kRaw ? 0 : e.bytes});
      // An encoded payload decodes or is a named Corruption (small images
      // only: the fuzzer's claimed sizes are not allocated beyond that).
      if (e.codec != kiln::Codec::kRaw && e.shape.dims[1] <= 512 && e.shape.dims[2] <= 512) {
        std::vector<uint8_t> pixels;
        const kiln::Status s = kiln::DecodeField(
            {value.data() + e.offset, e.bytes, e.dtype, e.shape, e.codec}, "fuzz", &pixels);
        KILN_FUZZ_CHECK(s.ok() ? pixels.size() == e.shape.NumElements() : s.IsCorruption());
      }
    }
    KILN_FUZZ_CHECK(end == value.size());
    if (kiln::VerifyRecordChecksum(index, value.data(), h).ok()) {
      // An intact record is what EncodeRecordV2 writes for its fields.
      std::vector<uint8_t> again(value.size());
      kiln::EncodeRecordV2(index, fields.data(), h.num_fields, again.data());
      KILN_FUZZ_CHECK(again == value);
    }
    return 0;
  }
  KILN_FUZZ_CHECK(h.shape.ndim >= 1 && h.shape.ndim <= kiln::kMaxDims);
  KILN_FUZZ_CHECK(h.shape.NumElements() <= kiln::kMaxRecordElements);
  KILN_FUZZ_CHECK(h.payload_bytes == h.shape.NumElements() * kiln::DTypeSize(h.dtype));
  KILN_FUZZ_CHECK(h.payload_bytes + kiln::kRecordHeaderSize == value.size());
  const bool intact = kiln::VerifyRecordChecksum(index, value.data(), h).ok();
  if (intact) {
    // An intact record is what EncodeRecordHeader writes for its fields.
    std::vector<uint8_t> again(kiln::kRecordHeaderSize);
    kiln::EncodeRecordHeader(index, h.dtype, h.shape, h.label,
                             value.data() + kiln::kRecordHeaderSize, again.data());
    KILN_FUZZ_CHECK(std::equal(again.begin(), again.end(), value.begin()));
  }
  return 0;
}

}  // namespace

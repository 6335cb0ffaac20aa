// libFuzzer target: a stored record, as LMDB hands it to the reader.
// Input: the 8-byte big-endian key, then the value (header and payload).
// DecodeRecordHeader must never read past the value, and what it accepts
// must be consistent: the payload fills the value exactly and matches the
// shape; VerifyRecordChecksum then reads exactly that payload.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_check.h"
#include "kiln/record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kiln::kKeySize) return 0;
  const uint64_t index = kiln::DecodeKey(data);
  // The value in a buffer of its own, exactly its size, so that a read past
  // its end is one past a heap block (AddressSanitizer sees it).
  const std::vector<uint8_t> value(data + kiln::kKeySize, data + size);
  kiln::RecordHeader h;
  if (!kiln::DecodeRecordHeader(index, value.data(), value.size(), &h).ok()) return 0;
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

#include "kiln/record.h"

#include <xxhash.h>

#include <cstring>

namespace kiln {

namespace {
void PutU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::string RecordName(uint64_t index) { return "record " + std::to_string(index); }
}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUint8: return 1;
    case DType::kFloat16: return 2;
    case DType::kFloat32: return 4;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUint8: return "uint8";
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
  }
  return "unknown";
}

bool IsValidDType(uint8_t code) { return code >= 1 && code <= 3; }

Status ParseDType(const std::string& name, DType* out) {
  for (DType d : {DType::kUint8, DType::kFloat16, DType::kFloat32}) {
    if (name == DTypeName(d)) {
      *out = d;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown dtype '" + name +
                                 "' (expected uint8, float16 or float32)");
}

uint64_t Shape::NumElements() const {
  uint64_t n = ndim > 0 ? 1 : 0;
  for (int i = 0; i < ndim; ++i) n *= dims[i];
  return n;
}

std::string Shape::ToString() const {
  std::string s;
  for (int i = 0; i < ndim; ++i) {
    if (i) s += "x";
    s += std::to_string(dims[i]);
  }
  return s.empty() ? "()" : s;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (dims[i] != o.dims[i]) return false;
  return true;
}

void EncodeKey(uint64_t index, uint8_t* key) {
  for (int i = 0; i < 8; ++i) key[i] = static_cast<uint8_t>(index >> (8 * (7 - i)));
}

uint64_t DecodeKey(const uint8_t* key) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | key[i];
  return v;
}

uint64_t RecordChecksum(uint64_t index, const uint8_t* header, const void* payload,
                        size_t payload_bytes) {
  XXH3_state_t state;
  // A stack state must be initialized before reset (xxhash.h: XXH3_INITSTATE).
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset_withSeed(&state, index);
  XXH3_64bits_update(&state, header, kChecksumOffset);
  XXH3_64bits_update(&state, payload, payload_bytes);
  return XXH3_64bits_digest(&state);
}

void EncodeRecordHeader(uint64_t index, DType dtype, const Shape& shape, int64_t label,
                        const void* payload, uint8_t* h) {
  std::memset(h, 0, kRecordHeaderSize);
  PutU32(h + 0, kRecordMagic);
  PutU16(h + 4, kRecordVersion);
  h[6] = static_cast<uint8_t>(dtype);
  h[7] = static_cast<uint8_t>(shape.ndim);
  for (int i = 0; i < kMaxDims; ++i) PutU32(h + 8 + 4 * i, i < shape.ndim ? shape.dims[i] : 0);
  PutU64(h + 24, static_cast<uint64_t>(label));
  const uint64_t bytes = shape.NumElements() * DTypeSize(dtype);
  PutU64(h + 32, bytes);
  PutU64(h + 40, RecordChecksum(index, h, payload, bytes));
}

Status DecodeRecordHeader(uint64_t index, const uint8_t* v, size_t size, RecordHeader* out) {
  if (size < kRecordHeaderSize)
    return Status::Corruption(RecordName(index) + ": value of " + std::to_string(size) +
                              " bytes is shorter than the " +
                              std::to_string(kRecordHeaderSize) + "-byte header");
  if (GetU32(v) != kRecordMagic)
    return Status::Corruption(RecordName(index) + ": bad magic (not a kiln record)");
  const uint16_t version = GetU16(v + 4);
  if (version != kRecordVersion)
    return Status::Corruption(RecordName(index) + ": record version " + std::to_string(version) +
                              ", this kiln reads version " + std::to_string(kRecordVersion));
  if (!IsValidDType(v[6]))
    return Status::Corruption(RecordName(index) + ": unknown dtype code " + std::to_string(v[6]));
  out->dtype = static_cast<DType>(v[6]);
  const int ndim = v[7];
  if (ndim < 1 || ndim > kMaxDims)
    return Status::Corruption(RecordName(index) + ": ndim " + std::to_string(ndim) +
                              " outside 1.." + std::to_string(kMaxDims));
  out->shape.ndim = ndim;
  // elements <= kMaxRecordElements before each step, so the bound is
  // checked by a division before multiplying: no overflow.
  uint64_t elements = 1;
  for (int i = 0; i < kMaxDims; ++i) {
    const uint32_t d = GetU32(v + 8 + 4 * i);
    if (i < ndim) {
      if (d == 0) return Status::Corruption(RecordName(index) + ": zero-sized dimension");
      if (elements > kMaxRecordElements / d)
        return Status::Corruption(RecordName(index) + ": shape too large");
      elements *= d;
      out->shape.dims[i] = d;
    } else {
      if (d != 0) return Status::Corruption(RecordName(index) + ": nonzero dim past ndim");
      out->shape.dims[i] = 0;
    }
  }
  out->label = static_cast<int64_t>(GetU64(v + 24));
  out->payload_bytes = GetU64(v + 32);
  out->checksum = GetU64(v + 40);
  for (size_t i = 48; i < kRecordHeaderSize; ++i)
    if (v[i] != 0) return Status::Corruption(RecordName(index) + ": reserved header bytes not zero");
  if (out->payload_bytes != elements * DTypeSize(out->dtype))
    return Status::Corruption(RecordName(index) + ": payload length " +
                              std::to_string(out->payload_bytes) + " does not match shape " +
                              out->shape.ToString() + " x " + DTypeName(out->dtype));
  if (out->payload_bytes != size - kRecordHeaderSize)
    return Status::Corruption(RecordName(index) + ": value holds " +
                              std::to_string(size - kRecordHeaderSize) +
                              " payload bytes, header says " + std::to_string(out->payload_bytes));
  return Status::OK();
}

Status VerifyRecordChecksum(uint64_t index, const uint8_t* v, const RecordHeader& h) {
  return VerifyRecordChecksum(index, v, v + kRecordHeaderSize, h);
}

Status VerifyRecordChecksum(uint64_t index, const uint8_t* header, const void* payload,
                            const RecordHeader& h) {
  const uint64_t got = RecordChecksum(index, header, payload, h.payload_bytes);
  if (got != h.checksum)
    return Status::Corruption(RecordName(index) + ": checksum mismatch (payload or header damaged, "
                              "or the record is stored under the wrong index)");
  return Status::OK();
}

}  // namespace kiln

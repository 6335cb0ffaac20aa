#include "kiln/record.h"

#include <xxhash.h>
// Debian's libxxhash also exports XXH3 functions that pick SSE2, AVX2 or
// AVX-512 at run time (*_dispatch); this header renames the calls below to
// them. XXH3 is defined by its scalar code: every path gives the same hash.
// Plain XXH3 runs SSE2 only, and the checksum is most of verify's work.
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

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
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUint8: return "uint8";
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

bool IsValidDType(uint8_t code) { return code >= 1 && code <= 5; }

const char* CodecName(Codec codec) {
  switch (codec) {
    case Codec::kRaw:
      return "raw";
    case Codec::kJpeg:
      return "jpeg";
  }
  return "unknown";
}

uint64_t FieldPayloadBytes(const FieldData& f) {
  return f.codec == Codec::kRaw ? FieldElements(f.shape) * DTypeSize(f.dtype) : f.encoded_bytes;
}

Status CheckEncodedField(Codec codec, DType dtype, const Shape& shape, uint64_t encoded_bytes) {
  if (codec == Codec::kRaw) return Status::OK();
  if (codec != Codec::kJpeg)
    return Status::InvalidArgument("unknown codec code " +
                                   std::to_string(static_cast<int>(codec)));
  if (dtype != DType::kUint8)
    return Status::InvalidArgument(std::string("a JPEG field is uint8, not ") + DTypeName(dtype));
  if (shape.ndim != 3 || (shape.dims[0] != 1 && shape.dims[0] != 3) || shape.dims[1] < 1 ||
      shape.dims[2] < 1)
    return Status::InvalidArgument("a JPEG field is 1 or 3 x H x W, not " + shape.ToString());
  if (encoded_bytes < 1 || encoded_bytes > 0xffffffffu)
    return Status::InvalidArgument("a JPEG of " + std::to_string(encoded_bytes) +
                                   " bytes (1 byte to 4 GiB)");
  return Status::OK();
}

bool IsPixelDType(DType d) {
  return d == DType::kUint8 || d == DType::kFloat16 || d == DType::kFloat32;
}

Status ParseDType(const std::string& name, DType* out) {
  for (DType d : {DType::kUint8, DType::kFloat16, DType::kFloat32, DType::kInt32, DType::kInt64}) {
    if (name == DTypeName(d)) {
      *out = d;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown dtype '" + name +
                                 "' (expected uint8, float16, float32, int32 or int64)");
}

uint64_t FieldElements(const Shape& s) {
  uint64_t n = 1;
  for (int i = 0; i < s.ndim; ++i) n *= s.dims[i];
  return n;
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

size_t RecordV2TableEnd(int n) { return kRecordV2HeaderSize + kFieldEntrySize * n; }

namespace {
uint64_t AlignField(uint64_t offset) {
  return (offset + kFieldAlign - 1) / kFieldAlign * kFieldAlign;
}

// Version 2's part of DecodeRecordHeader (magic and version checked).
Status DecodeRecordV2(uint64_t index, const uint8_t* v, size_t size, RecordHeader* out) {
  // Messages are built only on failure: decoding allocates nothing.
  auto name = [index] { return RecordName(index); };
  if (size < kRecordV2HeaderSize)
    return Status::Corruption(name() + ": value of " + std::to_string(size) +
                              " bytes is shorter than the version 2 header");
  const int n = GetU16(v + 6);
  if (n < 1 || n > kMaxFields)
    return Status::Corruption(name() + ": " + std::to_string(n) + " fields, outside 1.." +
                              std::to_string(kMaxFields));
  out->version = kRecordVersion2;
  out->checksum = GetU64(v + 8);
  out->value_bytes = GetU64(v + 16);
  if (out->value_bytes != size)
    return Status::Corruption(name() + ": value holds " + std::to_string(size) +
                              " bytes, its header says " + std::to_string(out->value_bytes));
  if (GetU64(v + 24) != 0) return Status::Corruption(name() + ": reserved header bytes not zero");
  if (size < RecordV2TableEnd(n))
    return Status::Corruption(name() + ": value of " + std::to_string(size) +
                              " bytes ends inside its table of " + std::to_string(n) + " fields");
  uint64_t end = RecordV2TableEnd(n);  // where the previous field ended
  for (int f = 0; f < n; ++f) {
    const uint8_t* e = v + kRecordV2HeaderSize + kFieldEntrySize * f;
    auto field = [index, f] { return RecordName(index) + ", field " + std::to_string(f); };
    if (!IsValidDType(e[0]))
      return Status::Corruption(field() + ": unknown dtype code " + std::to_string(e[0]));
    FieldEntry& fe = out->fields[f];
    fe.dtype = static_cast<DType>(e[0]);
    const int ndim = e[1];
    if (ndim > kMaxDims)
      return Status::Corruption(field() + ": ndim " + std::to_string(ndim) + " above " +
                                std::to_string(kMaxDims));
    if (e[3] != 0) return Status::Corruption(field() + ": reserved entry bytes not zero");
    if (e[2] > static_cast<uint8_t>(Codec::kJpeg))
      return Status::Corruption(field() + ": unknown codec code " + std::to_string(e[2]) +
                                " (written by a newer kiln?)");
    fe.codec = static_cast<Codec>(e[2]);
    const uint32_t encoded = GetU32(e + 4);
    if (fe.codec == Codec::kRaw && encoded != 0)
      return Status::Corruption(field() + ": reserved entry bytes not zero");
    fe.shape.ndim = ndim;
    uint64_t elements = 1;
    for (int i = 0; i < kMaxDims; ++i) {
      const uint32_t d = GetU32(e + 8 + 4 * i);
      if (i < ndim) {
        // A field may be empty (no boxes in this image): a dim of 0.
        if (d > 0 && elements > kMaxRecordElements / d)
          return Status::Corruption(field() + ": shape too large");
        elements *= d;
      } else if (d != 0) {
        return Status::Corruption(field() + ": nonzero dim past ndim");
      }
      fe.shape.dims[i] = i < ndim ? d : 0;
    }
    if (fe.codec != Codec::kRaw) {
      const Status s = CheckEncodedField(fe.codec, fe.dtype, fe.shape, encoded);
      if (!s.ok()) return Status::Corruption(field() + ": " + s.message());
    }
    fe.bytes = fe.codec == Codec::kRaw ? elements * DTypeSize(fe.dtype) : encoded;
    fe.offset = GetU64(e + 24);
    if (fe.offset != AlignField(end))
      return Status::Corruption(field() + ": payload offset " + std::to_string(fe.offset) +
                                ", expected " + std::to_string(AlignField(end)) +
                                " (the field table is damaged)");
    // end <= size here, and fe.bytes < 2^43: no overflow.
    if (fe.offset > size || fe.bytes > size - fe.offset)
      return Status::Corruption(field() + ": payload of " + std::to_string(fe.bytes) +
                                " bytes at offset " + std::to_string(fe.offset) +
                                " runs past the value's " + std::to_string(size) + " bytes");
    end = fe.offset + fe.bytes;
  }
  if (end != size)
    return Status::Corruption(name() + ": value holds " + std::to_string(size) +
                              " bytes, its fields end at " + std::to_string(end));
  out->num_fields = n;
  out->dtype = out->fields[0].dtype;
  out->shape = out->fields[0].shape;
  out->payload_bytes = out->fields[0].bytes;
  out->label = -1;
  return Status::OK();
}
}  // namespace

uint64_t RecordV2Size(const FieldData* fields, int n) {
  uint64_t end = RecordV2TableEnd(n);
  for (int f = 0; f < n; ++f)
    end = AlignField(end) + FieldPayloadBytes(fields[f]);
  return end;
}

void EncodeRecordV2(uint64_t index, const FieldData* fields, int n, uint8_t* v) {
  std::memset(v, 0, RecordV2TableEnd(n));
  PutU32(v, kRecordMagic);
  PutU16(v + 4, kRecordVersion2);
  PutU16(v + 6, static_cast<uint16_t>(n));
  uint64_t end = RecordV2TableEnd(n);
  for (int f = 0; f < n; ++f) {
    uint8_t* e = v + kRecordV2HeaderSize + kFieldEntrySize * f;
    const FieldData& fd = fields[f];
    e[0] = static_cast<uint8_t>(fd.dtype);
    e[1] = static_cast<uint8_t>(fd.shape.ndim);
    e[2] = static_cast<uint8_t>(fd.codec);
    if (fd.codec != Codec::kRaw) PutU32(e + 4, static_cast<uint32_t>(fd.encoded_bytes));
    for (int i = 0; i < kMaxDims; ++i)
      PutU32(e + 8 + 4 * i, i < fd.shape.ndim ? fd.shape.dims[i] : 0);
    const uint64_t offset = AlignField(end);
    PutU64(e + 24, offset);
    std::memset(v + end, 0, offset - end);
    const uint64_t bytes = FieldPayloadBytes(fd);
    if (bytes > 0) std::memcpy(v + offset, fd.data, bytes);
    end = offset + bytes;
  }
  PutU64(v + 16, end);
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset_withSeed(&state, index);
  XXH3_64bits_update(&state, v, kChecksumOffsetV2);
  XXH3_64bits_update(&state, v + 16, end - 16);
  PutU64(v + kChecksumOffsetV2, XXH3_64bits_digest(&state));
}

size_t StoredChecksumOffset(const uint8_t* v, size_t size) {
  if (size >= kRecordV2HeaderSize && GetU16(v + 4) == kRecordVersion2) return kChecksumOffsetV2;
  return kChecksumOffset;
}

Status DecodeRecordHeader(uint64_t index, const uint8_t* v, size_t size, RecordHeader* out) {
  if (size >= 6 && GetU32(v) == kRecordMagic && GetU16(v + 4) == kRecordVersion2)
    return DecodeRecordV2(index, v, size, out);
  if (size < kRecordHeaderSize)
    return Status::Corruption(RecordName(index) + ": value of " + std::to_string(size) +
                              " bytes is shorter than the " +
                              std::to_string(kRecordHeaderSize) + "-byte header");
  if (GetU32(v) != kRecordMagic)
    return Status::Corruption(RecordName(index) + (IsPack(v, size)
                                                       ? ": a pack of records whose table is "
                                                         "damaged (format.md, Packs)"
                                                       : ": bad magic (not a kiln record)"));
  const uint16_t version = GetU16(v + 4);
  if (version != kRecordVersion)
    return Status::Corruption(RecordName(index) + ": record version " + std::to_string(version) +
                              ", this kiln reads versions " + std::to_string(kRecordVersion) +
                              " and " + std::to_string(kRecordVersion2));
  if (!IsValidDType(v[6]) || !IsPixelDType(static_cast<DType>(v[6])))
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
  out->version = kRecordVersion;
  out->value_bytes = size;
  out->num_fields = 2;
  out->fields[0] = {out->dtype, out->shape, kRecordHeaderSize, out->payload_bytes};
  out->fields[1] = {DType::kInt64, Shape{}, 24, 8};
  return Status::OK();
}

Status VerifyRecordChecksum(uint64_t index, const uint8_t* v, const RecordHeader& h) {
  if (h.version == kRecordVersion2)
    return VerifyRecordChecksum(index, v, nullptr, h, h.value_bytes, 0, nullptr);
  return VerifyRecordChecksum(index, v, v + kRecordHeaderSize, h);
}

Status VerifyRecordChecksum(uint64_t index, const uint8_t* header, const void* payload,
                            const RecordHeader& h, size_t split, size_t payload_len,
                            const uint8_t* tail) {
  uint64_t got = 0;
  if (h.version == kRecordVersion2) {
    // The header's 32 bytes lie in `header`: every reader keeps at least
    // the header and table there.
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset_withSeed(&state, index);
    XXH3_64bits_update(&state, header, kChecksumOffsetV2);
    XXH3_64bits_update(&state, header + 16, split - 16);
    if (payload_len > 0) XXH3_64bits_update(&state, payload, payload_len);
    const uint64_t rest = h.value_bytes - split - payload_len;
    if (rest > 0) XXH3_64bits_update(&state, tail, rest);
    got = XXH3_64bits_digest(&state);
  } else {
    got = RecordChecksum(index, header, payload, h.payload_bytes);
  }
  if (got != h.checksum)
    return Status::Corruption(RecordName(index) + ": checksum mismatch (payload or header damaged, "
                              "or the record is stored under the wrong index)");
  return Status::OK();
}

Status NameLinkedRecord(const Status& s, uint64_t index, uint64_t key) {
  if (s.ok() || key == index) return s;
  std::string what = s.message();
  const std::string named = RecordName(key) + ": ";
  if (what.rfind(named, 0) == 0) what.erase(0, named.size());
  return Status::Corruption(RecordName(index) + " (key " + std::to_string(key) +
                            " of a shard linked by kiln merge --from): " + what);
}

}  // namespace kiln

// The on-disk record format of a kiln cache: every constant lives here.
//
// A cache is a directory holding `manifest.json` and one or more shards; each
// shard is one LMDB environment stored as a single file (MDB_NOSUBDIR) with
// one unnamed database. docs/format.md gives the same layout in prose, for
// readers in other languages.
//
// Key:   the sample's global index, 8 bytes, big-endian (byte order equals
//        numeric order, so a writer can append with MDB_APPEND).
// Value: a 64-byte little-endian header followed by the tensor payload.
//
//   offset size field
//        0    4 magic          'K','L','N','R' (0x524E4C4B as little-endian u32)
//        4    2 version        kRecordVersion
//        6    1 dtype          DType code (see below)
//        7    1 ndim           1..kMaxDims
//        8   16 shape[4]       u32 each; entries past ndim are 0
//       24    8 label          i64; -1 means "no label"
//       32    8 payload_bytes  u64; equals prod(shape) * DTypeSize(dtype)
//       40    8 checksum       u64 XXH3-64, seed = the record's index, over
//                              header bytes [0,40) then the payload
//       48   16 reserved       must be zero
//       64    -  payload       C-contiguous (row-major) tensor, CHW for images
//
// The checksum is seeded with the index, so a record moved or copied to
// another key fails; it covers the header, so a flipped label fails too.
// LMDB stores values larger than a page in contiguous overflow pages whose
// data begins 16 bytes into a page, so the payload starts 16-byte aligned.
#ifndef KILN_RECORD_H_
#define KILN_RECORD_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/status.h"

namespace kiln {

inline constexpr uint32_t kRecordMagic = 0x524E4C4Bu;  // "KLNR" on disk
inline constexpr uint16_t kRecordVersion = 1;
inline constexpr size_t kRecordHeaderSize = 64;
inline constexpr size_t kChecksumOffset = 40;  // header bytes hashed: [0, 40)
inline constexpr size_t kKeySize = 8;
inline constexpr int kMaxDims = 4;
// The most elements one record may hold (2^40: a terabyte of uint8). Shapes
// in headers and in the manifest beyond it are Corruption: the bound keeps
// prod(shape) x DTypeSize from overflowing 64 bits, and a hostile shape
// from asking for an absurd buffer.
inline constexpr uint64_t kMaxRecordElements = uint64_t{1} << 40;
// Manifest format version; bumped on any incompatible change of this file.
inline constexpr int kFormatVersion = 1;
// The names of the files in a cache directory: kiln/cache_layout.h.

enum class DType : uint8_t { kUint8 = 1, kFloat16 = 2, kFloat32 = 3 };

// Size of one element in bytes; 0 for an unknown code.
size_t DTypeSize(DType dtype);
// "uint8", "float16", "float32".
const char* DTypeName(DType dtype);
// Parses a name written by DTypeName. Returns InvalidArgument otherwise.
Status ParseDType(const std::string& name, DType* out);
bool IsValidDType(uint8_t code);

// A tensor shape of 1..kMaxDims dimensions.
struct Shape {
  int ndim = 0;
  std::array<uint32_t, kMaxDims> dims{};
  uint64_t NumElements() const;
  std::string ToString() const;  // "3x224x224"
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
};

// The decoded header of one record.
struct RecordHeader {
  DType dtype = DType::kUint8;
  Shape shape;
  int64_t label = -1;
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;
};

// Writes the big-endian key of `index` into `key` (kKeySize bytes).
void EncodeKey(uint64_t index, uint8_t* key);
// REQUIRES: `key` holds kKeySize bytes.
uint64_t DecodeKey(const uint8_t* key);

// The checksum of a record: XXH3-64 seeded with `index` over the first
// kChecksumOffset header bytes and then the payload.
uint64_t RecordChecksum(uint64_t index, const uint8_t* header, const void* payload,
                        size_t payload_bytes);

// Fills `header` (kRecordHeaderSize bytes) for a record, computing its
// checksum over `payload`. REQUIRES: payload_bytes == shape x dtype size.
void EncodeRecordHeader(uint64_t index, DType dtype, const Shape& shape, int64_t label,
                        const void* payload, uint8_t* header);

// Parses and bounds-checks a stored value of `value_size` bytes (header and
// payload) without looking at the payload: magic, version, dtype, ndim,
// shape, reserved bytes, payload length against shape x dtype and against
// value_size. Never reads past `value_size`. Returns Corruption naming
// `index` and the first bad field. Does not verify the checksum.
Status DecodeRecordHeader(uint64_t index, const uint8_t* value, size_t value_size,
                          RecordHeader* out);

// Recomputes the checksum of a stored value already checked by
// DecodeRecordHeader. Returns Corruption naming `index` on mismatch.
Status VerifyRecordChecksum(uint64_t index, const uint8_t* value, const RecordHeader& h);
// The same for a value whose header and payload lie apart (read into two
// buffers).
Status VerifyRecordChecksum(uint64_t index, const uint8_t* header, const void* payload,
                            const RecordHeader& h);

}  // namespace kiln

#endif  // KILN_RECORD_H_

// The on-disk record format of a kiln cache: every constant lives here.
//
// Two record versions exist. Version 1 (below) holds one tensor and one
// int64 label; version 2 holds any number of named fields, each with its
// own dtype and its own shape in every record (see "Version 2" further
// down). A cache's records all have one version: the manifest's
// format_version (1 or 2) says which.
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
#include <vector>

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

// Version 2 (format_version 2 caches): a record of named fields.
//
// Value: a 32-byte header, a table of one 32-byte entry per field (in the
// manifest's field order), then each field's payload, at offsets that are
// multiples of 16 from the value's start, in field order, with zero bytes
// between them (none after the last). The offsets are a function of the
// shapes (each payload starts at the first multiple of 16 at or after the
// end of the one before; the first after the table), so a record's bytes
// are canonical.
//
//   header: offset size field
//        0    4 magic          as version 1
//        4    2 version        kRecordVersion2
//        6    2 field_count    u16, 1..kMaxFields
//        8    8 checksum       u64 XXH3-64, seed = the record's index, over
//                              the whole value except these 8 bytes
//                              (bytes [0,8) then [16, value end))
//       16    8 value_bytes    u64, the value's length
//       24    8 reserved       must be zero
//   field entry (at 32 + 32 x field):
//        0    1 dtype          DType code
//        1    1 ndim           0..kMaxDims (0: a scalar, one element)
//        2    1 codec          Codec: 0 raw, 1 JPEG (see below)
//        3    1 reserved       must be zero
//        4    4 encoded_bytes  u32: an encoded payload's length; 0 when raw
//        8   16 shape[4]       u32 each up to ndim (0 allowed: an empty
//                              field), 0 past it; at most 2^40 elements
//       24    8 offset         u64 from the value's start; 16-aligned
//
// Raw field payloads are C-contiguous, little-endian, prod(shape) x
// DTypeSize bytes. An encoded payload (codec 1, JPEG) is encoded_bytes
// (>= 1) of one baseline or progressive JFIF image; the entry's dtype is
// uint8 and its shape the decoded image's C x H x W (C 1: a grayscale
// JPEG, C 3: decoded to RGB), which the JPEG's own header must match.
inline constexpr uint16_t kRecordVersion2 = 2;
inline constexpr size_t kRecordV2HeaderSize = 32;
inline constexpr size_t kFieldEntrySize = 32;
inline constexpr size_t kFieldAlign = 16;
inline constexpr size_t kChecksumOffsetV2 = 8;
inline constexpr int kMaxFields = 16;
// The manifest format_version of a cache of version 2 records.
inline constexpr int kFormatVersion2 = 2;
// The manifest format_version of a cache whose shards may hold records
// under other keys (ShardInfo::keyed: kiln merge --from); its
// "record_format" (1 or 2) says how the records are laid out, and that is
// what Manifest::format_version holds once it is read.
inline constexpr int kFormatVersionKeyed = 3;

// How a version 2 field's payload is stored.
enum class Codec : uint8_t {
  kRaw = 0,   // the tensor's bytes
  kJpeg = 1,  // a JPEG of a uint8 C x H x W image (C 1 or 3)
};
// "raw", "jpeg".
const char* CodecName(Codec codec);

// Element types. Version 1 records use 1..3 only; version 2 fields any.
enum class DType : uint8_t {
  kUint8 = 1,
  kFloat16 = 2,
  kFloat32 = 3,
  kInt32 = 4,
  kInt64 = 5,
};

// Size of one element in bytes; 0 for an unknown code.
size_t DTypeSize(DType dtype);
// "uint8", "float16", "float32", "int32", "int64".
const char* DTypeName(DType dtype);
// Parses a name written by DTypeName. Returns InvalidArgument otherwise.
Status ParseDType(const std::string& name, DType* out);
// Any DType code (1..5).
bool IsValidDType(uint8_t code);
// Whether `dtype` holds pixel values a loader can make model inputs of
// (uint8, float16, float32): what version 1 records hold.
bool IsPixelDType(DType dtype);

// A tensor shape of 1..kMaxDims dimensions (0 for a version 2 scalar).
struct Shape {
  int ndim = 0;
  std::array<uint32_t, kMaxDims> dims{};
  // The product of the dims; 0 for ndim 0 (a record shape is never 0-d;
  // for a field, where 0-d is a scalar, use FieldElements).
  uint64_t NumElements() const;
  std::string ToString() const;  // "3x224x224"
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
};

// The elements of a field of shape `s`: the product of its dims, 1 for a
// scalar (ndim 0).
uint64_t FieldElements(const Shape& s);

// One field of a stored record: its type, its shape in this record and
// where its payload lies in the value.
struct FieldEntry {
  DType dtype = DType::kUint8;
  Shape shape;
  uint64_t offset = 0;  // from the value's start
  // The payload's length: FieldElements(shape) x DTypeSize(dtype) raw, the
  // encoded length otherwise.
  uint64_t bytes = 0;
  Codec codec = Codec::kRaw;
};

// The decoded header of one record, of either version.
struct RecordHeader {
  // Version 1: the record's tensor and label. Version 2: the first field's
  // dtype, shape and payload length, and label -1; readers that know the
  // manifest point them at its image and label fields (ResolveRecord in
  // kiln/manifest.h).
  DType dtype = DType::kUint8;
  Shape shape;
  int64_t label = -1;
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;
  uint16_t version = kRecordVersion;
  uint64_t value_bytes = 0;  // the stored value's length
  // Every field. Version 1: "image" (the payload at offset 64) and "label"
  // (the header's int64 at offset 24).
  int num_fields = 0;
  std::array<FieldEntry, kMaxFields> fields{};
};

// One field's contents for EncodeRecordV2.
struct FieldData {
  DType dtype = DType::kUint8;
  Shape shape;                 // ndim 0 for a scalar; an encoded image's C x H x W
  const void* data = nullptr;  // FieldPayloadBytes bytes
  Codec codec = Codec::kRaw;
  uint64_t encoded_bytes = 0;  // an encoded payload's length (codec not raw)
};

// The payload bytes of `f`: FieldElements x DTypeSize raw, else encoded_bytes.
uint64_t FieldPayloadBytes(const FieldData& f);
// Whether an encoded field's entry is well formed: uint8, C x H x W with C 1
// or 3 and H, W >= 1, 1 <= encoded_bytes < 2^32. Returns InvalidArgument
// (or, for a stored record, the caller makes it Corruption) saying what is
// wrong; OK for raw fields.
Status CheckEncodedField(Codec codec, DType dtype, const Shape& shape, uint64_t encoded_bytes);

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

// Parses and bounds-checks a stored value of `value_size` bytes of either
// version without looking at the payloads: magic, version, dtypes, ndims,
// shapes, reserved bytes, and (version 2) the field table's offsets, each
// where the shapes before it put it, and the value's length against the
// last field's end. Never reads past `value_size` (a version 2 table is
// read only as far as `value_size` holds it). Returns Corruption naming
// `index` and the first bad field. Does not verify the checksum.
Status DecodeRecordHeader(uint64_t index, const uint8_t* value, size_t value_size,
                          RecordHeader* out);

// The bytes of a version 2 value's header and table with `n` fields.
size_t RecordV2TableEnd(int n);
// The length of the version 2 value of these fields. REQUIRES: 1 <= n <=
// kMaxFields, each shape bounded as a record's.
uint64_t RecordV2Size(const FieldData* fields, int n);
// Writes the version 2 value of record `index` (RecordV2Size bytes) into
// `value`: header, table, payloads, zero padding and the checksum. Each
// entry's offset is computed here.
void EncodeRecordV2(uint64_t index, const FieldData* fields, int n, uint8_t* value);

// Where a stored value keeps its 8-byte checksum (offset 40 in version 1,
// 8 in version 2); the shard digest is over these. REQUIRES: value_size
// covers the header of the value's version (else returns 40).
size_t StoredChecksumOffset(const uint8_t* value, size_t value_size);

// Recomputes the checksum of a stored value already checked by
// DecodeRecordHeader. Returns Corruption naming `index` on mismatch.
Status VerifyRecordChecksum(uint64_t index, const uint8_t* value, const RecordHeader& h);
// The same for a value read into separate buffers. Version 1: `header`
// holds the 64-byte header and `payload` the payload. Version 2: the value
// is `header` (bytes [0, split)), then `payload` (the next `payload_len`
// bytes), then `tail` (the rest, h.value_bytes - split - payload_len).
Status VerifyRecordChecksum(uint64_t index, const uint8_t* header, const void* payload,
                            const RecordHeader& h, size_t split = 0, size_t payload_len = 0,
                            const uint8_t* tail = nullptr);
// Packs: several consecutive version 2 records in one LMDB value, under
// the first one's key (a cache whose manifest has layout.pack_bytes, format
// 3). LMDB stores a value larger than a page in whole 4 KiB pages, so a
// record of tens of KB (a JPEG) loses 2 KiB a record on average; a pack of
// a megabyte loses that once. Layout (little-endian):
//        0    4 magic          'K','L','N','P'
//        4    4 count          u32, >= 1: the records in the pack
//        8    8 reserved       zero
//       16 16*n table          per record: u64 offset (from the value's
//                              start, a multiple of 16), u64 length
// The records follow the table, each at the first multiple of 16 at or
// after the end of the one before (the first: after the table), the bytes
// between zero; the value ends where the last record ends. Each record is
// exactly what a value of its own would hold (its checksum seeded with its
// key), 16-byte aligned in the memory map as an overflow value is.
inline constexpr uint32_t kPackMagic = 0x504E4C4Bu;  // "KLNP" on disk
inline constexpr size_t kPackHeaderSize = 16;
inline constexpr size_t kPackEntrySize = 16;
// Whether a stored value is a pack (its magic; not yet checked further).
bool IsPack(const uint8_t* value, size_t size);
// The number of records in a pack; REQUIRES: IsPack.
uint32_t PackCount(const uint8_t* value);
// Record `j` of a pack: where it lies in `value`. Corruption ("the pack
// under key K: ...") when the count, an offset or a length is not as the
// layout above says (outside the value, out of order, misaligned), or j is
// past the count.
Status PackEntry(const uint8_t* value, size_t size, uint64_t key, uint32_t j,
                 const uint8_t** record, size_t* record_size);
// Writes the pack of the `n` records `values[i]` (sizes `sizes[i]`) into
// *out (resized).
void EncodePack(const uint8_t* const* values, const size_t* sizes, size_t n,
                std::vector<uint8_t>* out);

// A VerifyRecordChecksum result for record `index` checked under another
// key (a shard kiln merge --from linked: ShardInfo::KeyOf): a mismatch is
// named by the record's index and the key. `s` unchanged when key == index.
Status NameLinkedRecord(const Status& s, uint64_t index, uint64_t key);

}  // namespace kiln

#endif  // KILN_RECORD_H_

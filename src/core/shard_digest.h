// ShardDigest (internal): the manifest's per-shard digest, XXH3-64 over the
// shard's record checksums (8 bytes each, as stored) in key order
// (docs/format.md). The writer, verify and the digest of an existing shard
// all accumulate it here.
#ifndef KILN_SRC_CORE_SHARD_DIGEST_H_
#define KILN_SRC_CORE_SHARD_DIGEST_H_

#include <xxhash.h>

#include <cstdint>
#include <string>

#include "kiln/manifest.h"

namespace kiln {

class ShardDigest {
 public:
  ShardDigest() { Reset(); }
  void Reset() {
    // A stack state must be initialized before reset (xxhash.h: XXH3_INITSTATE).
    XXH3_INITSTATE(&state_);
    XXH3_64bits_reset(&state_);
  }
  // Adds the checksum of the next record (its 8 stored bytes).
  void Add(const void* checksum_bytes) { XXH3_64bits_update(&state_, checksum_bytes, 8); }
  void Add(uint64_t checksum) { Add(&checksum); }
  // 16 hex digits, as the manifest records it.
  std::string Hex() const { return DigestHex(XXH3_64bits_digest(&state_)); }

 private:
  XXH3_state_t state_;
};

}  // namespace kiln

#endif  // KILN_SRC_CORE_SHARD_DIGEST_H_

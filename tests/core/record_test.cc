#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include <xxhash.h>

#include "kiln/record.h"
#include "core/units.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::MakeShape;

TEST_CASE("keys are big-endian so byte order is numeric order", "[record]") {
  uint8_t a[8], b[8];
  EncodeKey(255, a);
  EncodeKey(256, b);
  CHECK(std::memcmp(a, b, 8) < 0);
  CHECK(DecodeKey(a) == 255);
  CHECK(DecodeKey(b) == 256);
  EncodeKey(0x0102030405060708ull, a);
  CHECK(a[0] == 1);
  CHECK(a[7] == 8);
}

TEST_CASE("header encodes and decodes every field", "[record]") {
  const Shape shape = MakeShape({3, 4, 5});
  std::vector<uint8_t> value(kRecordHeaderSize + 60 * 2);
  for (size_t i = 0; i < 120; ++i) value[kRecordHeaderSize + i] = static_cast<uint8_t>(i);
  EncodeRecordHeader(42, DType::kFloat16, shape, 7, value.data() + kRecordHeaderSize, value.data());
  RecordHeader h;
  REQUIRE(DecodeRecordHeader(42, value.data(), value.size(), &h).ok());
  CHECK(h.dtype == DType::kFloat16);
  CHECK(h.shape == shape);
  CHECK(h.label == 7);
  CHECK(h.payload_bytes == 120);
  CHECK(VerifyRecordChecksum(42, value.data(), h).ok());
  // The checksum covers the index: the same bytes under another key fail.
  CHECK(VerifyRecordChecksum(43, value.data(), h).IsCorruption());
  // It covers the label in the header.
  value[24] ^= 1;
  REQUIRE(DecodeRecordHeader(42, value.data(), value.size(), &h).ok());
  CHECK(h.label == 6);
  CHECK(VerifyRecordChecksum(42, value.data(), h).IsCorruption());
}

TEST_CASE("header checks name the record and the field", "[record]") {
  std::vector<uint8_t> value(kRecordHeaderSize + 8);
  EncodeRecordHeader(9, DType::kUint8, MakeShape({8}), 0, value.data() + kRecordHeaderSize,
                     value.data());
  RecordHeader h;
  SECTION("short value") {
    Status s = DecodeRecordHeader(9, value.data(), 10, &h);
    CHECK(s.IsCorruption());
    CHECK_THAT(s.message(), Catch::Contains("record 9"));
  }
  SECTION("bad magic") {
    value[0] ^= 0xFF;
    CHECK_THAT(DecodeRecordHeader(9, value.data(), value.size(), &h).message(),
               Catch::Contains("magic"));
  }
  SECTION("payload length lies") {
    value[32] = 200;
    CHECK_THAT(DecodeRecordHeader(9, value.data(), value.size(), &h).message(),
               Catch::Contains("payload length"));
  }
  SECTION("value shorter than the header claims") {
    CHECK(DecodeRecordHeader(9, value.data(), value.size() - 1, &h).IsCorruption());
  }
  SECTION("unknown dtype") {
    value[6] = 77;
    CHECK_THAT(DecodeRecordHeader(9, value.data(), value.size(), &h).message(),
               Catch::Contains("dtype"));
  }
}

TEST_CASE("random bytes as a record never crash the parser", "[record][fuzz]") {
  std::mt19937_64 rng(12345);
  std::vector<uint8_t> good(kRecordHeaderSize + 24);
  EncodeRecordHeader(5, DType::kFloat32, MakeShape({2, 3}), 1, good.data() + kRecordHeaderSize,
                     good.data());
  int accepted = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    const size_t n = rng() % (kRecordHeaderSize + 64);
    // Keep the buffer exactly n bytes so a read past the end is caught by
    // sanitizers and valgrind.
    std::vector<uint8_t> v(n);
    if (iter % 2 == 0) {
      for (auto& b : v) b = static_cast<uint8_t>(rng());
    } else {
      // (std::copy_n, not memcpy: v.data() is null when n is 0, and memcpy
      // with a null pointer is undefined even for 0 bytes.)
      std::copy_n(good.begin(), std::min(n, good.size()), v.begin());
      for (int f = 0; f < 3 && n; ++f) v[rng() % n] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    RecordHeader h;
    if (DecodeRecordHeader(5, v.data(), v.size(), &h).ok()) {
      ++accepted;
      REQUIRE(h.payload_bytes + kRecordHeaderSize == n);
      REQUIRE(h.payload_bytes == h.shape.NumElements() * DTypeSize(h.dtype));
      (void)VerifyRecordChecksum(5, v.data(), h);
    }
  }
  // Only label, checksum or payload flips can leave a parsable header.
  CHECK(accepted < 200000);
}

TEST_CASE("the checksum is XXH3-64 seeded with the index, as docs/format.md says", "[record]") {
  // An independent reference: the one-shot API over header[0,40) + payload.
  // (Regression: a streaming state on the stack must be initialized first,
  // or a seeded reset can keep a stale secret.)
  std::vector<uint8_t> value(kRecordHeaderSize + 300);
  for (size_t i = 0; i < 300; ++i) value[kRecordHeaderSize + i] = static_cast<uint8_t>(i * 7);
  for (uint64_t index : {0ull, 1ull, 77ull, 1ull << 40}) {
    EncodeRecordHeader(index, DType::kUint8, MakeShape({300}), 3, value.data() + kRecordHeaderSize,
                       value.data());
    std::vector<uint8_t> joined(value.begin(), value.begin() + kChecksumOffset);
    joined.insert(joined.end(), value.begin() + kRecordHeaderSize, value.end());
    RecordHeader h;
    REQUIRE(DecodeRecordHeader(index, value.data(), value.size(), &h).ok());
    CHECK(h.checksum == XXH3_64bits_withSeed(joined.data(), joined.size(), index));
  }
}

TEST_CASE("byte sizes: K..T and KiB..TiB binary, KB..TB decimal", "[units]") {
  uint64_t v = 0;
  REQUIRE(ParseByteSize("4G", "--x", &v).ok());
  CHECK(v == 4ull << 30);
  REQUIRE(ParseByteSize("4GB", "--x", &v).ok());
  CHECK(v == 4000000000ull);
  REQUIRE(ParseByteSize("1.5GiB", "--x", &v).ok());
  CHECK(v == 3ull << 29);
  REQUIRE(ParseByteSize("512m", "--x", &v).ok());
  CHECK(v == 512ull << 20);
  REQUIRE(ParseByteSize("100", "--x", &v).ok());
  CHECK(v == 100);
  REQUIRE(ParseByteSize("2KB", "--x", &v).ok());
  CHECK(v == 2000);
  for (const char* bad : {"", "G", "-1G", "0", "4X", "4gb", "1e30T", "nan"}) {
    Status s = ParseByteSize(bad, "--shard-size", &v);
    CHECK(s.IsInvalidArgument());
    CHECK_THAT(s.message(), Catch::Contains("--shard-size"));
  }
}

TEST_CASE("durations and rates for people: a few significant digits, whole units past a minute",
          "[units]") {
  CHECK(FormatDuration(0) == "0.0 ms");
  CHECK(FormatDuration(-1) == "0.0 ms");
  CHECK(FormatDuration(0.00042) == "0.4 ms");
  CHECK(FormatDuration(0.0239152) == "24 ms");
  CHECK(FormatDuration(0.9996) == "1.00 s");  // not "1000 ms"
  CHECK(FormatDuration(1.234) == "1.23 s");
  CHECK(FormatDuration(12.34) == "12.3 s");
  CHECK(FormatDuration(59.96) == "1 min 00 s");  // not "60.0 s"
  CHECK(FormatDuration(125.4) == "2 min 05 s");
  CHECK(FormatDuration(3599.6) == "1 h 00 min");
  CHECK(FormatDuration(11220) == "3 h 07 min");
  CHECK(FormatByteRate(470400, 0.0239152) == "19.7 MB/s");
  CHECK(FormatByteRate(1000, 0) == "");
}

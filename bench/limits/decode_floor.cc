// The physical floors that bench/build_bench.sh holds kiln against, on one core:
//  1. JPEG decode: every .jpg under DIR, read into memory first, decoded to RGB
//     by libjpeg-turbo (fast DCT) - no cache build can go faster per core;
//     then the same decode plus an OpenCV resize of the shorter side to 256
//     (INTER_LINEAR, or INTER_AREA with the argument "area").
//  2. memcpy: 3x224x224 float16 records copied in shuffled order from a
//     4000-record arena into a 256-record batch - the floor of any cache read.
// usage: decode_floor DIR [area]
// Prints two lines (bench/build_bench.sh parses the key=value fields):
//   jpeg files=N decode_only_per_core=R img/s (M MP/s); decode+resize_per_core=R img/s
//   memcpy_random_fp16_224_per_core=R samples/s (G GB/s)
#include <turbojpeg.h>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Decodes one JPEG into px (grown as needed); false if libjpeg-turbo refuses it.
bool decode(tjhandle tj, const std::vector<unsigned char>& jpg, std::vector<unsigned char>& px,
            int& w, int& h) {
  int subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, jpg.data(), jpg.size(), &w, &h, &subsamp, &colorspace) != 0) return false;
  px.resize(size_t(w) * h * 3);
  return tjDecompress2(tj, jpg.data(), jpg.size(), px.data(), w, 0, h, TJPF_RGB, TJFLAG_FASTDCT) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: decode_floor DIR [area]\n");
    return 2;
  }
  cv::setNumThreads(0);  // OpenCV on the calling thread only: a per-core figure
  const int interp = argc > 2 && std::string(argv[2]) == "area" ? cv::INTER_AREA : cv::INTER_LINEAR;

  // Preload, so that only decoding is timed.
  std::vector<std::vector<unsigned char>> jpgs;
  for (const auto& e : std::filesystem::recursive_directory_iterator(argv[1])) {
    if (!e.is_regular_file() || e.path().extension() != ".jpg") continue;
    std::ifstream f(e.path(), std::ios::binary);
    jpgs.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  if (jpgs.empty()) {
    std::fprintf(stderr, "decode_floor: no .jpg files under %s\n", argv[1]);
    return 2;
  }

  tjhandle tj = tjInitDecompress();
  std::vector<unsigned char> px;
  int w = 0, h = 0;
  size_t pixels = 0, bad = 0;

  auto t0 = Clock::now();
  for (const auto& j : jpgs) {
    if (decode(tj, j, px, w, h)) pixels += size_t(w) * h; else ++bad;
  }
  const double t_decode = seconds_since(t0);

  cv::Mat resized;
  t0 = Clock::now();
  for (const auto& j : jpgs) {
    if (!decode(tj, j, px, w, h)) continue;
    const double f = 256.0 / std::min(w, h);
    cv::Size to(std::max(256, int(w * f + 0.5)), std::max(256, int(h * f + 0.5)));
    cv::resize(cv::Mat(h, w, CV_8UC3, px.data()), resized, to, 0, 0, interp);
  }
  const double t_resize = seconds_since(t0);
  tjDestroy(tj);
  if (bad) std::fprintf(stderr, "decode_floor: %zu files did not decode\n", bad);

  const double n = double(jpgs.size());
  std::printf("jpeg files=%zu decode_only_per_core=%.1f img/s (%.1f MP/s); decode+resize_per_core=%.1f img/s\n",
              jpgs.size(), n / t_decode, pixels / t_decode / 1e6, n / t_resize);

  // Random-order copies of cache-sized records: 3 shuffled passes over the arena.
  const size_t rec = 3 * 224 * 224 * 2, records = 4000, batch = 256, passes = 3;
  std::vector<char> arena(rec * records, 1), out(rec * batch);
  std::vector<size_t> order(records);
  std::iota(order.begin(), order.end(), size_t(0));
  std::mt19937 rng(1);
  t0 = Clock::now();
  for (size_t p = 0; p < passes; ++p) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i = 0; i < records; ++i)
      std::memcpy(out.data() + (i % batch) * rec, arena.data() + order[i] * rec, rec);
    asm volatile("" : : "r"(out.data()) : "memory");  // the copies must happen: out is never read
  }
  const double t_copy = seconds_since(t0);
  const double copies = double(passes * records);
  std::printf("memcpy_random_fp16_224_per_core=%.0f samples/s (%.2f GB/s)\n",
              copies / t_copy, copies * rec / t_copy / 1e9);
  return 0;
}

// Helpers of the ingest tests that run the kiln binary on sample_data/.
#ifndef KILN_TESTS_INGEST_INGEST_TEST_UTIL_H_
#define KILN_TESTS_INGEST_INGEST_TEST_UTIL_H_

#include <filesystem>
#include <string>

#include "test_util.h"

namespace kiln::testing {

inline const std::string kFashion = std::string(KILN_SAMPLE_DATA) + "/fashion/train";
inline const std::string kPhotos = std::string(KILN_SAMPLE_DATA) + "/photos";

// Runs `kiln ARGS`; returns its exit status, output in *out.
inline int Kiln(const std::string& args, std::string* out) {
  return RunCommand(std::string(KILN_BIN) + " " + args, out);
}

// An ImageFolder of `per_class` copies of each photo, in two classes.
inline void MakePhotoFolder(const std::string& root, int per_class) {
  int k = 0;
  for (const auto& e : std::filesystem::directory_iterator(kPhotos)) {
    for (int i = 0; i < per_class; ++i) {
      const std::string cls = (k++ % 2) ? "dogs" : "cats";
      std::filesystem::create_directories(root + "/" + cls);
      std::filesystem::copy_file(e.path(), root + "/" + cls + "/" + std::to_string(k) + "_" +
                                  e.path().filename().string());
    }
  }
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_INGEST_INGEST_TEST_UTIL_H_

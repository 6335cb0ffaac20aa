#include "opencv_codecs.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace kiln::image::internal {
namespace {

constexpr const char* kModuleFile = "libkiln_opencv_codecs.so";

// The directory of the running executable, or "" when /proc cannot say.
std::string ExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::vector<std::string> Candidates() {
  std::vector<std::string> paths;
  // A path the user gave is the only one tried: a wrong one is an error,
  // not a silent fall-back to another kiln's module.
  if (const char* env = std::getenv("KILN_OPENCV_CODECS"); env != nullptr && *env != '\0')
    return {env};
  const std::string exe = ExecutableDir();
  if (!exe.empty()) {
    paths.push_back(exe + "/" + kModuleFile);
    paths.push_back(exe + "/../lib/kiln/" + kModuleFile);
  }
#ifdef KILN_OPENCV_CODECS_BUILD_PATH
  paths.push_back(KILN_OPENCV_CODECS_BUILD_PATH);
#endif
#ifdef KILN_OPENCV_CODECS_INSTALL_PATH
  paths.push_back(KILN_OPENCV_CODECS_INSTALL_PATH);
#endif
  return paths;
}

struct Loaded {
  const OpenCvCodecs* codecs = nullptr;
  std::string tried;  // each path and why it did not load
};

Loaded Load() {
  Loaded l;
  for (const std::string& path : Candidates()) {
    if (access(path.c_str(), R_OK) != 0) {
      l.tried += "\n  " + path + ": no such file";
      continue;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      l.tried += "\n  " + path + ": " + (e ? e : "dlopen failed");
      continue;
    }
    using Entry = const OpenCvCodecs* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, kOpenCvCodecsEntry));
    if (entry == nullptr || entry() == nullptr) {
      l.tried += "\n  " + path + ": has no " + kOpenCvCodecsEntry + " (a module of another kiln)";
      dlclose(handle);
      continue;
    }
    l.codecs = entry();  // the handle stays open for the process's life
    return l;
  }
  return l;
}

}  // namespace

Status LoadOpenCvCodecs(const std::string& why, const OpenCvCodecs** out) {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = Load(); });
  if (loaded.codecs == nullptr)
    return Status::NotSupported(
        std::string("cannot load OpenCV's image codecs ") + why + ": no usable " + kModuleFile +
        " (kiln builds it beside the kiln executable; reinstall kiln, or set "
        "KILN_OPENCV_CODECS to its path). Tried:" +
        loaded.tried);
  *out = loaded.codecs;
  return Status::OK();
}

}  // namespace kiln::image::internal

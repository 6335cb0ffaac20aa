// A stand-in for the CUDA driver library (libcuda.so.1) with the few driver
// API functions kiln doctor calls, so that its GPU path is tested on
// machines without a GPU. KILN_FAKE_CUDA_DEVICES (default 2) is the device
// count; 0 makes cuInit fail as the real driver does without a device.
// Page-locked allocations over 1 GiB fail with CUDA_ERROR_OUT_OF_MEMORY.
#include <cstdlib>
#include <cstring>

namespace {
constexpr int kSuccess = 0;
constexpr int kOutOfMemory = 2;
constexpr int kNotInitialized = 3;
constexpr int kNoDevice = 100;
constexpr int kInvalidDevice = 101;
bool initialized = false;
int current_context = 0;
int contexts[2];

int Devices() {
  const char* n = std::getenv("KILN_FAKE_CUDA_DEVICES");
  return n ? std::atoi(n) : 2;
}
}  // namespace

extern "C" {

int cuGetErrorName(int error, const char** name) {
  switch (error) {
    case kOutOfMemory:
      *name = "CUDA_ERROR_OUT_OF_MEMORY";
      return kSuccess;
    case kNotInitialized:
      *name = "CUDA_ERROR_NOT_INITIALIZED";
      return kSuccess;
    case kNoDevice:
      *name = "CUDA_ERROR_NO_DEVICE";
      return kSuccess;
    case kInvalidDevice:
      *name = "CUDA_ERROR_INVALID_DEVICE";
      return kSuccess;
  }
  return 1;
}

int cuGetErrorString(int error, const char** text) {
  switch (error) {
    case kOutOfMemory:
      *text = "out of memory";
      return kSuccess;
    case kNoDevice:
      *text = "no CUDA-capable device is detected";
      return kSuccess;
  }
  return 1;
}

int cuInit(unsigned) {
  if (Devices() == 0) return kNoDevice;
  initialized = true;
  return kSuccess;
}

int cuDriverGetVersion(int* version) {
  *version = 12040;
  return kSuccess;
}

int cuDeviceGetCount(int* count) {
  if (!initialized) return kNotInitialized;
  *count = Devices();
  return kSuccess;
}

int cuDeviceGet(int* device, int ordinal) {
  if (ordinal < 0 || ordinal >= Devices()) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

int cuDeviceGetName(char* name, int length, int device) {
  const char* names[] = {"Fake GPU Zero", "Fake GPU One"};
  std::strncpy(name, names[device % 2], static_cast<size_t>(length));
  return kSuccess;
}

int cuDeviceTotalMem_v2(size_t* bytes, int device) {
  *bytes = (device + 1) * (8ull << 30);
  return kSuccess;
}

int cuDevicePrimaryCtxRetain(void** context, int device) {
  *context = &contexts[device % 2];
  return kSuccess;
}

int cuDevicePrimaryCtxRelease_v2(int) { return kSuccess; }

int cuCtxSetCurrent(void* context) {
  current_context = context != nullptr;
  return kSuccess;
}

int cuMemHostAlloc(void** p, size_t bytes, unsigned) {
  if (!current_context) return kNotInitialized;
  if (bytes > (1ull << 30)) return kOutOfMemory;
  *p = std::malloc(bytes);
  return *p ? kSuccess : kOutOfMemory;
}

int cuMemFreeHost(void* p) {
  std::free(p);
  return kSuccess;
}

}  // extern "C"

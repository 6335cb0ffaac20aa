// Status: the result of every fallible call in kiln's libraries.
//
// Modelled on leveldb's Status. A Status is either OK or carries a code and a
// message that names what failed (the file, shard or record) and, where the
// user can do something, what to do. Statuses are cheap to copy when OK (no
// allocation). Thread-safety: a Status is a value; distinct objects may be
// used from distinct threads freely.
#ifndef KILN_STATUS_H_
#define KILN_STATUS_H_

#include <memory>
#include <string>
#include <utility>

namespace kiln {

class [[nodiscard]] Status {
 public:
  enum class Code : int {
    kOk = 0,
    kNotFound = 1,        // a file, shard, record or option value is absent
    kCorruption = 2,      // stored data is damaged or inconsistent
    kInvalidArgument = 3, // the caller asked for something impossible
    kIOError = 4,         // the operating system refused an operation
    kNotSupported = 5,    // valid input that kiln cannot handle (yet)
    kStale = 6,           // the cache no longer matches its sources/options
    kIncomplete = 7,      // a cache directory whose build has not finished (no manifest)
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status InvalidArgument(std::string msg) {
    return Status(Code::kInvalidArgument, std::move(msg));
  }
  static Status IOError(std::string msg) { return Status(Code::kIOError, std::move(msg)); }
  static Status NotSupported(std::string msg) { return Status(Code::kNotSupported, std::move(msg)); }
  static Status Stale(std::string msg) { return Status(Code::kStale, std::move(msg)); }
  static Status Incomplete(std::string msg) { return Status(Code::kIncomplete, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsCorruption() const { return code_ == Code::kCorruption; }
  bool IsInvalidArgument() const { return code_ == Code::kInvalidArgument; }
  bool IsIOError() const { return code_ == Code::kIOError; }
  bool IsNotSupported() const { return code_ == Code::kNotSupported; }
  bool IsStale() const { return code_ == Code::kStale; }
  bool IsIncomplete() const { return code_ == Code::kIncomplete; }
  Code code() const { return code_; }

  // The message without the code prefix ("" when OK).
  const std::string& message() const;
  // "OK" or "<Code>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status WithContext(const std::string& prefix) const;

 private:
  Status(Code code, std::string msg)
      : code_(code), msg_(std::make_shared<const std::string>(std::move(msg))) {}
  Code code_ = Code::kOk;
  std::shared_ptr<const std::string> msg_;  // null when OK
};

// Result<T>: a value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: REQUIRES: !status.ok()
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // REQUIRES: ok().
  T& value() { return value_; }
  const T& value() const { return value_; }
  T* operator->() { return &value_; }
  T& operator*() { return value_; }

 private:
  Status status_;
  T value_{};
};

// Evaluates `expr` (a Status) and returns it from the enclosing function when
// it is not OK.
#define KILN_RETURN_IF_ERROR(expr)          \
  do {                                      \
    ::kiln::Status kiln_status__ = (expr);  \
    if (!kiln_status__.ok()) return kiln_status__; \
  } while (0)

}  // namespace kiln

#endif  // KILN_STATUS_H_

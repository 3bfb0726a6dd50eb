// A small error value for the op's internals: empty message = success. The op turns it into an
// ORT status; nothing in this library throws across the C API or calls exit().
#pragma once

#include <string>
#include <utility>

namespace ort_flash {

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string msg) { return Status(std::move(msg)); }
  bool ok() const { return msg_.empty(); }
  const std::string& message() const { return msg_; }

 private:
  explicit Status(std::string msg) : msg_(std::move(msg)) {}
  std::string msg_;
};

#define ORT_FLASH_RETURN_IF_ERROR(expr)   \
  do {                                    \
    ::ort_flash::Status _s = (expr);      \
    if (!_s.ok()) return _s;              \
  } while (0)

}  // namespace ort_flash

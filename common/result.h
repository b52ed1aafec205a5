// Result<T>: a value or an error message, with context added at each level
// ("starting daemon on 'node3': ssh: authentication denied").
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace elasticrun {

struct Failure {
  std::string message;
};

inline Failure fail(std::string message) { return Failure{std::move(message)}; }

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Failure f) : v_(std::move(f)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }
  const std::string& error() const { return std::get<1>(v_).message; }
  // Prefixes the error with "what: ".
  Result context(const std::string& what) && {
    if (ok()) return std::move(*this);
    return Failure{what + ": " + error()};
  }

 private:
  std::variant<T, Failure> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Failure f) : err_(std::move(f.message)) {}
  bool ok() const { return !err_; }
  explicit operator bool() const { return ok(); }
  const std::string& error() const { return *err_; }
  Result context(const std::string& what) && {
    if (ok()) return {};
    return Failure{what + ": " + *err_};
  }

 private:
  std::optional<std::string> err_;
};

}  // namespace elasticrun

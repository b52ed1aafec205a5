#include "cmd/error_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstring>
#include <ctime>

namespace elasticrun::cmd {
namespace {

// Shown of a file that is not torch's JSON: enough to recognise it.
constexpr std::size_t kExcerpt = 200;
// Of a message or traceback: the daemon's limit already bounds them; this bounds a
// terminal's worth of lines anyway.
constexpr std::size_t kShown = 16 * 1024;

// The length of the UTF-8 sequence at s[i], or 0 if it is not a valid one.
std::size_t utf8_length(std::string_view s, std::size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  return n;
}

std::optional<std::int64_t> as_seconds(const nlohmann::json& v) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (!v.is_string()) return std::nullopt;
  const auto& s = v.get_ref<const std::string&>();
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(s);
}

WorkerError problem(std::string why, std::string_view text) {
  WorkerError e;
  e.problem = text.empty() ? why : fmt::format("{}: {}", why, printable(text, kExcerpt));
  return e;
}

std::string trim_end(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Lines after the first indented to stand under the first's text.
std::string indented(const std::string& s, std::size_t by) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '\n') out.append(by, ' ');
  }
  return out;
}

}  // namespace

std::string printable(std::string_view s, std::size_t max) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && out.size() < max;) {
    std::size_t n = utf8_length(s, i);
    auto c = static_cast<unsigned char>(s[i]);
    if (n == 0 || (n == 1 && c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      out += '?';
      ++i;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  if (out.size() >= max && s.size() > max) out += "...";
  return out;
}

WorkerError parse_error_file(std::string_view text, std::uint64_t size, std::size_t limit) {
  if (size > limit) return problem(fmt::format("the file holds {} bytes, over the {}-byte limit", size, limit), "");
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return problem("not JSON", text);
  if (!j.is_object() || !j.contains("message")) return problem("no \"message\" in it", text);
  WorkerError e;
  const auto& m = j["message"];
  if (m.is_string()) {
    e.message = m.get<std::string>();
    if (j.contains("timestamp")) e.timestamp = as_seconds(j["timestamp"]);
  } else if (m.is_object() && m.contains("message") && m["message"].is_string()) {
    e.message = m["message"].get<std::string>();
    if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
      const auto& x = m["extraInfo"];
      if (x.contains("py_callstack") && x["py_callstack"].is_string()) e.traceback = x["py_callstack"].get<std::string>();
      if (x.contains("timestamp")) e.timestamp = as_seconds(x["timestamp"]);
    }
  } else {
    return problem("its \"message\" is neither text nor an object with a \"message\"", text);
  }
  e.message = trim_end(printable(e.message, kShown));
  e.traceback = trim_end(printable(e.traceback, kShown));
  return e;
}

std::string root_cause(const FailedWorker& w, const WorkerError& e) {
  std::string out = "root cause (first observed failure):";
  auto line = [&](const char* key, const std::string& value) {
    out += fmt::format("\n  {:<10}: {}", key, indented(value, 14));
  };
  if (e.timestamp) {
    std::time_t t = static_cast<std::time_t>(*e.timestamp);
    std::tm tm{};
    char buf[64] = {};
    if (::gmtime_r(&t, &tm) && std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm) > 0) line("time", buf);
  }
  line("host", w.host);
  line("rank", fmt::format("{} (local_rank: {})", w.rank, w.local_rank));
  if (w.signal != 0) {
    const char* abbrev = sigabbrev_np(w.signal);
    line("signal", fmt::format("{} (SIG{}) (pid: {})", w.signal, abbrev ? abbrev : "?", w.pid));
  } else {
    line("exitcode", fmt::format("{} (pid: {})", w.code, w.pid));
  }
  if (!e.problem.empty()) {
    line("error_file", "unreadable: " + e.problem);
    return out;
  }
  line("message", e.message);
  if (!e.traceback.empty()) line("traceback", e.traceback);
  return out;
}

}  // namespace elasticrun::cmd

#include "cmd/output.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace elasticrun::cmd {

OutputRouter::~OutputRouter() {
  for (auto& [key, p] : pending_) flush_partial(p, std::get<2>(key));
  for (auto& [key, f] : files_) std::fclose(f);
}

// The tee file of a rank's stream, opened at its first line; nullptr without a directory.
Result<std::FILE*> OutputRouter::file(int rank, int stream) {
  if (dir_.empty()) return static_cast<std::FILE*>(nullptr);
  auto it = files_.find({rank, stream});
  if (it != files_.end()) return it->second;
  std::string d = fmt::format("{}/rank.{}", dir_, rank);
  ::mkdir(dir_.c_str(), 0755);
  if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST)
    return fail(fmt::format("cannot create '{}': {}", d, std::strerror(errno)));
  std::string path = d + (stream == 1 ? "/stdout" : "/stderr");
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return fail(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  files_[{rank, stream}] = f;
  return f;
}

// One line (without its end) to the terminal, prefixed, ended by `end`.
void OutputRouter::emit(int rank, int stream, std::string_view line, char end) {
  std::FILE* f = stream == 1 ? out_ : err_;
  fmt::print(f, "[{}]<{}>: {}{}", rank, stream == 1 ? "stdout" : "stderr", line, end);
  std::fflush(f);
}

Result<void> OutputRouter::write(const Source& from, int rank, int stream, std::span<const std::uint8_t> data) {
  auto tee = file(rank, stream);
  if (!tee) return Failure{tee.error()};
  Pending& p = pending_[{from.first, from.second, stream}];
  p.rank = rank;
  // What was pending holds no line end, but for a '\r' at its very end (it may begin
  // "\r\n"): only the new bytes are searched, and that one.
  std::size_t at = p.partial.empty() ? 0 : p.partial.size() - 1;
  p.partial.append(reinterpret_cast<const char*>(data.data()), data.size());
  std::string_view all(p.partial);
  std::size_t start = 0;
  for (std::size_t end; (end = all.find_first_of("\r\n", at)) != std::string_view::npos; at = end + 1) {
    if (all[end] == '\n') {
      emit(rank, stream, all.substr(start, end - start));
    } else {
      if (end + 1 == all.size()) break;   // "\r\n" or an update: the next byte tells
      if (all[end + 1] == '\n') continue;  // "\r\n": the '\n' ends the line
      if (end > start) emit(rank, stream, all.substr(start, end - start), '\r');
    }
    start = end + 1;
  }
  if (all.size() - start > kMaxLine) {  // no end in sight: cut, so that memory stays bounded
    emit(rank, stream, all.substr(start));
    start = all.size();
  }
  // The file gets the same whole lines, unprefixed, so that two workers writing under
  // one rank do not mix there either.
  if (*tee && start > 0) {
    std::fwrite(p.partial.data(), 1, start, *tee);
    std::fflush(*tee);
  }
  p.partial.erase(0, start);
  return {};
}

void OutputRouter::finish(const Source& from) {
  for (int s : {1, 2}) {
    auto it = pending_.find({from.first, from.second, s});
    if (it == pending_.end()) continue;
    flush_partial(it->second, s);
    pending_.erase(it);
  }
}

// A process's last line without its newline: printed as a line, written as it came.
void OutputRouter::flush_partial(const Pending& p, int stream) {
  if (p.partial.empty()) return;
  emit(p.rank, stream, p.partial);
  if (auto tee = file(p.rank, stream); tee && *tee) {
    std::fwrite(p.partial.data(), 1, p.partial.size(), *tee);
    std::fflush(*tee);
  }
}

}  // namespace elasticrun::cmd

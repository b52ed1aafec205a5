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

// One line (without its newline, or a last partial one) to the terminal and the file.
void OutputRouter::emit(int rank, int stream, std::string_view line) {
  std::FILE* f = stream == 1 ? out_ : err_;
  fmt::print(f, "[{}]<{}>: {}\n", rank, stream == 1 ? "stdout" : "stderr", line);
  std::fflush(f);
}

Result<void> OutputRouter::write(const Source& from, int rank, int stream, std::span<const std::uint8_t> data) {
  auto tee = file(rank, stream);
  if (!tee) return Failure{tee.error()};
  Pending& p = pending_[{from.first, from.second, stream}];
  p.rank = rank;
  p.partial.append(reinterpret_cast<const char*>(data.data()), data.size());
  std::size_t start = 0;
  for (std::size_t nl; (nl = p.partial.find('\n', start)) != std::string::npos; start = nl + 1)
    emit(rank, stream, std::string_view(p.partial).substr(start, nl - start));
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

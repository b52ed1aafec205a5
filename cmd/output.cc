#include "cmd/output.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace elasticrun::cmd {

OutputRouter::~OutputRouter() {
  for (auto& [key, s] : streams_) {
    if (!s.partial.empty()) emit(key.first, key.second, s.partial);
    if (s.file) std::fclose(s.file);
  }
}

Result<OutputRouter::Stream*> OutputRouter::stream(int rank, int stream) {
  auto [it, fresh] = streams_.try_emplace({rank, stream});
  if (fresh && !dir_.empty()) {
    std::string d = fmt::format("{}/rank.{}", dir_, rank);
    ::mkdir(dir_.c_str(), 0755);
    if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST)
      return fail(fmt::format("cannot create '{}': {}", d, std::strerror(errno)));
    std::string path = d + (stream == 1 ? "/stdout" : "/stderr");
    it->second.file = std::fopen(path.c_str(), "w");
    if (!it->second.file) return fail(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  }
  return &it->second;
}

void OutputRouter::emit(int rank, int stream, std::string_view line) {
  std::FILE* f = stream == 1 ? out_ : err_;
  fmt::print(f, "[{}]<{}>: {}\n", rank, stream == 1 ? "stdout" : "stderr", line);
  std::fflush(f);
}

Result<void> OutputRouter::write(int rank, int stream_id, std::span<const std::uint8_t> data) {
  auto s = stream(rank, stream_id);
  if (!s) return Failure{s.error()};
  Stream& st = **s;
  if (st.file) {
    std::fwrite(data.data(), 1, data.size(), st.file);
    std::fflush(st.file);
  }
  st.partial.append(reinterpret_cast<const char*>(data.data()), data.size());
  std::size_t start = 0;
  for (std::size_t nl; (nl = st.partial.find('\n', start)) != std::string::npos; start = nl + 1)
    emit(rank, stream_id, std::string_view(st.partial).substr(start, nl - start));
  st.partial.erase(0, start);
  return {};
}

void OutputRouter::finish(int rank) {
  for (int s : {1, 2}) {
    auto it = streams_.find({rank, s});
    if (it != streams_.end() && !it->second.partial.empty()) {
      emit(rank, s, it->second.partial);
      it->second.partial.clear();
    }
  }
}

}  // namespace elasticrun::cmd

#include "daemon/error_files.h"

#include "common/unique_fd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

namespace elasticrun::daemon {

ErrorFiles::~ErrorFiles() { remove_now(); }

void ErrorFiles::remove_now() {
  std::error_code ec;
  if (made_) std::filesystem::remove_all(dir_, ec);
  made_ = false;
}

std::string ErrorFiles::next_path(std::uint32_t slot) {
  if (!made_) {
    std::error_code ec;
    std::filesystem::create_directory(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_, ec)) return "";
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all, ec);
    made_ = true;
  }
  return dir_ + "/" + std::to_string(slot) + "." + std::to_string(++given_) + ".json";
}

ErrorFileContents ErrorFiles::take(const std::string& path, std::size_t limit) {
  ErrorFileContents out;
  // Not following a link, not waiting on a FIFO's writer.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (fd && ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    out.size = static_cast<std::uint64_t>(st.st_size);
    if (out.size <= limit) {
      out.text.resize(out.size);
      std::size_t got = 0;
      while (got < out.text.size()) {
        ssize_t n = ::read(fd.get(), out.text.data() + got, out.text.size() - got);
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
      }
      out.text.resize(got);  // it may have shrunk meanwhile (a child of the worker still writing)
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(path, ec);  // whatever it is, a directory included
  return out;
}

}  // namespace elasticrun::daemon

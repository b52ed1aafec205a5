#include "common/writable_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace elasticrun {

namespace fs = std::filesystem;

Result<void> check_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail("cannot create '" + dir + "': " + ec.message());
  if (!fs::is_directory(dir, ec)) return fail("'" + dir + "' is not a directory");
  std::string probe = dir + "/.probe-" + std::to_string(::getpid());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("cannot write in the directory: creating '" + probe + "': " + std::strerror(errno));
  bool ok = ::write(fd, "x", 1) == 1 && ::fsync(fd) == 0;
  std::string err = ok ? "" : "cannot write '" + probe + "': " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  if (!ok) return fail(err);
  return {};
}

}  // namespace elasticrun

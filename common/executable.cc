#include "common/executable.h"

#include <sys/stat.h>
#include <unistd.h>

namespace elasticrun {
namespace {

Result<std::string> check(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return fail("'" + path + "': no such file");
  if (!S_ISREG(st.st_mode)) return fail("'" + path + "' is not a regular file");
  if ((st.st_mode & 0111) == 0 || ::access(path.c_str(), X_OK) != 0) return fail("'" + path + "' is not executable");
  return path;
}

}  // namespace

Result<std::string> find_executable(const std::string& program, const std::string& path) {
  if (program.find('/') != std::string::npos) return check(program);
  for (std::size_t start = 0; start <= path.size();) {
    std::size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (auto r = check((dir.empty() ? "." : dir) + "/" + program); r) return r;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return fail("'" + program + "': command not found in PATH");
}

}  // namespace elasticrun

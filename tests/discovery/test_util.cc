#include "test_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace elasticrun::discovery::testing {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "er-discovery-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string write_script(const TempDir& dir, const std::string& name, const std::string& body, int mode) {
  std::string p = dir.file(name);
  write_file(p, body);
  ::chmod(p.c_str(), mode);
  return p;
}

void write_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
  }
  std::filesystem::rename(tmp, path);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool run_until(boost::asio::io_context& io, const std::function<bool()>& done, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::optional<Result<std::vector<Host>>> poll_once(boost::asio::io_context& io, HostSource& src,
                                                   std::chrono::milliseconds limit) {
  std::optional<Result<std::vector<Host>>> got;
  src.poll([&](Result<std::vector<Host>> r) { got.emplace(std::move(r)); });
  run_until(io, [&] { return got.has_value(); }, limit);
  return got;
}

bool process_gone(int pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  // A killed orphan stays a zombie until its new parent reaps it: that is gone too.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

std::vector<int> zombie_children() {
  std::vector<int> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    int ppid = 0;
    rest >> state >> ppid;
    if (state == 'Z' && ppid == ::getpid()) out.push_back(std::stoi(name));
  }
  return out;
}

bool wait_gone(int pid, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!process_gone(pid)) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace elasticrun::discovery::testing

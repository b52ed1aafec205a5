#include "cmd/ssh_daemon.h"

#include "common/log.h"
#include "common/socket_options.h"

#include <boost/asio.hpp>
#include <fmt/format.h>
#include <libssh/libssh.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <thread>

namespace elasticrun::cmd {
namespace {

namespace asio = boost::asio;

struct SessionDeleter {
  void operator()(ssh_session s) const {
    ssh_disconnect(s);
    ssh_free(s);
  }
};
struct ChannelDeleter {
  void operator()(ssh_channel c) const {
    ssh_channel_close(c);
    ssh_channel_free(c);
  }
};
using Session = std::unique_ptr<ssh_session_struct, SessionDeleter>;
using Channel = std::unique_ptr<ssh_channel_struct, ChannelDeleter>;

// Single-quotes `s` for the remote shell.
std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}


class SshDaemon final : public DaemonLink {
 public:
  SshDaemon(asio::io_context& io, std::string host, DaemonEvents ev, SshOptions opts, std::string command)
      : DaemonLink(std::move(host), std::move(ev)), io_(io), opts_(std::move(opts)), command_(std::move(command)) {
    thread_ = std::thread([this] { run(); });
  }
  ~SshDaemon() override {
    close();
    alive_.reset();
  }

  void send_frame(const Frame& f) override {
    std::lock_guard lock(mu_);
    out_.push_back(encode_frame(f));
  }
  void close() override {
    stop_ = true;
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  void run();
  Result<Session> connect();
  Result<void> verify_host_key(ssh_session s);
  Result<void> authenticate(ssh_session s);
  bool pump(ssh_channel ch);
  // Hands `fn` to the io thread, unless this link is gone by then.
  template <class F>
  void post(F fn) {
    asio::post(io_, [weak = std::weak_ptr<int>(alive_), fn = std::move(fn)] {
      if (weak.lock()) fn();
    });
  }

  asio::io_context& io_;
  SshOptions opts_;
  std::string command_;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::deque<wire::Bytes> out_;
  std::thread thread_;
};

Result<Session> SshDaemon::connect() {
  Session s(ssh_new());
  if (!s) return fail("ssh: cannot allocate a session");
  std::string target = host(), user;
  if (auto at = target.find('@'); at != std::string::npos) {
    user = target.substr(0, at);
    target = target.substr(at + 1);
  }
  // libssh logs to stderr on its own; our messages carry its errors when they matter.
  int quiet = log::enabled(log::Component::driver, log::Level::debug) ? SSH_LOG_WARNING : SSH_LOG_NOLOG;
  ssh_options_set(s.get(), SSH_OPTIONS_LOG_VERBOSITY, &quiet);
  ssh_options_set(s.get(), SSH_OPTIONS_HOST, target.c_str());
  // The user's ssh config first, so that explicit flags set after it win.
  if (ssh_options_parse_config(s.get(), opts_.config_file.empty() ? nullptr : opts_.config_file.c_str()) < 0)
    return fail("ssh: cannot read config '" + opts_.config_file + "'");
  // A LogLevel in the config would let libssh write to our stderr; ours decides.
  ssh_options_set(s.get(), SSH_OPTIONS_LOG_VERBOSITY, &quiet);
  if (!user.empty()) ssh_options_set(s.get(), SSH_OPTIONS_USER, user.c_str());
  if (opts_.port > 0) ssh_options_set(s.get(), SSH_OPTIONS_PORT, &opts_.port);
  if (!opts_.known_hosts.empty()) ssh_options_set(s.get(), SSH_OPTIONS_KNOWNHOSTS, opts_.known_hosts.c_str());
  long secs = std::max<long>(1, static_cast<long>(opts_.connect_timeout.count() / 1000));
  ssh_options_set(s.get(), SSH_OPTIONS_TIMEOUT, &secs);
  bool no = false;
  ssh_options_set(s.get(), SSH_OPTIONS_PROCESS_CONFIG, &no);  // parsed above
  if (ssh_connect(s.get()) != SSH_OK) return fail(std::string("ssh: cannot connect: ") + ssh_get_error(s.get()));
  net::keep_alive(ssh_get_fd(s.get()), opts_.keep_alive);
  if (auto ok = verify_host_key(s.get()); !ok) return Failure{ok.error()};
  if (auto ok = authenticate(s.get()); !ok) return Failure{ok.error()};
  return s;
}

Result<void> SshDaemon::verify_host_key(ssh_session s) {
  switch (ssh_session_is_known_server(s)) {
    case SSH_KNOWN_HOSTS_OK: return {};
    case SSH_KNOWN_HOSTS_CHANGED:
    case SSH_KNOWN_HOSTS_OTHER:
      return fail("ssh: HOST KEY MISMATCH: the host's key differs from the one in known_hosts; refusing to connect");
    case SSH_KNOWN_HOSTS_UNKNOWN:
    case SSH_KNOWN_HOSTS_NOT_FOUND:
      if (opts_.host_key_check == HostKeyCheck::no) return {};
      if (opts_.host_key_check == HostKeyCheck::accept_new) {
        if (ssh_session_update_known_hosts(s) != SSH_OK) return fail("ssh: cannot record the new host key");
        return {};
      }
      return fail("ssh: host key unknown (not in known_hosts); use --ssh-host-key-checking accept-new to trust it");
    default: return fail(std::string("ssh: cannot check the host key: ") + ssh_get_error(s));
  }
}

Result<void> SshDaemon::authenticate(ssh_session s) {
  int rc = SSH_AUTH_DENIED;
  if (!opts_.identity_file.empty()) {
    ssh_key key = nullptr;
    if (ssh_pki_import_privkey_file(opts_.identity_file.c_str(), nullptr, nullptr, nullptr, &key) != SSH_OK)
      return fail("ssh: cannot read identity file '" + opts_.identity_file + "'");
    rc = ssh_userauth_publickey(s, nullptr, key);
    ssh_key_free(key);
  } else {
    rc = ssh_userauth_publickey_auto(s, nullptr, nullptr);
  }
  if (rc != SSH_AUTH_SUCCESS) return fail(std::string("ssh: authentication denied: ") + ssh_get_error(s));
  return {};
}

// Moves bytes both ways once; false when the channel is finished.
bool SshDaemon::pump(ssh_channel ch) {
  std::deque<wire::Bytes> out;
  {
    std::lock_guard lock(mu_);
    out.swap(out_);
  }
  for (const auto& b : out)
    if (ssh_channel_write(ch, b.data(), static_cast<uint32_t>(b.size())) != static_cast<int>(b.size())) return false;
  char buf[65536];
  int n = ssh_channel_read_timeout(ch, buf, sizeof buf, 0, 5);
  if (n > 0) {
    wire::Bytes data(buf, buf + n);
    post([this, data = std::move(data)] { on_bytes(data); });
  }
  int e = ssh_channel_read_nonblocking(ch, buf, sizeof buf, 1);
  if (e > 0) fmt::print(stderr, "[{}] {}", host(), std::string_view(buf, static_cast<std::size_t>(e)));
  return n != SSH_ERROR && !(n == 0 && ssh_channel_is_eof(ch));
}

void SshDaemon::run() {
  auto s = connect();
  if (!s) {
    post([this, why = s.error()] { report_closed(why); });
    return;
  }
  Channel ch(ssh_channel_new(s->get()));
  if (!ch || ssh_channel_open_session(ch.get()) != SSH_OK || ssh_channel_request_exec(ch.get(), command_.c_str()) != SSH_OK) {
    post([this, why = std::string("ssh: cannot start the daemon: ") + ssh_get_error(s->get())] { report_closed(why); });
    return;
  }
  ER_LOG(driver, info, "daemon on '{}' started over SSH", host());
  while (!stop_ && pump(ch.get())) {
  }
  if (stop_) return;  // closed from our side
  int status = ssh_channel_get_exit_status(ch.get());
  std::string why = status > 0 ? fmt::format("daemon exited with status {}", status) : "the SSH connection closed";
  post([this, why] { report_closed(shutting_down_ ? "" : why); });
}

}  // namespace

std::unique_ptr<DaemonLink> launch_ssh_daemon(asio::io_context& io, const std::string& host,
                                              const std::string& daemon_path, const std::string& log_level,
                                              const SshOptions& options, DaemonEvents ev) {
  std::string cmd = "exec " + quote(daemon_path) + " --stdio";
  if (!log_level.empty()) cmd += " " + quote("--log-level=" + log_level);
  return std::make_unique<SshDaemon>(io, host, std::move(ev), options, cmd);
}

}  // namespace elasticrun::cmd

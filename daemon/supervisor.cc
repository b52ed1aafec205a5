#include "daemon/supervisor.h"

#include "common/env.h"
#include "common/log.h"
#include "common/python_command.h"
#include "common/shm_dirs.h"
#include "common/socket_options.h"
#include "daemon/device_hint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <string_view>
#include <filesystem>
#include <map>

extern char** environ;

namespace elasticrun::daemon {

namespace asio = boost::asio;

Supervisor::Supervisor(asio::io_context& io, int in_fd, int out_fd, std::function<void(int)> on_done,
                       SupervisorOptions options)
    : io_(io), stream_(io, in_fd, out_fd, *this),
      on_done_(std::move(on_done)), options_(std::move(options)), kill_timer_(io), watchdog_(io), beat_timer_(io),
      flush_timer_(io), preempt_timer_(io),
      error_files_(shm_dirs::errors_path(::getpid())) {
  if (!options_.state_dir.empty()) record_ = std::make_unique<JobRecord>(options_.state_dir);
  launcher_ = make_process_launcher(io, worker_events());
}

WorkerEvents Supervisor::worker_events() {
  WorkerEvents ev;
  ev.on_output = [this](std::uint32_t slot, int stream, std::span<const std::uint8_t> data) {
    send(msg::Output{slot, static_cast<std::uint8_t>(stream), wire::Bytes(data.begin(), data.end())});
  };
  ev.on_exit = [this](std::uint32_t slot, int pid, int code, int sig) {
    remove_shm_dir(slot);
    if (record_) record_->remove(pid);
    ER_LOG(daemon, debug, "slot {} (pid {}) exited: code {} signal {}", slot, pid, code, sig);
    msg::Exited e{slot, static_cast<std::uint32_t>(pid), code, sig};
    if (auto it = error_file_of_.find(pid); it != error_file_of_.end()) {
      auto contents = ErrorFiles::take(it->second, msg::kMaxErrorFile);
      error_file_of_.erase(it);
      // A worker that succeeded has nothing to report, whatever it left there.
      if (code != 0 || sig != 0) e.error_file = std::move(contents.text), e.error_file_size = contents.size;
    }
    send(e);
    finish_if_idle();
  };
  ev.on_settled = [this] { finish_if_idle(); };
  ev.hold_output = [this] { return !out_broken_ && stream_.queued_bytes() >= kOutputHold; };
  return ev;
}

void Supervisor::on_stream_drained() {
  ++drains_;
  launcher_->resume_output();
  finish_if_idle();
}

Supervisor::~Supervisor() {
  for (auto& [slot, dir] : shm_dirs_) std::filesystem::remove_all(dir);
}

// UCX's shared-memory transport names its segments in /dev/shm; a worker killed with
// SIGKILL cannot remove them. Each worker gets a private directory there instead
// (UCX_POSIX_DIR), which the daemon removes when the worker is gone.
std::string Supervisor::make_shm_dir(std::uint32_t slot) {
  if (std::getenv("UCX_POSIX_DIR")) return "";
  remove_shm_dir(slot);
  std::string dir = shm_dirs::path(::getpid(), slot, ++spawned_);
  std::error_code ec;
  if (!std::filesystem::create_directory(dir, ec)) return "";
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
  shm_dirs_[slot] = dir;
  return dir;
}

void Supervisor::release_shared_memory() {
  std::error_code ec;
  for (auto& [slot, dir] : shm_dirs_) std::filesystem::remove_all(dir, ec);
  shm_dirs_.clear();
  error_files_.remove_now();
}

void Supervisor::remove_shm_dir(std::uint32_t slot) {
  auto it = shm_dirs_.find(slot);
  if (it == shm_dirs_.end()) return;
  std::error_code ec;
  std::filesystem::remove_all(it->second, ec);
  shm_dirs_.erase(it);
}

void Supervisor::start() {
  send(msg::Ready{static_cast<std::uint32_t>(::getpid()), ""});
  watch_driver();
  stream_.start();
}

void Supervisor::on_stream_frame(Frame f) {
  watch_driver();
  try {
    handle(f);
  } catch (const wire::DecodeError& e) {
    ER_LOG(daemon, error, "rejected malformed {} frame: {}; stopping", msg::type_name(f.type), e.what());
    stream_.stop_reading();
    stop(std::chrono::milliseconds(1000), 1);
  }
}

void Supervisor::on_stream_end(const StreamEnd& end) {
  switch (end.kind) {
    case StreamEnd::Kind::bad_stream:
      ER_LOG(daemon, error, "rejected control stream: {}; stopping", end.detail);
      return stop(std::chrono::milliseconds(1000), 1);
    case StreamEnd::Kind::write_error:
      out_broken_ = true;
      return stop(std::chrono::milliseconds(1000), 1);
    case StreamEnd::Kind::eof:
    case StreamEnd::Kind::read_error:
      if (!stopping_) ER_LOG(daemon, info, "control channel closed; stopping all workers");
      out_broken_ = true;  // nobody to report to
      return stop(std::chrono::milliseconds(1000), stopping_ ? exit_code_ : 1);
  }
}

// Any frame from the driver proves it is there; silence for the host timeout (the
// driver sends heartbeats several times as often) means it is gone or cut off.
void Supervisor::watch_driver() {
  watchdog_.expires_after(driver_timeout_);
  watchdog_.async_wait([this](boost::system::error_code ec) {
    if (ec || stopping_) return;
    ER_LOG(daemon, warn, "no word from the driver for {:.1f} s; stopping all workers",
           std::chrono::duration<double>(driver_timeout_).count());
    out_broken_ = true;
    stop(std::chrono::milliseconds(1000), 1);
  });
}

// Our side of the heartbeat: the driver fails this host's workers when it hears
// nothing from us for the host timeout.
void Supervisor::beat() {
  beat_timer_.expires_after(std::chrono::milliseconds(config_->heartbeat_ms));
  beat_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || done_) return;
    send(msg::Heartbeat{});
    beat();
  });
}

void Supervisor::handle(const Frame& f) {
  if (!config_ && f.type != msg::kConfig) throw wire::DecodeError("first frame must be config");
  switch (f.type) {
    case msg::kConfig: {
      if (config_) throw wire::DecodeError("second config frame");
      config_ = msg::parse<msg::Config>(f);
      if (config_->protocol != msg::kControlProtocol) {
        ER_LOG(daemon, error, "the driver speaks control protocol {}, this elasticrund {}: install the same "
               "elasticrun version on every host; stopping", config_->protocol, msg::kControlProtocol);
        stop(std::chrono::milliseconds(1000), 1);
        return;
      }
      if (config_->secret.size() != auth::Secret{}.size()) throw wire::DecodeError("bad secret size");
      if (config_->heartbeat_ms < msg::kMinHeartbeatMs || config_->host_timeout_ms > msg::kMaxHostTimeoutMs ||
          config_->host_timeout_ms < 2ull * config_->heartbeat_ms)
        throw wire::DecodeError(fmt::format("bad heartbeat settings: timeout {} ms, interval {} ms",
                                            config_->host_timeout_ms, config_->heartbeat_ms));
      if (config_->preempt_grace_ms > msg::kMaxPreemptGraceMs)
        throw wire::DecodeError(fmt::format("preemption grace {} ms is over the most, {} ms", config_->preempt_grace_ms,
                                            msg::kMaxPreemptGraceMs));
      for (const auto& m : config_->preload)
        if (!is_dotted_module_name(m)) throw wire::DecodeError(fmt::format("bad preload module name '{}'", m));
      // No worker runs before the config: the launcher can still be chosen.
      if (!config_->preload.empty()) launcher_ = make_launcher(io_, worker_events(), config_->preload);
      driver_timeout_ = std::chrono::milliseconds(config_->host_timeout_ms);
      // A connection from the driver (elasticrund --listen) gets the job's bound too.
      net::keep_alive(stream_.native_handle(), driver_timeout_);
      watch_driver();
      beat();
      if (options_.secret_pad)
        for (std::size_t i = 0; i < config_->secret.size(); ++i) config_->secret[i] ^= (*options_.secret_pad)[i];
      return;
    }
    case msg::kSpawn: return on_spawn(msg::parse<msg::Spawn>(f));
    case msg::kKill: {
      auto k = msg::parse<msg::Kill>(f);
      if (k.signal <= 0 || k.signal >= NSIG) throw wire::DecodeError("bad signal number");
      if (k.slot == msg::kAllSlots) launcher_->signal_all(k.signal);
      else launcher_->signal(k.slot, k.signal);
      return;
    }
    case msg::kHeartbeat: msg::parse<msg::Heartbeat>(f); return;  // any frame re-arms the watchdog
    case msg::kReservePort: return on_reserve_port(msg::parse<msg::ReservePort>(f));
    case msg::kShutdown: {
      auto s = msg::parse<msg::Shutdown>(f);
      stop(std::chrono::milliseconds(std::min<std::uint32_t>(s.grace_ms, 60000)), 0);
      return;
    }
    default: throw wire::DecodeError(std::string("unexpected ") + msg::type_name(f.type) + " frame");
  }
}

namespace {

// The cores this daemon may run on (its affinity mask: a cpuset or taskset counts).
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
}

// Slurm's variables that describe one task of a step: this daemon's own (srun started it
// as the one task of its step; the driver's node's daemon inherits the batch step's).
// A worker is none of those tasks, and a program that finds them takes Slurm for its
// launcher: PyTorch Lightning's SLURMEnvironment takes SLURM_NTASKS for the world size
// and SLURM_PROCID for the rank (every worker rank 0 of 1). The job's variables
// (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_CONF, ...) stay.
bool slurm_task_variable(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "SLURM_PROCID",          "SLURM_LOCALID",          "SLURM_NODEID",
      "SLURM_NTASKS",          "SLURM_NPROCS",           "SLURM_TASK_PID",
      "SLURM_GTIDS",           "SLURM_LAUNCH_NODE_IPADDR", "SLURM_SRUN_COMM_HOST",
      "SLURM_SRUN_COMM_PORT",  "SLURM_DISTRIBUTION",     "SLURM_STEPID",
  };
  if (name.starts_with("SLURM_STEP_") || name.starts_with("SLURM_CPU_BIND")) return true;
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

}  // namespace

// The worker's whole environment; for each name the last entry wins. In order: the
// default OMP_NUM_THREADS (the host's cores shared among its workers of the epoch, so
// that they do not oversubscribe it; any setting of it wins), this daemon's
// environment but for its Slurm task's variables, the error file, the driver's entries
// (torchrun's variables, then the forwarded ones and -x: the user may set those), and
// ours.
std::vector<std::string> Supervisor::worker_env(const msg::Spawn& s, const std::string& error_file) const {
  std::vector<std::string> out;
  out.push_back(fmt::format("{}={}", env::kOmpNumThreads, std::max(1, usable_cores() / std::max(1, s.local_size))));
  // UCX warns about messages still in flight when an epoch is torn down after an abort;
  // that is expected here, so workers log UCX errors only unless the user says otherwise.
  out.push_back("UCX_LOG_LEVEL=error");
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    if (!slurm_task_variable(kv.substr(0, kv.find('=')))) out.emplace_back(kv);
  }
  if (!error_file.empty()) out.push_back(std::string(env::kTorchErrorFile) + "=" + error_file);
  for (const auto& kv : s.env) out.push_back(kv);
  auto set = [&](const char* k, const std::string& v) { out.push_back(std::string(k) + "=" + v); };
  set(env::kRendezvousAddr, config_->rendezvous_addr);
  set(env::kSecret, auth::to_hex(config_->secret));
  set(env::kHost, config_->host);
  set(env::kSlot, std::to_string(s.slot));
  set(env::kEpoch, std::to_string(s.epoch));
  set(env::kRank, std::to_string(s.rank));
  set(env::kSize, std::to_string(s.size));
  // A GPU per slot (stable across epochs, unlike local_rank), unless the user chose.
  if (auto device = worker_device_hint(static_cast<int>(s.slot), s.env))
    set(env::kDeviceHint, std::to_string(*device));
  std::map<std::string, std::string> merged;
  for (auto& kv : out)
    if (auto eq = kv.find('='); eq != std::string::npos) merged[kv.substr(0, eq)] = std::move(kv);
  out.clear();
  for (auto& [k, kv] : merged) out.push_back(std::move(kv));
  return out;
}

void Supervisor::on_spawn(const msg::Spawn& s) {
  if (stopping_) return;
  WorkerSpec spec;
  spec.slot = s.slot;
  spec.argv = s.argv;
  spec.cwd = config_->cwd;
  std::string error_file = error_files_.next_path(s.slot);
  spec.env = worker_env(s, error_file);
  // The file is ours to read and remove only if the worker got our path (-x may name another).
  std::string given = std::string(env::kTorchErrorFile) + "=" + error_file;
  bool ours = !error_file.empty() && std::find(spec.env.begin(), spec.env.end(), given) != spec.env.end();
  if (auto dir = make_shm_dir(s.slot); !dir.empty()) spec.env.push_back("UCX_POSIX_DIR=" + dir);
  if (!ours) error_file.clear();
  launcher_->spawn(spec, [this, slot = s.slot, error_file](Result<int> pid) {
    if (!pid) {
      // Given up by a stop (abandon_starting): not the program's failure, which the
      // driver would take for one that cannot start anywhere. The daemon's end tells it.
      if (stopping_) ER_LOG(daemon, info, "slot {} not started: {}", slot, pid.error());
      else send(msg::SpawnFailed{slot, pid.error()});
      return;
    }
    if (!error_file.empty()) error_file_of_[*pid] = error_file;
    if (record_) record_->add(*pid);
    send(msg::Started{slot, static_cast<std::uint32_t>(*pid)});
  });
}

// A new port for the epoch's MASTER_PORT; the one held for the epoch before is let go,
// and so is the store on it. Asked to, torch's store is started on the new port (by the
// fork server), and the answer waits until it listens; where it cannot be, the answer
// says so and rank 0 hosts the store, as without.
void Supervisor::on_reserve_port(const msg::ReservePort& r) {
  if (stopping_) return;  // no epoch starts any more
  launcher_->drop_store();
  auto port = port_.renew();
  if (!port) {
    ER_LOG(daemon, error, "cannot reserve a port for epoch {}: {}", r.epoch, port.error());
    send(msg::PortReserved{r.epoch, 0, port.error()});
    return;
  }
  ER_LOG(daemon, debug, "reserved port {} for epoch {}", *port, r.epoch);
  // Only where the fork server has torch imported: the store is then a fork that
  // listens within milliseconds, where importing torch first would hold the workers back
  // longer than the race it removes.
  bool torch_preloaded = config_ && std::any_of(config_->preload.begin(), config_->preload.end(), [](const auto& m) {
    return m == "torch" || m.starts_with("torch.");
  });
  if (!r.host_store || !torch_preloaded) {
    send(msg::PortReserved{r.epoch, *port, ""});
    return;
  }
  launcher_->host_store(*port, [this, epoch = r.epoch, port = *port](Result<int> pid) {
    if (pid)
      ER_LOG(daemon, debug, "torch's store for epoch {} listens on port {} (pid {})", epoch, port, *pid);
    else
      ER_LOG(daemon, debug, "torch's store for epoch {} not hosted here ({}): rank 0 hosts it", epoch, pid.error());
    send(msg::PortReserved{epoch, port, "", static_cast<bool>(pid)});
  });
}

bool Supervisor::defer_stop(int signal) {
  if (stopping_ || preempted_ || !config_ || config_->preempt_grace_ms == 0 || out_broken_) return false;
  preempted_ = true;
  auto grace = std::chrono::milliseconds(config_->preempt_grace_ms);
  ER_LOG(daemon, info, "received signal {}; the workers keep running up to {:.1f} s for the job's last checkpoint",
         signal, grace.count() / 1000.0);
  send(msg::Preempted{signal});
  preempt_timer_.expires_after(grace);
  preempt_timer_.async_wait([this, signal](boost::system::error_code ec) {
    if (ec || stopping_) return;
    ER_LOG(daemon, info, "the preemption grace is over; stopping all workers");
    stop(std::chrono::milliseconds(2000), 128 + signal);
  });
  return true;
}

void Supervisor::stop(std::chrono::milliseconds grace, int exit_code) {
  preempt_timer_.cancel();
  launcher_->resume_output();  // with nobody to send it to, output is read and dropped
  if (stopping_) {
    finish_if_idle();
    return;
  }
  stopping_ = true;
  exit_code_ = exit_code;
  launcher_->signal_all(SIGTERM);
  // A scheduler that ends the job (scancel, preemption, a pod's deletion) may SIGKILL
  // this daemon before its workers are gone: nothing of theirs may be left in /dev/shm.
  release_shared_memory();
  kill_timer_.expires_after(grace);
  kill_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    launcher_->signal_all(SIGKILL);
    launcher_->abandon_starting();
    watch_flush();
    finish_if_idle();
  });
  finish_if_idle();
}

// After the kill, what is left is handing the driver what the workers wrote and how
// they ended. The watchdog no longer bounds that (a stopping driver sends no heartbeats),
// so this does: a driver that reads nothing for the host timeout (stopped, hung, behind
// a link cut without an error) is taken for gone, and what it did not read is dropped,
// as when the channel closes. Without it, output held for such a driver kept the dead
// workers' pipes unread and the daemon waiting for ever.
void Supervisor::watch_flush() {
  flush_timer_.expires_after(driver_timeout_);
  flush_timer_.async_wait([this, drains = drains_, bytes = stream_.queued_bytes()](boost::system::error_code ec) {
    if (ec || done_ || out_broken_) return;
    std::size_t now = stream_.queued_bytes();
    if (now == 0 || now < bytes || drains_ != drains) return watch_flush();
    ER_LOG(daemon, warn, "the driver read nothing for {:.1f} s while the job stopped; dropping {} bytes for it",
           std::chrono::duration<double>(driver_timeout_).count(), now);
    out_broken_ = true;
    stop(std::chrono::milliseconds(0), exit_code_);  // already stopping: resumes output and finishes
  });
}

void Supervisor::finish_if_idle() {
  if (!stopping_ || done_ || launcher_->running() > 0) return;
  if (!out_broken_ && stream_.queued() > 0) return;  // flush reports first; on_stream_drained calls back
  done_ = true;
  kill_timer_.cancel();
  watchdog_.cancel();
  beat_timer_.cancel();
  flush_timer_.cancel();
  stream_.close();
  if (on_done_) on_done_(exit_code_);
}

void Supervisor::send_frame(const Frame& f) {
  if (!out_broken_) stream_.send(f);
}

}  // namespace elasticrun::daemon

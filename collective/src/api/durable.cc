#include "api/durable.h"

#include "api/context_internal.h"
#include "common/log.h"

#include <unistd.h>

#include <utility>

namespace elasticrun {

namespace ckpt = collective::checkpoint;
using Clock = std::chrono::steady_clock;

std::unique_ptr<Durable> Durable::from_settings(Context& ctx) {
  auto cfg = collective::settings::checkpoint();
  if (!cfg) return nullptr;
  Notify notify;
  Requests requests;
  if (auto client = ContextInternals::client(ctx)) {
    notify = [client](const msg::CheckpointNote& n) { (void)client->note(n); };
    requests = [client] { return client->checkpoint_requests(); };
  }
  return std::make_unique<Durable>(ctx, std::move(*cfg), std::move(notify), std::move(requests));
}

Durable::Durable(Context& ctx, collective::settings::Checkpoint cfg, Notify notify, Requests requests)
    : ctx_(ctx),
      cfg_(std::move(cfg)),
      notify_(std::move(notify)),
      requests_(std::move(requests)),
      last_time_(Clock::now()) {
  thread_ = std::thread([this] { writer(); });
}

Durable::~Durable() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::uint64_t Durable::epoch() const { return ctx_.topology().epoch; }

bool Durable::due(std::uint64_t commit) {
  if (ctx_.comm().rank() != 0) return false;
  requests_due_ = requests_ ? requests_() : 0;
  bool by_request = requests_due_ > requests_served_;
  bool by_count = cfg_.every > 0 && commit >= last_commit_ + cfg_.every;
  bool by_time = cfg_.interval.count() > 0 && Clock::now() - last_time_ >= cfg_.interval;
  return by_request || by_count || by_time;
}

void Durable::save(std::uint64_t commit, const std::string& kind, std::vector<ckpt::Item> items,
                   std::vector<std::byte>& payload) {
  Job job;
  job.manifest.kind = kind;
  job.manifest.epoch = epoch();
  job.manifest.commit = commit;
  job.manifest.items = std::move(items);
  job.manifest.host = ctx_.topology().host;
  job.manifest.pid = static_cast<std::uint32_t>(::getpid());
  job.manifest.unix_ms = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  job.payload = std::move(payload);
  job.requested = requests_due_ > requests_served_;
  requests_served_ = std::max(requests_served_, requests_due_);
  {
    std::lock_guard lock(mu_);
    // A job not yet taken is replaced by this newer one (which answers its request too);
    // its buffer is reused.
    if (job_ && job_->requested) job.requested = true;
    payload = job_ ? std::move(job_->payload) : std::move(spare_);
    job_ = std::move(job);
    busy_ = true;
  }
  payload.clear();
  last_commit_ = commit;
  last_time_ = Clock::now();
  cv_.notify_all();
}

void Durable::writer() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || job_; });
    if (!job_) return;  // stopping with nothing handed over; a job handed over is written first
    Job job = std::move(*job_);
    job_.reset();
    lock.unlock();
    auto start = Clock::now();
    auto written = ckpt::write(cfg_.dir, job.manifest, job.payload);
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    if (written) {
      ER_LOG(collective, info, "durable checkpoint of commit {} ({} bytes) in {} ms: {}", job.manifest.commit,
             job.payload.size(), took.count(), *written);
      tell(msg::CheckpointEvent::saved, job.manifest.epoch, job.manifest.commit, job.payload.size(), took, *written, "",
           job.requested);
    } else {
      ER_LOG(collective, error, "durable checkpoint of commit {} failed: {}", job.manifest.commit, written.error());
      tell(msg::CheckpointEvent::failed, job.manifest.epoch, job.manifest.commit, job.payload.size(), took, cfg_.dir,
           written.error(), job.requested);
    }
    lock.lock();
    spare_ = std::move(job.payload);
    busy_ = job_.has_value();
    cv_.notify_all();
  }
}

void Durable::drain() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
}

// Also called by the writer thread: everything it says comes in the arguments (the
// Context may be re-joining meanwhile, or gone).
void Durable::tell(msg::CheckpointEvent event, std::uint64_t epoch, std::uint64_t commit, std::uint64_t bytes,
                   std::chrono::milliseconds took, const std::string& path, const std::string& detail,
                   bool requested) {
  if (!notify_) return;
  msg::CheckpointNote n;
  n.event = event;
  n.epoch = epoch;
  n.commit = commit;
  n.bytes = bytes;
  n.millis = static_cast<std::uint32_t>(std::min<long long>(took.count(), UINT32_MAX));
  n.path = path;
  n.detail = detail;
  n.requested = requested;
  notify_(n);
}

std::optional<ckpt::Loaded> Durable::load(const std::string& kind, const std::vector<ckpt::Item>& items) {
  auto start = Clock::now();
  auto found = ckpt::newest(cfg_.dir);
  for (const auto& [path, why] : found.skipped) {
    ER_LOG(collective, warn, "skipping checkpoint {}", why);
    tell(msg::CheckpointEvent::skipped, epoch(), ckpt::commit_of(path.substr(path.rfind('/') + 1)).value_or(0), 0, {}, path,
         why);
  }
  if (!found.loaded) return std::nullopt;
  const ckpt::Manifest& m = found.loaded->manifest;
  if (m.kind != kind)
    throw Error("checkpoint " + found.loaded->path + " holds a '" + m.kind + "' state, this program's is '" + kind +
                "': it is another program's (use another --checkpoint-dir)");
  if (!items.empty() && m.items != items) {
    std::string want, got;
    auto describe = [](const ckpt::Item& it) {
      return it.name + ":" + std::to_string(it.bytes) + ":" +
             (it.type <= static_cast<std::uint32_t>(DataType::i64) ? name_of(static_cast<DataType>(it.type)) : "?");
    };
    for (const auto& it : items) want += (want.empty() ? "" : ", ") + describe(it);
    for (const auto& it : m.items) got += (got.empty() ? "" : ", ") + describe(it);
    throw Error("checkpoint " + found.loaded->path + " tracks other items (" + got + ") than this program (" + want +
                "): it is another program's (use another --checkpoint-dir)");
  }
  last_commit_ = m.commit;
  last_time_ = Clock::now();
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(last_time_ - start);
  ER_LOG(collective, info, "restored commit {} (epoch {}) from {} in {} ms", m.commit, m.epoch, found.loaded->path,
         took.count());
  tell(msg::CheckpointEvent::restored, epoch(), m.commit, m.payload_bytes, took, found.loaded->path, "");
  return std::move(found.loaded);
}

}  // namespace elasticrun

#include "host/shm_group.h"

#include <elasticrun/types.hpp>

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <random>

#include <sched.h>

namespace elasticrun::collective {

namespace {

constexpr std::uint64_t kMagic = 0x656c617374696367ull;  // "elasticg"
constexpr std::size_t kPage = 4096;
constexpr std::size_t kFlagBytes = 128;  // a flag per 128 B: adjacent-line prefetch stays off peers' flags
// A blocking waiter polls kSpins times, then yields its core (to the rank it
// waits for, most likely) for up to kYieldWindow, and only then sleeps on the
// futex, Options::sleep_slice at a time between looks at the abort signal and the deadline.
// Oversubscribed, the peer is usually one time slice away, and a yield hands the
// core over without the wake-up system call a sleeper costs the arriving rank.
constexpr unsigned kSpins = 64;
constexpr auto kYieldWindow = std::chrono::milliseconds(3);

struct Header {
  std::uint64_t magic;
  std::uint64_t token;
  std::uint64_t size;
  std::uint64_t slot;
  std::uint64_t small_max;
};

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
std::size_t flags_bytes(int size) { return round_up(kFlagBytes * static_cast<std::size_t>(size), kPage); }
std::size_t segment_bytes(int size, std::size_t slot) {
  return kPage + flags_bytes(size) + 2 * (static_cast<std::size_t>(size) + 1) * slot;
}

[[noreturn]] void fail(const std::string& what) { throw Error("shared memory: " + what + ": " + std::strerror(errno)); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The flags are shared between processes, so the futex calls must not be private.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds slice) {
  timespec ts{static_cast<time_t>(slice.count() / 1'000'000'000), static_cast<long>(slice.count() % 1'000'000'000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake(std::atomic<std::uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool reached(std::uint32_t seq, std::uint32_t target) { return static_cast<std::int32_t>(seq - target) >= 0; }

// Maps `bytes` of `fd`, pre-faulted so the first collective does not pay for it.
std::byte* map(int fd, std::size_t bytes, const std::string& path) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) fail("mmap " + path);
  return static_cast<std::byte*>(p);
}

}  // namespace

struct ShmGroup::Flag {
  std::atomic<std::uint32_t> seq;      // the last barrier this rank arrived at
  std::atomic<std::uint32_t> waiters;  // ranks asleep on `seq`
  // Tiny inputs, one per set, in the same cache line as `seq`: a peer that sees
  // the new sequence number has the data too.
  alignas(8) std::byte tiny[2][ShmGroup::kTinyBytes];
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "futex words must be plain 32-bit words");

ShmGroup::ShmGroup(const Options& o, std::size_t slot, std::byte* base, std::size_t bytes, std::string path,
                   std::uint64_t token)
    : opts_(o), slot_(slot), base_(base), bytes_(bytes), path_(std::move(path)), token_(token) {}

ShmGroup::~ShmGroup() { ::munmap(base_, bytes_); }

std::unique_ptr<ShmGroup> ShmGroup::create(const Options& o) {
  if (o.size < 1 || o.rank != 0) throw Error("shared memory: create is rank 0's, of a group of at least 1");
  std::size_t slot = round_up(std::max<std::size_t>(o.slot_bytes, 1), kPage);
  std::size_t bytes = segment_bytes(o.size, slot);
  std::random_device rd;
  std::uint64_t token = (std::uint64_t{rd()} << 32) | rd();
  std::string dir = o.dir.empty() ? "/dev/shm" : o.dir;
  std::string path = dir + "/elasticrun-coll." + std::to_string(::getpid()) + "." + std::to_string(token & 0xffffffff);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) fail("create " + path);
  // Reserve the pages now: on a full tmpfs a plain ftruncate would succeed and the
  // first touch of a page would kill the process with SIGBUS instead.
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    errno = err;
    fail("reserve " + std::to_string(bytes) + " bytes in " + dir);
  }
  std::byte* base = nullptr;
  try {
    base = map(fd, bytes, path);
  } catch (...) {
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  ::close(fd);
  auto* h = reinterpret_cast<Header*>(base);
  *h = Header{kMagic, token, static_cast<std::uint64_t>(o.size), slot, o.small_max};
  return std::unique_ptr<ShmGroup>(new ShmGroup(o, slot, base, bytes, std::move(path), token));
}

std::unique_ptr<ShmGroup> ShmGroup::attach(const Options& o, const std::string& path, std::uint64_t token) {
  std::size_t slot = round_up(std::max<std::size_t>(o.slot_bytes, 1), kPage);
  std::size_t bytes = segment_bytes(o.size, slot);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) fail("open " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
    ::close(fd);
    throw Error("shared memory: " + path + " is not a segment of " + std::to_string(bytes) + " bytes");
  }
  std::byte* base = nullptr;
  try {
    base = map(fd, bytes, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  auto g = std::unique_ptr<ShmGroup>(new ShmGroup(o, slot, base, bytes, path, token));
  const auto* h = reinterpret_cast<const Header*>(base);
  if (h->magic != kMagic || h->token != token || h->size != static_cast<std::uint64_t>(o.size) || h->slot != slot ||
      h->small_max != o.small_max)
    throw Error("shared memory: " + path + " belongs to another group");
  return g;
}

void ShmGroup::unlink() { ::unlink(path_.c_str()); }

ShmGroup::Flag& ShmGroup::flag(int q) const {
  static_assert(sizeof(Flag) <= 64, "a rank's flag and tiny inputs share one cache line");
  return *reinterpret_cast<Flag*>(base_ + kPage + kFlagBytes * static_cast<std::size_t>(q));
}

std::byte* ShmGroup::input(int set, int q) const {
  std::size_t per_set = (static_cast<std::size_t>(opts_.size) + 1) * slot_;
  return base_ + kPage + flags_bytes(opts_.size) + static_cast<std::size_t>(set) * per_set +
         static_cast<std::size_t>(q) * slot_;
}

std::byte* ShmGroup::result(int set) const { return input(set, opts_.size); }

std::byte* ShmGroup::tiny(int set, int q) const { return flag(q).tiny[set]; }

void ShmGroup::arrive() {
  Flag& f = flag(opts_.rank);
  // seq_cst on both sides: either a sleeper sees the new value before it sleeps,
  // or we see its waiter count and wake it.
  f.seq.store(++seq_, std::memory_order_seq_cst);
  if (f.waiters.load(std::memory_order_seq_cst) != 0) futex_wake(f.seq);
}

void ShmGroup::wait_all(Clock::time_point deadline, const AbortSignal& abort, const char* what) {
  for (int q = 0; q < opts_.size; ++q)
    if (q != opts_.rank) wait_for(q, seq_, deadline, abort, what);
}

void ShmGroup::wait_for(int q, std::uint32_t target, Clock::time_point deadline, const AbortSignal& abort,
                        const char* what) {
  Flag& f = flag(q);
  Clock::time_point yield_until{};
  for (unsigned i = 0;; ++i) {
    if (reached(f.seq.load(std::memory_order_acquire), target)) return;
    bool idle = opts_.blocking && i >= kSpins;
    if (idle || (i & 1023) == 1023) {
      abort.check();
      if (opts_.progress) opts_.progress();
      auto now = Clock::now();
      if (now >= deadline)
        throw TimeoutError(std::string(what) + ": timed out waiting for rank " + std::to_string(opts_.first_rank + q) +
                           " (shared memory)");
      if (idle && yield_until == Clock::time_point{}) yield_until = now + kYieldWindow;
      if (idle && now < yield_until) {
        sched_yield();
        continue;
      }
    }
    if (!idle) {
      cpu_relax();
      continue;
    }
    f.waiters.fetch_add(1, std::memory_order_seq_cst);
    std::uint32_t now = f.seq.load(std::memory_order_seq_cst);
    if (!reached(now, target)) futex_wait(f.seq, now, opts_.sleep_slice);
    f.waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace elasticrun::collective

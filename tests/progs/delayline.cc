// A delay line between pairs of network devices, for scripts/testcluster --delay on a
// kernel without netem (nor fq or etf: nothing in tc that holds a packet for a time).
//
//   delayline CONFIG        CONFIG: "# generation G" then one line per link:
//                           "DEV_A DEV_B DELAY_NS JITTER_NS"
//
// Every frame that arrives on DEV_A leaves on DEV_B, and every frame from DEV_B leaves on
// DEV_A, DELAY_NS after it arrived (by the kernel's receive stamp, not when the line got
// round to reading it), plus a uniform draw in [-JITTER_NS, +JITTER_NS]. A direction is a
// FIFO: a frame never leaves before the one ahead of it, so jitter delays but does not
// reorder (netem may reorder; TCP over this line sees no reordering). Frames are whole
// layer-2 frames, GSO trains included: the sockets carry the virtio-net header, so a 64 KiB
// TCP segment train crosses as one frame and the kernel keeps its offloads.
//
// SIGHUP re-reads CONFIG (new delays apply to frames that arrive afterwards); once a
// configuration is in force, CONFIG.applied holds its generation, so that whoever changed
// it can wait for it. SIGTERM or SIGINT: exit 0, with the counts on stderr. A frame the
// next device refuses (queue full, cable cut) is dropped and counted, as a wire drops it.
//
// The line runs at SCHED_FIFO priority where it may and with 1 ns timer slack, so that it
// wakes when a frame is due and not when the scheduler gets round to it.
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

// A GSO train is at most 64 KiB of payload; the header and the virtio-net header come on top.
constexpr std::size_t kFrameMax = (256 << 10);
// struct virtio_net_hdr, which PACKET_VNET_HDR puts before each frame (<linux/virtio_net.h>
// does not compile as C++: a member is named `class`).
constexpr std::size_t kVnetHeader = 10;

std::int64_t clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::int64_t now_ns() { return clock_ns(CLOCK_MONOTONIC); }

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "delayline: %s\n", what.c_str());
  std::exit(1);
}

struct Frame {
  std::int64_t due;
  std::vector<unsigned char> bytes;
};

// One device's end: what arrives on it waits in `pending` for the partner's device.
struct Port {
  std::string name;
  int fd = -1;
  std::size_t partner = 0;
  std::int64_t delay = 0, jitter = 0;
  std::deque<Frame> pending;
  std::int64_t last_due = 0;
  std::uint64_t frames = 0, bytes = 0, dropped = 0;
};

int open_port(const std::string& name) {
  unsigned index = if_nametoindex(name.c_str());
  if (index == 0) fail("no device '" + name + "': " + std::strerror(errno));
  int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (fd < 0) fail("packet socket: " + std::string(std::strerror(errno)));
  int one = 1, buffer = 8 << 20;
  if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) != 0 ||
      setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) != 0)
    fail("packet socket options on " + name + ": " + std::strerror(errno));
  // The kernel stamps each frame as it arrives, so a frame waiting on the socket while the
  // line sends others is still due one delay after it came, not after the line read it.
  if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) != 0)
    fail("SO_TIMESTAMPNS on " + name + ": " + std::strerror(errno));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer);  // root only; best effort
  setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer);
  sockaddr_ll where{};
  where.sll_family = AF_PACKET;
  where.sll_protocol = htons(ETH_P_ALL);
  where.sll_ifindex = static_cast<int>(index);
  if (bind(fd, reinterpret_cast<sockaddr*>(&where), sizeof where) != 0)
    fail("bind to " + name + ": " + std::strerror(errno));
  return fd;
}

struct Config {
  std::string generation;
  struct Link {
    std::string a, b;
    std::int64_t delay, jitter;
  };
  std::vector<Link> links;
};

// Reads CONFIG; on a malformed line, says which and returns false (the old one stays).
bool read_config(const std::string& path, Config& out) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "delayline: cannot read %s\n", path.c_str());
    return false;
  }
  Config c;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.rfind("# generation ", 0) == 0) {
      c.generation = line.substr(13);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    Config::Link link;
    std::string rest;
    if (!(fields >> link.a >> link.b >> link.delay >> link.jitter) || (fields >> rest) || link.delay < 0 ||
        link.jitter < 0 || link.jitter > link.delay) {
      std::fprintf(stderr, "delayline: %s:%d: expected 'DEV_A DEV_B DELAY_NS JITTER_NS' (0 <= jitter <= delay): %s\n",
                   path.c_str(), number, line.c_str());
      return false;
    }
    c.links.push_back(link);
  }
  out = std::move(c);
  return true;
}

class Line {
 public:
  explicit Line(std::string path) : path_(std::move(path)) {}

  int run() {
    Config config;
    if (!read_config(path_, config) || config.links.empty()) fail("no links in " + path_);
    for (const auto& link : config.links) {
      std::size_t a = ports_.size();
      ports_.push_back(Port{.name = link.a, .fd = open_port(link.a), .partner = a + 1});
      ports_.push_back(Port{.name = link.b, .fd = open_port(link.b), .partner = a});
    }
    apply(config);

    sigset_t signals;
    sigemptyset(&signals);
    for (int s : {SIGHUP, SIGTERM, SIGINT}) sigaddset(&signals, s);
    sigprocmask(SIG_BLOCK, &signals, nullptr);
    int sfd = signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (sfd < 0 || ep < 0) fail(std::string("signalfd/epoll: ") + std::strerror(errno));
    auto watch = [&](int fd, std::uint64_t tag) {
      epoll_event e{.events = EPOLLIN, .data = {.u64 = tag}};
      if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) != 0) fail(std::string("epoll_ctl: ") + std::strerror(errno));
    };
    for (std::size_t i = 0; i < ports_.size(); ++i) watch(ports_[i].fd, i);
    watch(sfd, kSignalTag);

    std::vector<unsigned char> scratch(kFrameMax);
    epoll_event events[64];
    for (;;) {
      std::int64_t next = send_due();
      timespec wait{}, *timeout = nullptr;
      if (next >= 0) {
        wait = {.tv_sec = static_cast<time_t>(next / 1'000'000'000), .tv_nsec = static_cast<long>(next % 1'000'000'000)};
        timeout = &wait;
      }
      int n = epoll_pwait2(ep, events, 64, timeout, nullptr);
      if (n < 0 && errno != EINTR) fail(std::string("epoll_pwait2: ") + std::strerror(errno));
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 != kSignalTag) {
          receive(ports_[events[i].data.u64], scratch);
          continue;
        }
        signalfd_siginfo info{};
        while (read(sfd, &info, sizeof info) == sizeof info) {
          if (info.ssi_signo != SIGHUP) return report();
          if (read_config(path_, config)) apply(config);
        }
      }
    }
  }

 private:
  static constexpr std::uint64_t kSignalTag = ~std::uint64_t{0};

  // Sets each link's delay (links are matched by their devices; the set of devices is
  // fixed at start) and acknowledges the generation.
  void apply(const Config& config) {
    for (const auto& link : config.links) {
      for (auto& p : ports_) {
        if (p.name == link.a || p.name == link.b) p.delay = link.delay, p.jitter = link.jitter;
      }
    }
    std::string tmp = path_ + ".applied.tmp";
    if (std::FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%s\n", config.generation.c_str());
      std::fclose(f);
      std::rename(tmp.c_str(), (path_ + ".applied").c_str());
    }
  }

  // Takes every frame waiting on p's socket into its queue, each due after p's delay.
  void receive(Port& p, std::vector<unsigned char>& scratch) {
    // The stamps are CLOCK_REALTIME; the queue runs on CLOCK_MONOTONIC.
    std::int64_t offset = now_ns() - clock_ns(CLOCK_REALTIME);
    for (;;) {
      iovec data{.iov_base = scratch.data(), .iov_len = scratch.size()};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
      msghdr msg{.msg_name = nullptr, .msg_namelen = 0, .msg_iov = &data, .msg_iovlen = 1,
                 .msg_control = control, .msg_controllen = sizeof control, .msg_flags = 0};
      ssize_t got = recvmsg(p.fd, &msg, MSG_TRUNC);
      if (got < 0) return;  // EAGAIN: drained (an error: the next wakeup says it again)
      if (static_cast<std::size_t>(got) > scratch.size()) {
        ++p.dropped;  // larger than any GSO train: cannot be carried whole
        continue;
      }
      std::int64_t now = now_ns(), arrived = now;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS) continue;
        timespec ts{};
        std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
        // Never later than now (a stamp from a clock step would hold the frame too long).
        arrived = std::min(now, std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec + offset);
      }
      std::int64_t due = arrived + p.delay;
      if (p.jitter > 0) due += std::uniform_int_distribution<std::int64_t>(-p.jitter, p.jitter)(random_);
      due = std::max(due, p.last_due);
      p.last_due = due;
      p.pending.push_back(Frame{due, {scratch.begin(), scratch.begin() + got}});
    }
  }

  // Sends what is due; returns the nanoseconds until the next frame is, or -1 if none waits.
  std::int64_t send_due() {
    std::int64_t now = now_ns(), next = -1;
    for (auto& p : ports_) {
      Port& to = ports_[p.partner];
      while (!p.pending.empty() && p.pending.front().due <= now) {
        const auto& f = p.pending.front().bytes;
        if (send(to.fd, f.data(), f.size(), MSG_DONTWAIT) == static_cast<ssize_t>(f.size())) {
          ++p.frames;
          p.bytes += f.size() - kVnetHeader;
        } else {
          ++p.dropped;
        }
        p.pending.pop_front();
      }
      if (!p.pending.empty()) {
        std::int64_t wait = p.pending.front().due - now;
        next = next < 0 ? wait : std::min(next, wait);
      }
    }
    return next;
  }

  int report() {
    for (const auto& p : ports_) {
      std::fprintf(stderr, "delayline: %s -> %s: %llu frames, %llu bytes, %llu dropped\n", p.name.c_str(),
                   ports_[p.partner].name.c_str(), static_cast<unsigned long long>(p.frames),
                   static_cast<unsigned long long>(p.bytes), static_cast<unsigned long long>(p.dropped));
    }
    return 0;
  }

  std::string path_;
  std::vector<Port> ports_;
  std::mt19937_64 random_{std::random_device{}()};
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: delayline CONFIG\n");
    return 2;
  }
  prctl(PR_SET_TIMERSLACK, 1UL);
  sched_param priority{.sched_priority = 10};
  sched_setscheduler(0, SCHED_FIFO, &priority);  // best effort: without it the delays are coarser
  return Line(argv[1]).run();
}

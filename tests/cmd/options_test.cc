#include "cmd/options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elasticrun::cmd {
namespace {

Result<ParseOutcome> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "elasticrun");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

TEST(Options, CommandAndItsFlagsPassThroughUntouched) {
  auto r = parse({"-np", "2", "./train", "--lr", "0.1", "-v", "-np", "9"});
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_TRUE(r->options);
  EXPECT_EQ(r->options->np, 2);
  EXPECT_EQ(r->options->command, (std::vector<std::string>{"./train", "--lr", "0.1", "-v", "-np", "9"}));
  EXPECT_TRUE(r->options->log_level.empty());  // the program's -v is not ours
}

TEST(Options, DoubleDashEndsOptions) {
  auto r = parse({"--np=1", "--", "--weird-program-name"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->options->command, (std::vector<std::string>{"--weird-program-name"}));
}

TEST(Options, ShortOptionsWithAttachedValues) {
  auto r = parse({"-Hlocalhost:2", "-xFOO=1", "-x", "BAR=2", "prog"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->options->hosts.size(), 1u);
  EXPECT_EQ(r->options->np, 2);
  // After whatever the default policy forwards from this environment.
  auto& env = r->options->env;
  ASSERT_GE(env.size(), 2u);
  EXPECT_EQ(std::vector<std::string>(env.end() - 2, env.end()), (std::vector<std::string>{"FOO=1", "BAR=2"}));
}

TEST(Options, ForwardsTheLibrarysAndTransportsSettingsByDefault) {
  ::setenv("UCX_TLS", "tcp,self", 1);
  ::setenv("NCCL_DEBUG", "WARN", 1);
  ::setenv("ELASTICRUN_ALGORITHM", "ring", 1);
  ::setenv("ELASTICRUN_SSH_KEY", "/secret/key", 1);  // the driver's own: not forwarded
  ::setenv("ELASTICRUN_RANK", "7", 1);               // the daemon sets it per worker
  ::setenv("UCX_", "nothing", 1);                    // a prefix alone is no name
  auto r = parse({"-x", "UCX_TLS=shm", "prog"});
  for (const char* v : {"UCX_TLS", "NCCL_DEBUG", "ELASTICRUN_ALGORITHM", "ELASTICRUN_SSH_KEY", "ELASTICRUN_RANK", "UCX_"})
    ::unsetenv(v);
  ASSERT_TRUE(r.ok()) << r.error();
  const auto& env = r->options->env;
  auto at = [&](const std::string& kv) { return std::find(env.begin(), env.end(), kv) - env.begin(); };
  EXPECT_LT(at("UCX_TLS=tcp,self"), at("UCX_TLS=shm"));  // -x comes later: it wins
  EXPECT_LT(at("UCX_TLS=shm"), static_cast<long>(env.size()));
  EXPECT_LT(at("NCCL_DEBUG=WARN"), static_cast<long>(env.size()));
  EXPECT_LT(at("ELASTICRUN_ALGORITHM=ring"), static_cast<long>(env.size()));
  EXPECT_EQ(at("ELASTICRUN_SSH_KEY=/secret/key"), static_cast<long>(env.size()));
  EXPECT_EQ(at("ELASTICRUN_RANK=7"), static_cast<long>(env.size()));
  EXPECT_EQ(at("UCX_=nothing"), static_cast<long>(env.size()));
}

TEST(Options, NoPrefixGuessing) {
  auto r = parse({"--host", "a:1", "prog"});  // --hosts exists; --host must not match it
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("unknown option"), std::string::npos);
}

TEST(Options, BadInputsHaveClearMessages) {
  struct Case {
    std::vector<std::string> args;
    const char* why;
  } cases[] = {
      {{"-np", "0", "prog"}, "at least one"},
      {{"-np", "-3", "prog"}, "at least one"},
      {{"-np", "x", "prog"}, "invalid"},
      {{"-np", "5", "-H", "a:2,b:2", "prog"}, "only 4 slots"},
      {{"-H", "a:zero", "prog"}, "not a number"},
      {{"--hostfile", "/nonexistent", "prog"}, "cannot read"},
      {{"-H", "a", "--hostfile", "/x", "prog"}, "not both"},
      {{"--bogus", "prog"}, "unknown option '--bogus'"},
      {{"-np", "2"}, "no command"},
      {{"--start-timeout", "-1", "prog"}, "positive"},
      {{"--slots-per-host", "0", "prog"}, "out of range"},
      {{"-x", "=v", "prog"}, "VAR"},
      {{"--host-timeout", "0.5", "prog"}, "from 1 to 86400"},
      {{"--host-timeout", "86401", "prog"}, "from 1 to 86400"},
      {{"--host-timeout", "nan", "prog"}, "from 1 to 86400"},
      {{"--host-timeout", "soon", "prog"}, "invalid"},
      {{"--worker-timeout", "0.5", "prog"}, "must be 0 (off) or a number of seconds from 1 to 86400"},
      {{"--worker-timeout", "-1", "prog"}, "0 (off) or"},
      {{"--worker-timeout", "86401", "prog"}, "0 (off) or"},
      {{"--worker-timeout", "inf", "prog"}, "0 (off) or"},
      {{"--worker-timeout", "nan", "prog"}, "0 (off) or"},
      {{"--worker-timeout", "later", "prog"}, "invalid"},
      {{"--max-restarts", "-1", "prog"}, "--max-restarts '-1': expected a number of restarts, 0 to 1000000"},
      {{"--max-restarts", "three", "prog"}, "--max-restarts 'three': expected a number"},
      {{"--max-restarts", "2x", "prog"}, "--max-restarts '2x'"},
      {{"--max-restarts", "", "prog"}, "--max-restarts '':"},
      {{"--max-restarts", "1000001", "prog"}, "0 to 1000000"},
      {{"--max-restarts", "2", "--reset-limit", "3", "prog"}, "--max-restarts (restart mode) or --reset-limit"},
      {{"--run-id", "", "prog"}, "--run-id '': expected 1 to 128 letters"},
      {{"--run-id", "a b", "prog"}, "--run-id 'a b'"},
      {{"--run-id", std::string(129, 'a'), "prog"}, "expected 1 to 128"},
      {{"--min-np", "1", "--request-hosts-script", "/bin/true", "prog"}, "needs --host-discovery-script"},
      {{"--host-discovery-script", "/bin/true", "--request-hosts-script", "/nonexistent/req", "prog"},
       "--request-hosts-script '/nonexistent/req': No such file"},
      {{"--host-discovery-script", "/bin/true", "--request-hosts-script", "/etc/passwd", "prog"},
       "--request-hosts-script '/etc/passwd': Permission denied"},
      {{"--request-interval", "0", "prog"}, "--request-interval must be a positive number"},
  };
  for (const auto& c : cases) {
    auto r = parse(c.args);
    ASSERT_FALSE(r.ok()) << c.args[0];
    EXPECT_NE(r.error().find(c.why), std::string::npos) << r.error();
  }
}

TEST(Options, MaxRestartsTurnsRestartModeOnInFixedAndElasticJobs) {
  auto r = parse({"-np", "2", "./train"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_FALSE(r->options->max_restarts);
  EXPECT_EQ(r->options->run_id, "");
  r = parse({"-np", "2", "--max-restarts", "0", "--run-id", "exp-7.a:b_c", "./train"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->options->max_restarts, 0);
  EXPECT_EQ(r->options->run_id, "exp-7.a:b_c");
  r = parse({"--min-np", "1", "-H", "a:2", "--max-restarts=3", "./train"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_TRUE(r->options->elastic);
  EXPECT_EQ(r->options->max_restarts, 3);
}

TEST(Options, HostTimeoutSetsTheKeepAliveOfSshConnectionsToo) {
  auto r = parse({"./train"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->options->host_timeout, std::chrono::milliseconds(10000));
  r = parse({"--host-timeout", "2.5", "./train"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->options->host_timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(r->options->ssh.keep_alive, std::chrono::milliseconds(2500));
}

TEST(Options, WorkerTimeoutDefaultsToFiveSecondsAndZeroTurnsItOff) {
  struct {
    std::vector<std::string> args;
    long long ms;
  } cases[] = {{{"./train"}, 5000}, {{"--worker-timeout", "1.5", "./train"}, 1500},
               {{"--worker-timeout=0", "./train"}, 0}, {{"--worker-timeout", "86400", "./train"}, 86400000}};
  for (const auto& c : cases) {
    auto r = parse(c.args);
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->options->worker_timeout, std::chrono::milliseconds(c.ms)) << c.args[0];
  }
}

TEST(Options, ElasticFlags) {
  auto r = parse({"--min-np", "2", "--max-np", "6", "--blacklist-cooldown-range", "0.5", "4", "-H", "a:4",
                  "--reset-limit", "3", "--rendezvous-timeout", "2.5", "./train", "--epochs", "9"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Options& o = *r->options;
  EXPECT_TRUE(o.elastic);
  EXPECT_EQ(o.min_np, 2);
  EXPECT_EQ(o.max_np, 6);
  ASSERT_TRUE(o.blacklist_cooldown);
  EXPECT_EQ(o.blacklist_cooldown->first, std::chrono::milliseconds(500));
  EXPECT_EQ(o.blacklist_cooldown->second, std::chrono::milliseconds(4000));
  EXPECT_EQ(o.reset_limit, 3);
  EXPECT_EQ(o.rendezvous_timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(o.command, (std::vector<std::string>{"./train", "--epochs", "9"}));
  auto d = parse({"--host-discovery-script", "./hosts.sh", "prog"});
  ASSERT_TRUE(d.ok()) << d.error();
  EXPECT_TRUE(d->options->elastic);
  EXPECT_EQ(d->options->discovery_script, "./hosts.sh");
}

TEST(Options, BadElasticFlags) {
  struct Case {
    std::vector<std::string> args;
    const char* why;
  } cases[] = {
      {{"--min-np", "0", "prog"}, "at least one"},
      {{"--min-np", "4", "--max-np", "2", "prog"}, "below --min-np"},
      {{"--blacklist-cooldown-range", "5", "1", "prog"}, "MIN <= MAX"},
      {{"--blacklist-cooldown-range", "0", "1", "prog"}, "0 < MIN"},
      {{"--discovery-interval", "0", "--min-np", "1", "prog"}, "positive"},
      // a positive value under a millisecond would be 0 ms: an instant timeout
      {{"--elastic-timeout", "0.0004", "--min-np", "1", "prog"}, "--elastic-timeout must be a positive number of "
                                                                   "seconds (at least 0.001)"},
      {{"--rendezvous-timeout", "0.0009", "--min-np", "1", "prog"}, "(at least 0.001)"},
      {{"--blacklist-cooldown-range", "0.0001", "0.0001", "prog"}, "MIN at least 0.001"},
      {{"--reset-limit", "-1", "--min-np", "1", "prog"}, "--reset-limit"},
      {{"--host-discovery-script", "x", "-H", "a", "prog"}, "not both"},
      // a fixed host list never grows: --min-np above its slots could only time out
      {{"--min-np", "3", "-H", "a:2", "prog"}, "--min-np 3 but the hosts offer only 2 slots (a fixed host list"},
      {{"-np", "2", "--min-np", "3", "prog"}, "--min-np 3 but the hosts offer only 2 slots"},
  };
  for (const auto& c : cases) {
    auto r = parse(c.args);
    ASSERT_FALSE(r.ok()) << c.args[0];
    EXPECT_NE(r.error().find(c.why), std::string::npos) << r.error();
  }
}

TEST(Options, ReportFdMustBeAnOpenStreamSocket) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  auto r = parse({"--report-fd", std::to_string(sv[0]), "prog"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->options->report_fd, sv[0]);
  EXPECT_EQ(parse({"prog"})->options->report_fd, -1);
  auto error = [](std::vector<std::string> args) {
    auto r = parse(std::move(args));
    return r.ok() ? std::string("accepted") : r.error();
  };
  EXPECT_EQ(error({"--report-fd", "three", "prog"}), "--report-fd 'three': expected a file descriptor number");
  EXPECT_EQ(error({"--report-fd", "-4", "prog"}), "--report-fd '-4': expected a file descriptor number");
  EXPECT_EQ(error({"--report-fd", "1", "prog"}), "--report-fd 1: standard input, output and error cannot carry reports");
  int closed = sv[1];
  ::close(closed);
  EXPECT_EQ(error({"--report-fd", std::to_string(closed), "prog"}),
            "--report-fd " + std::to_string(closed) + ": not an open file descriptor");
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  EXPECT_EQ(error({"--report-fd", std::to_string(p[0]), "prog"}),
            "--report-fd " + std::to_string(p[0]) + ": not a stream socket (give one end of a connected socket pair)");
  int dgram = ::socket(AF_UNIX, SOCK_DGRAM, 0);
  EXPECT_NE(error({"--report-fd", std::to_string(dgram), "prog"}).find("not a stream socket"), std::string::npos);
  for (int fd : {sv[0], p[0], p[1], dgram}) ::close(fd);
}

TEST(Options, HostDiscoveryFdIsAPipeOrStreamSocketAndMakesTheJobElastic) {
  int p[2], sv[2];
  ASSERT_EQ(::pipe(p), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  auto r = parse({"--host-discovery-fd", std::to_string(p[0]), "-np", "2", "prog"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Options& o = *r->options;
  EXPECT_EQ(o.discovery_fd, p[0]);
  EXPECT_TRUE(o.elastic);
  EXPECT_TRUE(o.discovered());
  EXPECT_TRUE(o.hosts.empty());  // they come from the feed
  EXPECT_EQ(o.min_np, 2);
  ASSERT_TRUE(parse({"--host-discovery-fd", std::to_string(sv[0]), "prog"}).ok());
  EXPECT_EQ(parse({"prog"})->options->discovery_fd, -1);
  auto error = [](std::vector<std::string> args) {
    auto r = parse(std::move(args));
    return r.ok() ? std::string("accepted") : r.error();
  };
  std::string fd = std::to_string(p[0]);
  EXPECT_EQ(error({"--host-discovery-fd", "x", "prog"}), "--host-discovery-fd 'x': expected a file descriptor number");
  EXPECT_EQ(error({"--host-discovery-fd", "0", "prog"}),
            "--host-discovery-fd 0: standard input, output and error cannot carry host lists");
  EXPECT_EQ(error({"--host-discovery-fd", fd, "-H", "a:1", "prog"}), "give --host-discovery-fd or -H/--hostfile, not both");
  EXPECT_EQ(error({"--host-discovery-fd", fd, "--host-discovery-script", "/bin/true", "prog"}),
            "give --host-discovery-script or --host-discovery-fd, not both");
  EXPECT_EQ(error({"--host-discovery-fd", std::to_string(sv[0]), "--report-fd", std::to_string(sv[0]), "prog"}),
            "--host-discovery-fd and --report-fd are both " + std::to_string(sv[0]) + ": give each a descriptor of its own");
  int file = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(error({"--host-discovery-fd", std::to_string(file), "prog"}),
            "--host-discovery-fd " + std::to_string(file) + ": not a pipe or a stream socket");
  for (int f : {p[0], p[1], sv[0], sv[1], file}) ::close(f);
}

TEST(Options, HelpAndVersionPrint) {
  auto h = parse({"--help"});
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->options);
  EXPECT_NE(h->print.find("--hostfile"), std::string::npos);
  auto v = parse({"--version"});
  ASSERT_TRUE(v.ok());
  EXPECT_NE(v->print.find("elasticrun "), std::string::npos);
}

// Sets Slurm's variables for one test and removes them after it.
struct SlurmEnv {
  SlurmEnv(std::initializer_list<std::pair<const char*, const char*>> vars) : vars_(vars) {
    for (auto& [k, v] : vars_) ::setenv(k, v, 1);
  }
  ~SlurmEnv() {
    for (auto& [k, v] : vars_) ::unsetenv(k);
  }
  std::vector<std::pair<const char*, const char*>> vars_;
};

// A directory with an executable `srun`, first in PATH while the test runs.
struct FakePath {
  FakePath() : old_(std::getenv("PATH") ? std::getenv("PATH") : "") {
    char tmpl[] = "/tmp/er-srun-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    std::ofstream(dir_ + "/srun") << "#!/bin/sh\n";
    ::chmod((dir_ + "/srun").c_str(), 0755);
    ::setenv("PATH", (dir_ + ":" + old_).c_str(), 1);
  }
  ~FakePath() {
    ::setenv("PATH", old_.c_str(), 1);
    std::remove((dir_ + "/srun").c_str());
    ::rmdir(dir_.c_str());
  }
  std::string old_, dir_;
};

TEST(Options, InsideASlurmAllocationItsNodesAreTheHostsAndSrunStartsTheDaemons) {
  FakePath path;
  SlurmEnv env({{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "node[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}});
  auto r = parse({"prog"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Options& o = *r->options;
  EXPECT_EQ(o.hosts, (std::vector<discovery::Host>{{"node1", 2}, {"node2", 2}, {"node3", 1}}));
  EXPECT_TRUE(o.slurm_hosts);
  EXPECT_EQ(o.np, 5);
  EXPECT_EQ(o.launcher, Options::Launcher::srun);
  EXPECT_EQ(o.srun_path, path.dir_ + "/srun");
  // -H wins over the allocation; --launcher ssh over srun
  r = parse({"-H", "a:1", "--launcher", "ssh", "prog"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->options->hosts, (std::vector<discovery::Host>{{"a", 1}}));
  EXPECT_FALSE(r->options->slurm_hosts);
  EXPECT_EQ(r->options->launcher, Options::Launcher::ssh);
}

TEST(Options, OutsideAnAllocationSshUnlessSrunIsAskedFor) {
  auto r = parse({"-H", "a:1,b:1", "prog"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->options->launcher, Options::Launcher::ssh);
  EXPECT_EQ(r->options->hosts, (std::vector<discovery::Host>{{"a", 1}, {"b", 1}}));
  FakePath path;
  r = parse({"--launcher", "srun", "-H", "a:1", "prog"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->options->launcher, Options::Launcher::srun);
}

TEST(Options, BadSlurmEnvironmentsAndLaunchersAreClearErrors) {
  {
    SlurmEnv env({{"SLURM_JOB_NODELIST", "node[1-3"}});
    auto r = parse({"prog"});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().find("in a Slurm allocation: SLURM_JOB_NODELIST: hostlist 'node[1-3'"), std::string::npos)
        << r.error();
  }
  {
    SlurmEnv env({{"SLURM_JOB_NODELIST", "node[1-3]"}, {"SLURM_TASKS_PER_NODE", "1(x2)"}});
    auto r = parse({"prog"});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().find("counts 2 nodes, SLURM_JOB_NODELIST 3"), std::string::npos) << r.error();
  }
  {
    SlurmEnv env({{"SLURM_JOB_ID", "42"}});
    const std::string old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
    ::setenv("PATH", "/nonexistent", 1);
    auto r = parse({"-H", "a:1", "prog"});
    ::setenv("PATH", old_path.c_str(), 1);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().find("srun is not in PATH: give --launcher ssh"), std::string::npos) << r.error();
  }
  auto r = parse({"--launcher", "pbs", "prog"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--launcher 'pbs': use auto, ssh or srun"), std::string::npos) << r.error();
}

TEST(Options, NpDefaultsToEverySlotOffered) {
  auto r = parse({"-H", "a:2,b:3", "prog"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->options->np, 5);
}

}  // namespace
}  // namespace elasticrun::cmd

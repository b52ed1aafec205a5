// The script source against real scripts: good output, failures, hangs (and that the
// whole process group is gone afterwards), garbage, oversize output, bad paths.
#include "discovery/host_source.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

namespace elasticrun::discovery {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;
using Hosts = std::vector<Host>;

class ScriptSourceTest : public ::testing::Test {
 protected:
  // Runs `body` as a script with the given options and returns its one answer.
  Result<Hosts> run_script(const std::string& body, ScriptOptions opt = {}) {
    opt.path = testing::write_script(dir_, "discover.sh", body);
    auto src = make_script_source(io_, opt);
    auto got = testing::poll_once(io_, *src, 10s);
    if (!got) return fail("no answer within 10 s");
    return std::move(*got);
  }
  std::string error_of(const std::string& body, ScriptOptions opt = {}) {
    auto r = run_script(body, std::move(opt));
    EXPECT_FALSE(r.ok());
    return r ? std::string{} : r.error();
  }
  // Every script we started, and every failed launch, has been reaped.
  void TearDown() override {
    bool clean = testing::run_until(io_, [] { return testing::zombie_children().empty(); }, 3s);
    EXPECT_TRUE(clean) << testing::zombie_children().size() << " unreaped children";
  }
  int read_pid(const std::string& name) { return std::stoi(testing::read_file(dir_.file(name))); }

  boost::asio::io_context io_;
  TempDir dir_;
};

TEST_F(ScriptSourceTest, GoodScript) {
  auto r = run_script("#!/bin/sh\necho 127.0.0.1:2\necho 127.0.0.2:4\n");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(*r, (Hosts{{"127.0.0.1", 2}, {"127.0.0.2", 4}}));
}

TEST_F(ScriptSourceTest, CommentsBlanksCrlfAndDefaultSlots) {
  ScriptOptions opt;
  opt.default_slots = 3;
  auto r = run_script("#!/bin/sh\nprintf '# hosts\\r\\n\\r\\nnode1\\r\\nnode2:1 # small\\r\\nnode3 slots=5'\n", opt);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(*r, (Hosts{{"node1", 3}, {"node2", 1}, {"node3", 5}}));
}

TEST_F(ScriptSourceTest, EmptyOutputIsZeroHosts) {
  auto r = run_script("#!/bin/sh\nexit 0\n");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_TRUE(r->empty());
}

TEST_F(ScriptSourceTest, FailingScriptReportsCodeAndStderr) {
  std::string e = error_of("#!/bin/sh\necho a:1\necho 'cannot reach the API server' >&2\nexit 3\n");
  EXPECT_EQ(e, "discovery script exited with code 3: cannot reach the API server");
}

TEST_F(ScriptSourceTest, StderrKeepsOnlyItsTail) {
  std::string e = error_of("#!/bin/sh\nyes noise | head -c 100000 >&2\necho THE-END >&2\nexit 1\n");
  EXPECT_NE(e.find("exited with code 1: ..."), std::string::npos) << e.substr(0, 100);
  EXPECT_NE(e.find("THE-END"), std::string::npos);
  EXPECT_LT(e.size(), 2200u);
}

TEST_F(ScriptSourceTest, KilledBySignalIsNotAnExitCode) {
  std::string e = error_of("#!/bin/sh\nkill -9 $$\n");
  EXPECT_NE(e.find("discovery script killed by signal 9"), std::string::npos) << e;
}

TEST_F(ScriptSourceTest, HangingScriptTimesOutAndItsGroupIsGone) {
  ScriptOptions opt;
  opt.timeout = 1s;  // a loaded CI machine can take 300 ms to start a shell
  auto start = std::chrono::steady_clock::now();
  std::string e = error_of("#!/bin/sh\necho $$ > " + dir_.file("pid") + "\nsleep 100 &\necho $! > " +
                               dir_.file("child") + "\nsleep 100\n",
                           opt);
  EXPECT_EQ(e, "discovery script timed out after 1.0 s");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  int pid = read_pid("pid"), child = read_pid("child");
  // Our own pid is reaped by the source on SIGCHLD; the forked sleep by init.
  EXPECT_TRUE(testing::run_until(io_, [&] { return testing::process_gone(pid); }, 3s));
  EXPECT_TRUE(testing::wait_gone(child));
}

TEST_F(ScriptSourceTest, BackgroundLeftoversDoNotHoldThePoll) {
  // The script exits at once but leaves a child holding stdout; it must not block the poll.
  auto start = std::chrono::steady_clock::now();
  auto r = run_script("#!/bin/sh\necho a:1\nsleep 100 &\necho $! > " + dir_.file("child") + "\n");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(*r, (Hosts{{"a", 1}}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_TRUE(testing::wait_gone(read_pid("child")));
}

TEST_F(ScriptSourceTest, GarbageNamesTheLine) {
  std::string e = error_of("#!/bin/sh\nprintf 'a:1\\n\\000\\001\\377garbage\\n'\n");
  EXPECT_EQ(e, "discovery script output, line 2: not text: byte 0x00 at column 1");
  e = error_of("#!/bin/sh\nprintf 'a:1\\nb:2\\n\\nc:x\\n'\n");
  EXPECT_EQ(e, "discovery script output, line 4: slots 'x' is not a number");
}

TEST_F(ScriptSourceTest, HugeLineWithinTheCapIsALineError) {
  ScriptOptions opt;
  opt.max_output = 4 << 20;
  std::string e = error_of("#!/bin/sh\nhead -c 2000000 /dev/zero | tr '\\0' a\n", opt);
  EXPECT_NE(e.find("line 1: longer than 1024 characters"), std::string::npos) << e.substr(0, 200);
}

TEST_F(ScriptSourceTest, OversizeOutputKillsTheScript) {
  auto start = std::chrono::steady_clock::now();
  std::string e = error_of("#!/bin/sh\necho $$ > " + dir_.file("pid") + "\nyes | head -c 5000000\nsleep 100\n");
  EXPECT_EQ(e, "discovery script output exceeds 1 MiB (script killed)");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  int pid = read_pid("pid");
  EXPECT_TRUE(testing::run_until(io_, [&] { return testing::process_gone(pid); }, 3s));
}

TEST_F(ScriptSourceTest, MissingScript) {
  ScriptOptions opt;
  opt.path = dir_.file("nope.sh");
  auto src = make_script_source(io_, opt);
  auto r = testing::poll_once(io_, *src);
  ASSERT_TRUE(r && !r->ok());
  EXPECT_EQ(r->error(), "discovery script '" + opt.path + "': No such file or directory");
}

TEST_F(ScriptSourceTest, NotExecutableScript) {
  ScriptOptions opt;
  opt.path = testing::write_script(dir_, "plain.sh", "#!/bin/sh\necho a\n", 0644);
  auto src = make_script_source(io_, opt);
  auto r = testing::poll_once(io_, *src);
  ASSERT_TRUE(r && !r->ok());
  EXPECT_EQ(r->error(), "discovery script '" + opt.path + "' is not executable");
}

TEST_F(ScriptSourceTest, BadInterpreterIsAClearError) {
  std::string e = error_of("#!/nonexistent/interpreter\necho a\n");
  EXPECT_NE(e.find("cannot run discovery script"), std::string::npos) << e;
  EXPECT_NE(e.find("interpreter missing"), std::string::npos) << e;
  std::string noexec = error_of("no shebang line\n");
  EXPECT_NE(noexec.find("Exec format error"), std::string::npos) << noexec;
}

TEST_F(ScriptSourceTest, CancelKillsAndDropsTheCallback) {
  ScriptOptions opt;
  opt.path = testing::write_script(dir_, "slow.sh", "#!/bin/sh\necho $$ > " + dir_.file("pid") + "\nexec sleep 100\n");
  auto src = make_script_source(io_, opt);
  bool called = false;
  src->poll([&](Result<Hosts>) { called = true; });
  ASSERT_TRUE(testing::run_until(io_, [&] { return testing::read_file(dir_.file("pid")).size() > 1; }));
  int pid = read_pid("pid");
  src->cancel();
  EXPECT_TRUE(testing::run_until(io_, [&] { return testing::process_gone(pid); }, 3s));
  EXPECT_FALSE(called);
  // The source can poll again after a cancel.
  opt.path = testing::write_script(dir_, "ok.sh", "#!/bin/sh\necho b:2\n");
  auto src2 = make_script_source(io_, opt);
  auto r = testing::poll_once(io_, *src2);
  ASSERT_TRUE(r && r->ok());
}

TEST_F(ScriptSourceTest, CancelDropsAnAnswerAlreadyQueued) {
  ScriptOptions opt;
  opt.path = dir_.file("missing.sh");
  auto src = make_script_source(io_, opt);
  bool called = false;
  src->poll([&](Result<Hosts>) { called = true; });  // fails at once, answer posted
  src->cancel();
  io_.poll();
  EXPECT_FALSE(called);
}

TEST_F(ScriptSourceTest, DestroyingASourceMidPollLeavesNoProcess) {
  ScriptOptions opt;
  opt.path = testing::write_script(dir_, "slow.sh", "#!/bin/sh\necho $$ > " + dir_.file("pid") + "\nexec sleep 100\n");
  auto src = make_script_source(io_, opt);
  src->poll([](Result<Hosts>) { ADD_FAILURE() << "callback after destruction"; });
  ASSERT_TRUE(testing::run_until(io_, [&] { return testing::read_file(dir_.file("pid")).size() > 1; }));
  int pid = read_pid("pid");
  src.reset();
  io_.poll();  // the aborted handlers run now and must not touch the dead source
  EXPECT_TRUE(testing::wait_gone(pid));
}

TEST_F(ScriptSourceTest, DoesNotReapOtherChildren) {
  // Another component's child: the source must leave its exit status alone.
  pid_t other = ::fork();
  if (other == 0) ::_exit(7);
  auto r = run_script("#!/bin/sh\necho a:1\n");
  ASSERT_TRUE(r.ok()) << r.error();
  int status = 0;
  ASSERT_EQ(::waitpid(other, &status, 0), other);
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

TEST_F(ScriptSourceTest, StaticSourceAnswersItsList) {
  auto src = make_static_source(io_, {{"a", 2}});
  auto r = testing::poll_once(io_, *src);
  ASSERT_TRUE(r && r->ok());
  EXPECT_EQ(**r, (Hosts{{"a", 2}}));
}

}  // namespace
}  // namespace elasticrun::discovery

// Hosts from a Slurm allocation's environment: the hostlist and tasks-per-node syntaxes as
// salloc and sbatch write them, and every malformed value refused with its reason.
#include "discovery/slurm.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace elasticrun {
namespace {

using discovery::Host;
using Names = std::vector<std::string>;

TEST(SlurmHostlist, ExpandsRangesListsAndPadding) {
  struct Case {
    const char* in;
    Names want;
  } cases[] = {
      {"n1", {"n1"}},
      {"n[1-3]", {"n1", "n2", "n3"}},
      {"n[01-03,7]", {"n01", "n02", "n03", "n7"}},  // each range its own width, as in Slurm
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      {"gpu-[1-2]-ib,login", {"gpu-1-ib", "gpu-2-ib", "login"}},
      {"r[1-2]n[1-2]", {"r1n1", "r1n2", "r2n1", "r2n2"}},
      {"a,b[3],c[0-0]", {"a", "b3", "c0"}},
      {"h1.example.org,h[2-3].example.org", {"h1.example.org", "h2.example.org", "h3.example.org"}},
  };
  for (const auto& c : cases) {
    auto h = discovery::expand_hostlist(c.in);
    ASSERT_TRUE(h.ok()) << c.in << ": " << h.error();
    EXPECT_EQ(*h, c.want) << c.in;
  }
}

TEST(SlurmHostlist, RefusesMalformedListsWithAReason) {
  struct Case {
    const char* in;
    const char* why;
  } cases[] = {
      {"", "empty entry"},          {"a,,b", "empty entry"},         {"n[1-3", "'[' without ']'"},
      {"n1-3]", "']' without '['"}, {"n[[1]]", "nested"},            {"n[3-1]", "goes down"},
      {"n[a-b]", "not a number"},   {"n[]", "not a number"},         {"n[1-]", "not a number"},
      {"n[-1]", "not a number"},    {"bad host", "not a host name"}, {"n[0-70000]", "more than 65536 hosts"},
      {"a[0-300]b[0-300]", "more than 65536 hosts"},
  };
  for (const auto& c : cases) {
    auto h = discovery::expand_hostlist(c.in);
    ASSERT_FALSE(h.ok()) << c.in;
    EXPECT_NE(h.error().find(c.why), std::string::npos) << c.in << " -> " << h.error();
  }
}

TEST(SlurmTasksPerNode, ExpandsRepeats) {
  auto t = discovery::expand_tasks_per_node("2(x3),1,4(x1)");
  ASSERT_TRUE(t.ok()) << t.error();
  EXPECT_EQ(*t, (std::vector<int>{2, 2, 2, 1, 4}));
  for (const char* bad : {"", "0", "2(x0)", "2(3)", "2(x)", "x", "2(x3", "5000", "1(x70000)", "2,,1"})
    EXPECT_FALSE(discovery::expand_tasks_per_node(bad).ok()) << bad;
}

struct Env {
  std::map<std::string, std::string> vars;
  discovery::GetEnv get() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(SlurmAllocation, NoneOutsideAnAllocation) {
  Env env{{{"SLURM_TASKS_PER_NODE", "2"}}};
  auto a = discovery::slurm_allocation(env.get(), 1);
  ASSERT_TRUE(a.ok()) << a.error();
  EXPECT_FALSE(a->has_value());
}

TEST(SlurmAllocation, SlotsFromTasksPerNodeThenNtasksPerNodeThenTheDefault) {
  Env env{{{"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}, {"SLURM_NTASKS_PER_NODE", "8"}}};
  auto a = discovery::slurm_allocation(env.get(), 1);
  ASSERT_TRUE(a.ok()) << a.error();
  EXPECT_EQ(**a, (std::vector<Host>{{"n1", 2}, {"n2", 2}, {"n3", 1}}));
  env.vars.erase("SLURM_TASKS_PER_NODE");
  a = discovery::slurm_allocation(env.get(), 1);
  ASSERT_TRUE(a.ok()) << a.error();
  EXPECT_EQ(**a, (std::vector<Host>{{"n1", 8}, {"n2", 8}, {"n3", 8}}));
  env.vars.erase("SLURM_NTASKS_PER_NODE");
  env.vars["SLURM_JOB_NODELIST"] = "";
  env.vars["SLURM_NODELIST"] = "old[1-2]";  // Slurm's older name, when the new one is empty
  a = discovery::slurm_allocation(env.get(), 3);
  ASSERT_TRUE(a.ok()) << a.error();
  EXPECT_EQ(**a, (std::vector<Host>{{"old1", 3}, {"old2", 3}}));
}

TEST(SlurmAllocation, RefusesAnEnvironmentThatDoesNotAddUp) {
  struct Case {
    std::map<std::string, std::string> vars;
    const char* why;
  } cases[] = {
      {{{"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}}, "counts 2 nodes, SLURM_JOB_NODELIST 3"},
      {{{"SLURM_JOB_NODELIST", "n[1-2"}}, "SLURM_JOB_NODELIST: hostlist"},
      {{{"SLURM_JOB_NODELIST", "n1"}, {"SLURM_TASKS_PER_NODE", "0"}}, "SLURM_TASKS_PER_NODE"},
      {{{"SLURM_JOB_NODELIST", "n1"}, {"SLURM_NTASKS_PER_NODE", "many"}}, "SLURM_NTASKS_PER_NODE 'many'"},
      {{{"SLURM_JOB_NODELIST", "n1,n[1-2]"}}, "'n1' is listed twice"},
  };
  for (const auto& c : cases) {
    Env env{c.vars};
    auto a = discovery::slurm_allocation(env.get(), 1);
    ASSERT_FALSE(a.ok()) << c.why;
    EXPECT_NE(a.error().find(c.why), std::string::npos) << a.error();
  }
}

}  // namespace
}  // namespace elasticrun

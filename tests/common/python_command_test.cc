#include "common/python_command.h"

#include <gtest/gtest.h>

using namespace elasticrun;
using Mode = PythonCommand::Mode;
using Args = std::vector<std::string>;

TEST(PythonCommand, KnowsTheInterpretersByTheirFileName) {
  for (const char* p : {"python", "python3", "python3.11", "/usr/bin/python3", "./venv/bin/python", "python3.9"})
    EXPECT_TRUE(is_python_interpreter(p)) << p;
  for (const char* p : {"python2", "python3.", "python3.x", "ipython", "/usr/bin/env", "python3-config", "pythonw", ""})
    EXPECT_FALSE(is_python_interpreter(p)) << p;
}

TEST(PythonCommand, ReadsTheThreeWaysIn) {
  auto s = parse_python_command({"/usr/bin/python3", "train.py", "--lr", "0.1"});
  ASSERT_TRUE(s) << s.error();
  EXPECT_EQ(s->mode, Mode::script);
  EXPECT_EQ(s->target, "train.py");
  EXPECT_EQ(s->args, (Args{"--lr", "0.1"}));
  EXPECT_TRUE(s->options.empty());
  auto m = parse_python_command({"python3", "-m", "pkg.main", "-x"});
  ASSERT_TRUE(m) << m.error();
  EXPECT_EQ(m->mode, Mode::module);
  EXPECT_EQ(m->target, "pkg.main");
  EXPECT_EQ(m->args, (Args{"-x"}));
  auto c = parse_python_command({"python3", "-c", "print(1)", "a"});
  ASSERT_TRUE(c) << c.error();
  EXPECT_EQ(c->mode, Mode::code);
  EXPECT_EQ(c->target, "print(1)");
  EXPECT_EQ(c->args, (Args{"a"}));
  auto dashed = parse_python_command({"python3", "--", "-odd.py", "x"});
  ASSERT_TRUE(dashed) << dashed.error();
  EXPECT_EQ(dashed->target, "-odd.py");
  EXPECT_EQ(dashed->args, (Args{"x"}));
}

TEST(PythonCommand, KeepsTheInterpreterOptionsAsGiven) {
  auto p = parse_python_command({"python3", "-u", "-W", "ignore", "-Xdev", "-Bc", "pass", "arg"});
  ASSERT_TRUE(p) << p.error();
  EXPECT_EQ(p->options, (Args{"-u", "-W", "ignore", "-Xdev", "-B"}));
  EXPECT_EQ(p->mode, Mode::code);
  EXPECT_EQ(p->target, "pass");
  EXPECT_EQ(p->args, (Args{"arg"}));
  auto glued = parse_python_command({"python3", "-OOmmod"});
  ASSERT_TRUE(glued) << glued.error();
  EXPECT_EQ(glued->options, (Args{"-OO"}));
  EXPECT_EQ(glued->mode, Mode::module);
  EXPECT_EQ(glued->target, "mod");
}

TEST(PythonCommand, SaysWhyARunIsNotOneTheServerCanMake) {
  struct Case {
    Args argv;
    const char* why;
  } cases[] = {
      {{"/bin/echo", "hi"}, "'/bin/echo' is not a Python interpreter"},
      {{"python3"}, "no script, -m MODULE or -c CODE"},
      {{"python3", "-u"}, "no script, -m MODULE or -c CODE"},
      {{"python3", "-i", "x.py"}, "'-i' is not an interpreter option"},
      {{"python3", "-ux", "x.py"}, "'-x' is not an interpreter option"},
      {{"python3", "--version"}, "'--version' is not an interpreter option"},
      {{"python3", "-"}, "standard input"},
      {{"python3", "--", "-"}, "standard input"},
      {{"python3", "--"}, "no script after '--'"},
      {{"python3", "-m"}, "'-m' without its argument"},
      {{"python3", "-W"}, "'-W' without its argument"},
  };
  for (const auto& c : cases) {
    auto r = parse_python_command(c.argv);
    ASSERT_FALSE(r) << c.argv.back();
    EXPECT_NE(r.error().find(c.why), std::string::npos) << r.error();
  }
}

TEST(PythonCommand, ModuleNamesAreDottedIdentifiers) {
  for (const char* n : {"torch", "torch.distributed", "_x", "a1.b_2", "A.B.C"}) EXPECT_TRUE(is_dotted_module_name(n)) << n;
  for (const char* n : {"", ".", "a.", ".a", "a..b", "1a", "a.1b", "a-b", "a b", "torch,numpy", "a/b", "\xc3\xa9"})
    EXPECT_FALSE(is_dotted_module_name(n)) << n;
}

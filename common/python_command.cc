#include "common/python_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace elasticrun {
namespace {

// Interpreter options that only set a flag (sys.flags) and those that take a value; a
// server started with them behaves as a worker started with them.
constexpr std::string_view kFlags = "bBdEIOPqRsSuv";
constexpr std::string_view kValued = "WX";

bool is_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

}  // namespace

bool is_python_interpreter(std::string_view program) {
  std::string name = std::filesystem::path(program).filename().string();
  if (name == "python" || name == "python3") return true;
  return name.starts_with("python3.") && is_digits(std::string_view(name).substr(8));
}

// Reads argv as CPython's getopt does: single-letter options may be grouped ("-uB"), a
// value may follow its letter ("-Wignore") or be the next word, and -c, -m or the first
// word that is not an option ends the interpreter's options.
Result<PythonCommand> parse_python_command(const std::vector<std::string>& argv) {
  if (argv.empty()) return fail("no command");
  if (!is_python_interpreter(argv[0]))
    return fail(fmt::format("'{}' is not a Python interpreter (python, python3 or python3.N)", argv[0]));
  PythonCommand c;
  c.interpreter = argv[0];
  std::size_t i = 1;
  auto finish = [&](PythonCommand::Mode mode, std::string target) -> Result<PythonCommand> {
    c.mode = mode;
    c.target = std::move(target);
    c.args.assign(argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
    return c;
  };
  for (; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--") {
      if (++i == argv.size()) return fail("no script after '--'");
      std::string script = argv[i++];
      if (script == "-") return fail("the script comes from standard input");
      return finish(PythonCommand::Mode::script, std::move(script));
    }
    if (a == "-") return fail("the script comes from standard input");
    if (a.size() < 2 || a[0] != '-') {
      ++i;
      return finish(PythonCommand::Mode::script, a);
    }
    if (a[1] == '-') return fail(fmt::format("'{}' is not an interpreter option the fork server can take on", a));
    c.options.push_back(a);
    for (std::size_t k = 1; k < a.size(); ++k) {
      char o = a[k];
      if (kFlags.find(o) != std::string_view::npos) continue;
      bool ends = o == 'c' || o == 'm';
      if (!ends && kValued.find(o) == std::string_view::npos)
        return fail(fmt::format("'-{}' is not an interpreter option the fork server can take on", o));
      // The value: the rest of this word, else the next one.
      std::string value = a.substr(k + 1);
      if (value.empty()) {
        if (i + 1 == argv.size()) return fail(fmt::format("'-{}' without its argument", o));
        value = argv[++i];
        if (!ends) c.options.push_back(value);
      }
      if (ends) {
        // The mode is not an interpreter option: keep only what came before it.
        std::string before = a.substr(0, k);
        c.options.pop_back();
        if (before != "-") c.options.push_back(before);
        ++i;
        return finish(o == 'c' ? PythonCommand::Mode::code : PythonCommand::Mode::module, std::move(value));
      }
      break;  // the value took the rest of the word
    }
  }
  return fail("no script, -m MODULE or -c CODE");
}

bool is_dotted_module_name(std::string_view name) {
  if (name.empty()) return false;
  bool start = true;  // at the first character of an identifier
  for (char ch : name) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '.') {
      if (start) return false;
      start = true;
      continue;
    }
    bool ok = std::isalpha(c) || c == '_' || (!start && std::isdigit(c));
    if (c >= 0x80 || !ok) return false;
    start = false;
  }
  return !start;
}

}  // namespace elasticrun

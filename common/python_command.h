// A worker command read as a Python run, for the fork server (elasticrun --preload):
// the driver says whether --preload applies to the job's command, the daemon decides
// which workers the fork server starts and with which interpreter options it runs.
//
// The fork server runs exactly the three ways a script enters Python, after interpreter
// options that it can take on itself (it is started with the same ones):
//
//   python[3[.N]] [-bBdEIOPqRsSuv] [-W ARG] [-X OPT] (SCRIPT | -m MODULE | -c CODE) [ARGS...]
//
// Anything else (-i, -x, a script on stdin, --help, unknown options) is run as it is
// now, by exec, because the server could not reproduce what the interpreter would do.
#pragma once

#include "common/result.h"

#include <string>
#include <string_view>
#include <vector>

namespace elasticrun {

struct PythonCommand {
  enum class Mode { script, module, code };
  std::string interpreter;           // argv[0] as given
  std::vector<std::string> options;  // the interpreter options before the mode, as given
  Mode mode = Mode::script;
  std::string target;                // the script's path, the module's name, or the code
  std::vector<std::string> args;     // what follows it: sys.argv[1:]
};

// Whether `program`'s file name is python, python3 or python3.N.
bool is_python_interpreter(std::string_view program);

// The command as a run the fork server can make, or why it is not one ("'-i' is not an
// option the fork server can take on").
Result<PythonCommand> parse_python_command(const std::vector<std::string>& argv);

// Whether `name` is a dotted module name: identifiers (ASCII letters, digits, '_', not
// starting with a digit) joined by single dots.
bool is_dotted_module_name(std::string_view name);

}  // namespace elasticrun

// Finding a program the way execvp would, with a clear reason when it cannot be run.
#pragma once

#include "common/result.h"

#include <string>

namespace elasticrun {

// `program` as is if it contains a '/', else the first match in `path` (a PATH value;
// empty entries mean "."). The result is an executable regular file.
Result<std::string> find_executable(const std::string& program, const std::string& path);

}  // namespace elasticrun

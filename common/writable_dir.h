// A directory this process can write in, made if missing (elasticrun --checkpoint-dir
// checks its checkpoint directory with it before the job starts).
#pragma once

#include "common/result.h"

#include <string>

namespace elasticrun {

// Makes `dir` (and its parents) if missing and writes, fsyncs and removes a file in it;
// the error names the step and the reason.
Result<void> check_writable_dir(const std::string& dir);

}  // namespace elasticrun

// Command-line parsing shared by elasticrun and elasticrund (Boost.Program_options).
// Header-only: only the two binaries include it, and the library that training
// processes link must not depend on program_options.
#pragma once

#include "common/result.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace elasticrun::cli {

// Parses `args` (without the program name) against `desc`: unix style, no guessing of
// abbreviated option names. A refused option or value is a message naming it.
//
// Boost 1.74's error_with_option_name::what() substitutes "%value%" (and friends) in a
// loop that never ends when the user's text itself contains the placeholder: "--np
// %value%" hung elasticrun, "--job-pad-fd %value%" elasticrund. Only text with a '%' can
// do that; such text gets a message without the value.
inline Result<boost::program_options::variables_map> parse(const std::vector<std::string>& args,
                                                           const boost::program_options::options_description& desc) {
  namespace po = boost::program_options;
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args)
                  .options(desc)
                  .style(po::command_line_style::unix_style ^ po::command_line_style::allow_guessing)
                  .run(),
              vm);
    po::notify(vm);
  } catch (const po::error_with_option_name& e) {
    bool percent = std::any_of(args.begin(), args.end(), [](const std::string& s) { return s.find('%') != std::string::npos; });
    if (percent) return fail("invalid option or value for '" + e.get_option_name() + "'");
    return fail(e.what());
  } catch (const po::error& e) {
    return fail(e.what());
  }
  return vm;
}

}  // namespace elasticrun::cli

// Running an io_context until something happened, always with a deadline.
#pragma once

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <functional>
#include <thread>

namespace elasticrun::testing {

inline bool run_until(boost::asio::io_context& io, const std::function<bool()>& done,
                      std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    io.restart();
    if (io.run_for(std::chrono::milliseconds(10)) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace elasticrun::testing

// rendezvous_scale's simulated workers, and what its two processes share.
#pragma once

#include "rendezvous/assignment.h"

#include <string>
#include <utility>
#include <vector>

namespace rendezvous_bench {

[[noreturn]] void die(const std::string& what);
// Raises the soft open-file limit to `want`, or dies naming the hard limit.
void raise_fd_limit(long want);
std::string host_name(int h);
// Worker g's place: g = 0 is alone on host "v" (the one the recovery loses); the others
// fill hosts "h0", "h1", ... of `slots` slots each.
std::pair<std::string, int> place_of(int g, int slots);
std::vector<elasticrun::rendezvous::HostSlots> hosts_of(int n, int slots, bool with_v);
// The child process: workers first..first+count-1, commands on stdin ("go", "kill",
// "exit"), progress on stdout ("round <reconnects>", "recovered").
int run_clients(int port, const std::string& secret_hex, int first, int count, int slots);

}  // namespace rendezvous_bench

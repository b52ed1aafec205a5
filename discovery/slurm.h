// Hosts from a Slurm allocation: the environment that salloc, sbatch and srun give a job
// (SLURM_JOB_NODELIST in Slurm's compressed hostlist syntax, SLURM_TASKS_PER_NODE).
//
// The environment is untrusted text like any host list: every problem is a Result error
// naming the variable and what is wrong, and expansions are bounded (kMaxSlurmNodes).
#pragma once

#include "common/result.h"
#include "discovery/hosts.h"

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace elasticrun::discovery {

inline constexpr std::size_t kMaxSlurmNodes = 65536;

// Slurm's hostlist syntax: "n[01-03,7],gpu-[1-2]-ib,login" is n01 n02 n03 n7 gpu-1-ib
// gpu-2-ib login. A range keeps the width of its lower bound ("01-03"); a name may have
// several bracket groups (each expands in turn, the last varying fastest).
Result<std::vector<std::string>> expand_hostlist(std::string_view list);

// SLURM_TASKS_PER_NODE's syntax: "2(x3),1" is 2 2 2 1.
Result<std::vector<int>> expand_tasks_per_node(std::string_view list);

// Reads a variable of the environment (nullptr: unset); std::getenv by default.
using GetEnv = std::function<const char*(const char*)>;

// The hosts of the Slurm allocation this process runs in, with their slots, or nullopt
// outside one (no SLURM_JOB_NODELIST, nor the older SLURM_NODELIST). Slots per node:
// SLURM_TASKS_PER_NODE (one entry per node; it must match the node count), else
// SLURM_NTASKS_PER_NODE, else `default_slots`.
Result<std::optional<std::vector<Host>>> slurm_allocation(const GetEnv& getenv, int default_slots);

}  // namespace elasticrun::discovery

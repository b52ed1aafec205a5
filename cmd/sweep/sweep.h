// `elasticrun sweep`: hyperparameter search over elastic trials sharing one pool.
//
// The sweep samples the trials' configurations from the space, and runs each trial as an
// elastic job of its own (a child elasticrun, see trial_job.h) on its share of the pool:
// a trial starts when --trial-np's MIN slots are free; slots that no waiting trial can
// use go to running trials, best first, up to MAX, by changing their discovery output
// (they grow elastically, without a restart); a trial that ends gives its slots back at
// once. Rank 0's reports come in over each trial's --report-fd, are logged in the
// experiment directory, and are answered with the scheduler's decision (continue, stop,
// or under pbt stop-and-continue-from-another-trial's-checkpoint). A host a trial
// blacklists leaves the pool. Everything needed to --resume is on disk (experiment.h).
#pragma once

#include "cmd/sweep/sweep_options.h"

namespace elasticrun::sweep {

// Runs the sweep to its end; the process's exit status.
int run_sweep(SweepOptions options);

// `elasticrun sweep ...`: argv[0] is "sweep".
int sweep_main(int argc, const char* const* argv);

}  // namespace elasticrun::sweep

// trial_objective: the C++ trial program of `elasticrun sweep`. A synthetic objective
// with a known optimum, trained elastically, reported every few steps, stopped when
// the driver says so, checkpointed into the trial's directory.
//
//   ELASTICRUN_TRIAL_CONFIG='{"lr":0.1,"momentum":0.9}'
//     elasticrun -np 2 build/examples/trial_objective --steps 200 --report-every 10
//
// The configuration (JSON, every key optional) sets lr (default 0.01) and momentum
// (default 0.5). The loss at step s is
//
//   loss(s) = q + exp(-s / 50),   q = (log10(lr) + 1)^2 + (momentum - 0.9)^2
//
// so the optimum is lr = 0.1, momentum = 0.9 (q = 0), and the ranking of two
// configurations is the same at every step (what ASHA's early cut relies on). Each rank
// computes its share of the loss and an allreduce sums them, so the workers do a
// collective per step whatever their number.
//
// Every --report-every steps (and at the last) every rank reports the loss and its rank
// (the driver sees rank 0's), then the state is committed and rank 0 writes
// ELASTICRUN_TRIAL_DIR/checkpoint.json (when set). Report first: a commit() that re-joins
// a new epoch (hosts were added) throws after saving, and the run goes on after it, so a
// report placed after the commit would never be made for that step. When the report says
// stop, every rank prints "rank R stopped at step S" and exits 0; at the end, "rank R
// finished at step S". A new trial process starts from the checkpoint.
#include <elasticrun/elastic.hpp>
#include <elasticrun/elasticrun.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace {

struct Options {
  std::int64_t steps = 100;
  std::int64_t report_every = 10;
  int step_ms = 0;
};

struct Config {
  double lr = 0.01, momentum = 0.5;
};

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "trial_objective: %s\nusage: trial_objective [--steps N] [--report-every K] [--step-ms M]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (i + 1 >= argc) usage_error("unknown flag or missing value: " + f);
    char* end = nullptr;
    const char* v = argv[++i];
    long long n = std::strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || n < 0) usage_error(f + " needs a non-negative integer, got '" + v + "'");
    if (f == "--steps") o.steps = n;
    else if (f == "--report-every" && n > 0) o.report_every = n;
    else if (f == "--step-ms") o.step_ms = static_cast<int>(n);
    else usage_error("unknown flag or bad value: " + f + " " + v);
  }
  return o;
}

// ELASTICRUN_TRIAL_CONFIG, as elasticrun sweep sets it; unset means the defaults.
Config trial_config() {
  Config c;
  const char* text = std::getenv("ELASTICRUN_TRIAL_CONFIG");
  if (!text || !*text) return c;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) usage_error("ELASTICRUN_TRIAL_CONFIG is not a JSON object");
  auto number = [&](const char* key, double& out) {
    if (!j.contains(key)) return;
    if (!j[key].is_number()) usage_error(std::string("ELASTICRUN_TRIAL_CONFIG: '") + key + "' is not a number");
    out = j[key].get<double>();
  };
  number("lr", c.lr);
  number("momentum", c.momentum);
  if (!(c.lr > 0)) usage_error("ELASTICRUN_TRIAL_CONFIG: lr must be positive");
  return c;
}

double loss_at(const Config& c, std::int64_t step) {
  double q = std::pow(std::log10(c.lr) + 1, 2) + std::pow(c.momentum - 0.9, 2);
  return q + std::exp(-static_cast<double>(step) / 50.0);
}

std::string checkpoint_path() {
  const char* dir = std::getenv("ELASTICRUN_TRIAL_DIR");
  return dir && *dir ? std::string(dir) + "/checkpoint.json" : std::string();
}

std::int64_t read_checkpoint() {
  std::string path = checkpoint_path();
  if (path.empty()) return 0;
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return 0;
  return j["step"].get<std::int64_t>();
}

// Written to a temporary name and renamed: a reader (or a restart) never sees half a file.
void write_checkpoint(std::int64_t step, double loss) {
  std::string path = checkpoint_path();
  if (path.empty()) return;
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << nlohmann::json{{"step", step}, {"loss", loss}}.dump() << "\n";
    if (!out) return;
  }
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  Config cfg = trial_config();
  std::int64_t step = read_checkpoint();
  double loss = loss_at(cfg, step);
  bool stopped = false;
  try {
    elasticrun::init();
    {
      elasticrun::State st;
      st.track_value("step", step);
      st.track_value("loss", loss);
      elasticrun::run(st, [&](elasticrun::State& s) {
        elasticrun::Context& ctx = s.context();
        while (step < o.steps) {
          if (o.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
          double share = loss_at(cfg, step + 1) / ctx.topology().size;
          ctx.comm().allreduce(&share, &loss, 1, elasticrun::DataType::f64, elasticrun::ReduceOp::sum);
          ++step;
          if (step % o.report_every != 0 && step != o.steps) continue;
          if (ctx.report(step, {{"loss", loss}, {"rank", ctx.topology().rank}})) {
            stopped = true;
            return;
          }
          s.commit();
          if (ctx.topology().rank == 0) write_checkpoint(step, loss);
        }
      });
    }
    std::printf("rank %d %s at step %lld loss %.6f\n", elasticrun::rank(), stopped ? "stopped" : "finished",
                static_cast<long long>(step), loss);
    std::fflush(stdout);
    elasticrun::shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trial_objective: %s\n", e.what());
    return 1;
  }
  return 0;
}

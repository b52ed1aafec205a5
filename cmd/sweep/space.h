// The search space of `elasticrun sweep`: parsing the space file, seeded sampling, and
// the perturbations population-based training applies to a configuration.
//
// The space file is a JSON object; each key is a parameter, each value either a literal
// (the parameter is that constant) or an object with exactly one of these keys:
//
//   {"grid": [v1, v2, ...]}       every value, in order (grid axes form a cross product)
//   {"choice": [v1, v2, ...]}     one value, drawn uniformly
//   {"uniform": [lo, hi]}         a real number in [lo, hi); lo < hi
//   {"quniform": [lo, hi, q]}     uniform, then rounded to a multiple of q > 0 within
//                                 [lo, hi]; an integer when lo, hi and q are all integers
//   {"loguniform": [lo, hi]}      a real number whose logarithm is uniform; 0 < lo < hi
//   {"randint": [lo, hi]}         an integer in [lo, hi) (hi exclusive, as Ray Tune); lo < hi
//
// Values of grid and choice may be any JSON (numbers, strings, lists, objects).
// Example: {"lr": {"loguniform": [1e-4, 1e-1]}, "batch": {"grid": [32, 64]}, "epochs": 10}
//
// Sampling: the grid axes form a cross product in the file's key order, the LAST grid key
// varying fastest; the whole product is repeated num_samples times and every point of every
// repetition draws fresh values for the random axes, parameter by parameter in key order.
// So the number of configurations is num_samples times the product of the grid sizes.
// The same space file, num_samples and seed give the same configurations on any machine:
// draws come from std::mt19937_64 through our own conversions (Rng), not the standard
// library's distributions, whose output differs between implementations.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace elasticrun::sweep {

// A bad space file. The message names the parameter and the problem, for example
// `"lr": loguniform needs 0 < lower < upper, got lower=-1`.
class SpaceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Domain { constant, grid, choice, uniform, quniform, loguniform, randint };
const char* domain_name(Domain d);

// One parameter of the space.
struct Param {
  std::string name;
  Domain domain = Domain::constant;
  std::vector<nlohmann::json> values;  // constant (one value), grid, choice
  double lower = 0, upper = 0, q = 0;  // uniform, quniform, loguniform, randint
  bool integral = false;               // quniform with integer lo, hi, q: yields integers

  bool is_random() const { return domain != Domain::constant && domain != Domain::grid; }
};

struct Space {
  std::vector<Param> params;  // in the file's key order
  // The number of points of the grid's cross product (1 without grid axes).
  std::size_t grid_points() const;
  // The parameter called `name`, or nullptr.
  const Param* find(const std::string& name) const;
};

Space parse_space(const std::string& json_text);

// A reproducible random source: std::mt19937_64 with our own conversions of its raw output,
// and a draw count so that its position can be saved (state()) and restored exactly.
class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) : seed_(seed), engine_(seed) {}
  std::uint64_t next();           // the raw 64-bit output
  double uniform01();             // [0, 1): the top 53 bits over 2^53
  std::uint64_t below(std::uint64_t n);  // [0, n) without modulo bias; n > 0
  bool coin() { return (next() >> 63) != 0; }

  // {"seed": S, "draws": N}; restore replays N draws from S.
  nlohmann::json state() const;
  static Rng restore(const nlohmann::json& state);

 private:
  std::uint64_t seed_;
  std::uint64_t draws_ = 0;
  std::mt19937_64 engine_;
};

// The configurations of a sweep, in the order described at the top (num_samples <= 0: none).
// Each is a JSON object with every parameter of the space.
std::vector<nlohmann::json> sample(const Space& space, int num_samples, std::uint64_t seed);

// A fresh draw of one parameter from its domain (grid: any of its values; constant: itself).
nlohmann::json resample(const Param& p, Rng& rng);

// PBT's small step from `current`: continuous and integer values are multiplied by 0.8 or
// 1.2 (a fair coin), then kept in the domain: clamped to [lo, hi] (randint: [lo, hi - 1]),
// quniform re-quantized, randint and integral quniform rounded to the nearest integer.
// grid and choice move to the previous or next value of the list, clamped at its ends (as
// Ray Tune does, so an end value stays put half the time); a value not in the list, or of the
// wrong type, is resampled. Constants stay.
nlohmann::json perturb(const Param& p, const nlohmann::json& current, Rng& rng);

// PBT's explore step over a whole configuration: each non-constant parameter, in key order, is
// resampled with probability resample_probability, otherwise perturbed. Keys of `config` that
// are not in the space are kept; parameters missing from it are resampled.
nlohmann::json explore(const Space& space, const nlohmann::json& config, double resample_probability, Rng& rng);

}  // namespace elasticrun::sweep

#include "cmd/sweep/space.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace elasticrun::sweep {
namespace {

using ojson = nlohmann::ordered_json;  // keeps the file's key order

constexpr double kMaxExactInt = 9007199254740992.0;  // 2^53: larger integers lose digits as doubles

// A number as a person would write it: -1, 0.0001, 1e-08.
std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", x);
  return buf;
}

// A JSON value quoted in an error message, cut short if long.
std::string shown(const ojson& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

[[noreturn]] void fail(const std::string& name, const std::string& problem) {
  throw SpaceError("\"" + name + "\": " + problem);
}

// The n numbers of a bounds list, or an error naming what was expected.
std::vector<double> numbers(const std::string& name, const char* domain, const ojson& v, std::size_t n,
                            const char* shape) {
  const std::string expected = std::string(domain) + " needs " + shape;
  if (!v.is_array() || v.size() != n) fail(name, expected + ", got " + shown(v));
  std::vector<double> out;
  for (const auto& x : v) {
    if (!x.is_number() || !std::isfinite(x.get<double>())) fail(name, expected + ", got " + shown(v));
    out.push_back(x.get<double>());
  }
  return out;
}

bool is_integer(double x) { return std::floor(x) == x && std::fabs(x) <= kMaxExactInt; }

// The range of multipliers k with k * q in [lower, upper]; the tolerance keeps a bound that is
// a multiple of q up to rounding (0.3 / 0.1 = 2.9999999999999996) inside.
std::pair<double, double> q_range(const Param& p) {
  return {std::ceil(p.lower / p.q - 1e-9), std::floor(p.upper / p.q + 1e-9)};
}

Param parse_domain(const std::string& name, const ojson& spec) {
  static const char* kDomains = "grid, choice, uniform, quniform, loguniform, randint";
  if (spec.size() != 1) fail(name, std::string("needs exactly one of ") + kDomains + ", got " + shown(spec));
  // Not `*spec.items().begin()`: that names a temporary iterator, gone at the semicolon.
  const std::string& key = spec.begin().key();
  const ojson& v = spec.begin().value();
  Param p;
  p.name = name;
  if (key == "grid" || key == "choice") {
    p.domain = key == "grid" ? Domain::grid : Domain::choice;
    if (!v.is_array() || v.empty()) fail(name, key + " needs a non-empty list of values, got " + shown(v));
    for (const auto& x : v) p.values.emplace_back(x);
    return p;
  }
  if (key == "uniform" || key == "loguniform") {
    p.domain = key == "uniform" ? Domain::uniform : Domain::loguniform;
    auto b = numbers(name, key.c_str(), v, 2, "[lower, upper] (numbers)");
    p.lower = b[0], p.upper = b[1];
    if (p.domain == Domain::loguniform && p.lower <= 0)
      fail(name, "loguniform needs 0 < lower < upper, got lower=" + num(p.lower));
    if (p.lower >= p.upper)
      fail(name, key + " needs lower < upper, got lower=" + num(p.lower) + ", upper=" + num(p.upper));
    return p;
  }
  if (key == "quniform") {
    p.domain = Domain::quniform;
    auto b = numbers(name, "quniform", v, 3, "[lower, upper, q] (numbers)");
    p.lower = b[0], p.upper = b[1], p.q = b[2];
    if (p.q <= 0) fail(name, "quniform needs q > 0, got q=" + num(p.q));
    if (p.lower >= p.upper)
      fail(name, "quniform needs lower < upper, got lower=" + num(p.lower) + ", upper=" + num(p.upper));
    auto [kmin, kmax] = q_range(p);
    if (kmin > kmax)
      fail(name, "quniform needs a multiple of q within [lower, upper], got lower=" + num(p.lower) +
                     ", upper=" + num(p.upper) + ", q=" + num(p.q));
    p.integral = is_integer(p.lower) && is_integer(p.upper) && is_integer(p.q);
    return p;
  }
  if (key == "randint") {
    p.domain = Domain::randint;
    auto b = numbers(name, "randint", v, 2, "[lower, upper] (integers)");
    if (!is_integer(b[0]) || !is_integer(b[1])) fail(name, "randint needs [lower, upper] (integers), got " + shown(v));
    p.lower = b[0], p.upper = b[1];
    if (p.lower >= p.upper)
      fail(name, "randint needs lower < upper (upper is exclusive), got lower=" + num(p.lower) +
                     ", upper=" + num(p.upper));
    return p;
  }
  fail(name, "unknown domain \"" + key + "\" (expected one of " + kDomains + ")");
}

double clamp(double x, double lo, double hi) { return std::min(std::max(x, lo), hi); }

// The quantized value k * q, as an integer for an integral space, else rounded to 15 digits so
// that 3 * 0.1 reads 0.3.
nlohmann::json quantized(const Param& p, double k) {
  auto [kmin, kmax] = q_range(p);
  k = clamp(k, kmin, kmax);
  if (p.integral) return static_cast<std::int64_t>(k * p.q);
  return std::stod(num(k * p.q));
}

}  // namespace

const char* domain_name(Domain d) {
  switch (d) {
    case Domain::constant: return "constant";
    case Domain::grid: return "grid";
    case Domain::choice: return "choice";
    case Domain::uniform: return "uniform";
    case Domain::quniform: return "quniform";
    case Domain::loguniform: return "loguniform";
    case Domain::randint: return "randint";
  }
  return "?";
}

std::size_t Space::grid_points() const {
  std::size_t n = 1;
  for (const auto& p : params)
    if (p.domain == Domain::grid) n *= p.values.size();
  return n;
}

const Param* Space::find(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

Space parse_space(const std::string& json_text) {
  ojson doc;
  try {
    doc = ojson::parse(json_text);
  } catch (const ojson::parse_error& e) {
    throw SpaceError(std::string("space: not valid JSON: ") + e.what());
  }
  if (!doc.is_object())
    throw SpaceError(std::string("space: expected a JSON object of parameters, got ") + doc.type_name());
  Space space;
  for (const auto& [name, spec] : doc.items()) {
    if (name.empty()) throw SpaceError("space: a parameter has an empty name");
    if (spec.is_object()) {
      space.params.push_back(parse_domain(name, spec));
    } else {
      Param p;
      p.name = name;
      p.values.emplace_back(spec);
      space.params.push_back(std::move(p));
    }
  }
  return space;
}

std::uint64_t Rng::next() {
  ++draws_;
  return engine_();
}

double Rng::uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

std::uint64_t Rng::below(std::uint64_t n) {
  // Reject the lowest 2^64 mod n raw values, so that every residue is equally likely.
  const std::uint64_t threshold = (0 - n) % n;
  std::uint64_t x;
  do x = next();
  while (x < threshold);
  return x % n;
}

nlohmann::json Rng::state() const { return {{"seed", seed_}, {"draws", draws_}}; }

Rng Rng::restore(const nlohmann::json& state) {
  Rng rng(state.at("seed").get<std::uint64_t>());
  rng.draws_ = state.at("draws").get<std::uint64_t>();
  rng.engine_.discard(rng.draws_);
  return rng;
}

nlohmann::json resample(const Param& p, Rng& rng) {
  switch (p.domain) {
    case Domain::constant: return p.values[0];
    case Domain::grid:
    case Domain::choice: return p.values[rng.below(p.values.size())];
    case Domain::uniform: return p.lower + rng.uniform01() * (p.upper - p.lower);
    case Domain::loguniform: {
      const double lo = std::log(p.lower), hi = std::log(p.upper);
      return clamp(std::exp(lo + rng.uniform01() * (hi - lo)), p.lower, p.upper);
    }
    case Domain::quniform: return quantized(p, std::round((p.lower + rng.uniform01() * (p.upper - p.lower)) / p.q));
    case Domain::randint:
      return static_cast<std::int64_t>(p.lower) +
             static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(p.upper - p.lower)));
  }
  return nullptr;
}

nlohmann::json perturb(const Param& p, const nlohmann::json& current, Rng& rng) {
  if (p.domain == Domain::constant) return p.values[0];
  if (p.domain == Domain::grid || p.domain == Domain::choice) {
    auto it = std::find(p.values.begin(), p.values.end(), current);
    if (it == p.values.end()) return resample(p, rng);
    const auto i = static_cast<std::ptrdiff_t>(it - p.values.begin());
    const auto last = static_cast<std::ptrdiff_t>(p.values.size()) - 1;
    return p.values[std::clamp<std::ptrdiff_t>(rng.coin() ? i + 1 : i - 1, 0, last)];
  }
  if (!current.is_number()) return resample(p, rng);
  const double x = current.get<double>() * (rng.coin() ? 1.2 : 0.8);
  switch (p.domain) {
    case Domain::uniform:
    case Domain::loguniform: return clamp(x, p.lower, p.upper);
    case Domain::quniform: return quantized(p, std::round(x / p.q));
    case Domain::randint: return static_cast<std::int64_t>(clamp(std::round(x), p.lower, p.upper - 1));
    default: return resample(p, rng);  // not reached: the list domains are handled above
  }
}

std::vector<nlohmann::json> sample(const Space& space, int num_samples, std::uint64_t seed) {
  Rng rng(seed);
  const std::size_t points = space.grid_points();
  std::vector<nlohmann::json> out;
  for (int rep = 0; rep < num_samples; ++rep) {
    for (std::size_t point = 0; point < points; ++point) {
      // The grid index of each axis: `point` in mixed radix, the last grid key the lowest digit.
      std::vector<std::size_t> index(space.params.size(), 0);
      std::size_t rest = point;
      for (std::size_t i = space.params.size(); i-- > 0;) {
        const Param& p = space.params[i];
        if (p.domain != Domain::grid) continue;
        index[i] = rest % p.values.size();
        rest /= p.values.size();
      }
      nlohmann::json config = nlohmann::json::object();
      for (std::size_t i = 0; i < space.params.size(); ++i) {
        const Param& p = space.params[i];
        config[p.name] = p.domain == Domain::grid ? p.values[index[i]] : resample(p, rng);
      }
      out.push_back(std::move(config));
    }
  }
  return out;
}

nlohmann::json explore(const Space& space, const nlohmann::json& config, double resample_probability, Rng& rng) {
  nlohmann::json out = config.is_object() ? config : nlohmann::json::object();
  for (const auto& p : space.params) {
    if (p.domain == Domain::constant) {
      out[p.name] = p.values[0];
      continue;
    }
    const bool fresh = !out.contains(p.name) || rng.uniform01() < resample_probability;
    out[p.name] = fresh ? resample(p, rng) : perturb(p, out[p.name], rng);
  }
  return out;
}

}  // namespace elasticrun::sweep

#include "worker/fault_injector.h"

#include <charconv>
#include <optional>

namespace strata::worker {
namespace {

class NoFaultInjector final : public FaultInjector {
 public:
  int64_t StepBallastBytesPerSequence(int64_t, uint32_t) const override { return 0; }
  Hang HangBeforeStep(int64_t, uint32_t) override { return Hang::kNone; }
};

struct Ballast {
  int64_t step = 0, bytes = 0, rank = -1;
};
struct HangAt {
  int64_t step = 0, rank = 0;
  bool stuck = false;
};

class ScriptedFaults final : public FaultInjector {
 public:
  ScriptedFaults(std::vector<Ballast> ballasts, std::vector<HangAt> hangs)
      : ballasts_(std::move(ballasts)), hangs_(std::move(hangs)) {}

  int64_t StepBallastBytesPerSequence(int64_t step, uint32_t rank) const override {
    int64_t bytes = 0;
    for (const Ballast& b : ballasts_) {
      if (b.step == step && (b.rank < 0 || b.rank == static_cast<int64_t>(rank))) bytes += b.bytes;
    }
    return bytes;
  }

  Hang HangBeforeStep(int64_t step, uint32_t rank) override {
    for (const HangAt& h : hangs_) {
      if (h.step != step || h.rank != static_cast<int64_t>(rank) || hung_.exchange(true)) continue;
      return h.stuck ? Hang::kForever : Hang::kUntilCancelled;
    }
    return Hang::kNone;
  }

 private:
  const std::vector<Ballast> ballasts_;
  const std::vector<HangAt> hangs_;
  std::atomic<bool> hung_{false};  // one hang per process (tasks come and go; the worker stays)
};

std::vector<std::string> SplitColons(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t colon; (colon = text.find(':', start)) != std::string::npos; start = colon + 1) {
    parts.push_back(text.substr(start, colon - start));
  }
  parts.push_back(text.substr(start));
  return parts;
}

std::optional<int64_t> ParseCount(const std::string& text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

}  // namespace

FaultInjector& NoFaults() {
  static NoFaultInjector none;
  return none;
}

Result<std::unique_ptr<FaultInjector>> ParseFaults(const std::vector<std::string>& specs) {
  std::vector<Ballast> ballasts;
  std::vector<HangAt> hangs;
  for (const std::string& spec : specs) {
    const auto parts = SplitColons(spec);
    std::vector<std::optional<int64_t>> numbers;
    for (size_t i = 1; i < parts.size(); ++i) numbers.push_back(ParseCount(parts[i]));
    auto number = [&](size_t i) { return i < numbers.size() ? numbers[i] : std::nullopt; };
    if (parts[0] == "ballast" && (parts.size() == 3 || parts.size() == 4) && number(0) && number(1) &&
        (parts.size() == 3 || number(2))) {
      ballasts.push_back({*number(0), *number(1), parts.size() == 4 ? *number(2) : -1});
    } else if (parts[0] == "hang" && (parts.size() == 3 || (parts.size() == 4 && parts[3] == "stuck")) && number(0) &&
               number(1)) {
      hangs.push_back({*number(0), *number(1), parts.size() == 4});
    } else {
      return InvalidArgument(
          "--inject-fault \"" + spec +
          "\" is not a fault; use ballast:STEP:BYTES[:RANK] or hang:STEP:RANK[:stuck] (worker/fault_injector.h)");
    }
  }
  return std::unique_ptr<FaultInjector>(std::make_unique<ScriptedFaults>(std::move(ballasts), std::move(hangs)));
}

}  // namespace strata::worker

// Shared by the commands (commands.h, command_set.h): printing what the coordinator stores, the
// command set, and RUN as typed. Finding and calling the coordinator is client/cluster_api.cc's.
#include <ctime>
#include <iomanip>
#include <sstream>

#include "cli/command_set.h"
#include "cli/commands.h"
#include "cli/exit.h"
#include "spec/run_spec.h"

namespace strata::cli {

// Names, ids and messages come from the coordinator's store (and from there from users and
// workers): printed escaped, so a stored name with escapes or newlines cannot drive the terminal.
std::string Printable(const std::string& text) { return EscapeForTerminal(text); }
std::string Printable(capnp::Text::Reader text) { return EscapeForTerminal(std::string(text.cStr(), text.size())); }

std::string FormatTime(int64_t unix_ms) {
  std::time_t t = unix_ms / 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  std::ostringstream s;
  s << std::put_time(&tm, "%Y-%m-%d %H:%M:%S");
  return s.str();
}

CLI::App* CommandSet::Add(const std::string& name, const std::string& help, std::function<int()> run) {
  CLI::App* command = app_.add_subcommand(name, help);
  commands_.emplace_back(command, std::move(run));
  return command;
}

int CommandSet::RunParsed() const {
  for (const auto& [command, run] : commands_) {
    if (command->parsed()) return run();
  }
  return kExitBadInput;
}

bool ResolveRunArgument(const GlobalOptions& g, std::string& run, int* exit_code) {
  if (run.empty()) return true;
  auto id = client::ResolveRun(g, run);
  if (!id.ok()) {
    *exit_code = Fail(id.status());
    return false;
  }
  run = *id;
  return true;
}

}  // namespace strata::cli

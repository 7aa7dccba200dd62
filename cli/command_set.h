// How `strata`'s subcommands come to be: each file of cli/ registers its own (its options, its help,
// the function that runs it) on a CommandSet, and RunCli (cli.cc) parses the command line and runs
// the one it names. A new subcommand is one Register function in its own file, and a line in cli.cc
// that calls it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"

namespace strata::cli {

// The help text of every RUN argument.
inline constexpr const char* kRunHelp =
    "RUN: a run id, a unique prefix of one, a run name (its newest run) or `latest` (the newest run)";

class CommandSet {
 public:
  CommandSet(CLI::App& app, GlobalOptions& global) : app_(app), global_(global) {}
  CLI::App& app() { return app_; }
  // The global options (--state-dir, --cluster, --timeout-ms, --keys), filled once parsed.
  GlobalOptions& global() { return global_; }
  // A subcommand of `strata`; `run` gives the process's exit code (cli/exit.h) when the command
  // line names it. Options bound to the subcommand must outlive the CommandSet (hold them in the
  // lambda, e.g. through a shared_ptr).
  CLI::App* Add(const std::string& name, const std::string& help, std::function<int()> run);
  // After parsing: the run of the subcommand the command line named.
  int RunParsed() const;

 private:
  CLI::App& app_;
  GlobalOptions& global_;
  std::vector<std::pair<CLI::App*, std::function<int()>>> commands_;
};

// RUN as typed (a name, an id prefix, `latest`) resolved to a run id in place; false after
// printing why it could not be (its exit code in `*exit_code`).
bool ResolveRunArgument(const GlobalOptions& g, std::string& run, int* exit_code);

// Each file's subcommands, in the order `strata --help` lists them.
void RegisterClusterCommands(CommandSet& set);      // keygen, up, down (cluster_commands.cc)
void RegisterRunCommands(CommandSet& set);          // workers, submit, status, events, cancel, checkpoints, export
void RegisterActivationsCommands(CommandSet& set);  // activations, activations get (activations_command.cc)
void RegisterLogsCommands(CommandSet& set);         // logs, metrics (logs_command.cc)
void RegisterPlanCommand(CommandSet& set);          // plan (plan_command.cc)
void RegisterTokenizeCommand(CommandSet& set);      // tokenize (tokenize_command.cc)

}  // namespace strata::cli

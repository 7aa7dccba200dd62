#include "cli/cli.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <zmq.hpp>

#include "cli/activations_command.h"
#include "cli/command_set.h"
#include "cli/commands.h"
#include "cli/exit.h"
#include "cli/logs_command.h"
#include "cli/plan_command.h"
#include "cli/version.h"
#include "client/cluster_file.h"
#include "client/export.h"
#include "common/byte_size.h"
#include "schema/envelope.h"

extern char** environ;

namespace strata::cli {

std::string VersionText() {
  return std::string("strata ") + STRATA_VERSION + " (git " + STRATA_GIT_REVISION + ")\nLibTorch " +
         STRATA_TORCH_VERSION + " (the workers'; the CLI does not link it), CUDA " + STRATA_CUDA_VERSION;
}

// A bash completion script made from the parser itself, so it never drifts from the commands:
// subcommand names, and each (sub)command's long options. Global options complete everywhere.
std::string BashCompletion(const CLI::App& app) {
  auto option_names = [](const CLI::App& a) {
    std::string names;
    for (const CLI::Option* o : a.get_options()) {
      for (const std::string& n : o->get_lnames()) names += " --" + n;
      for (const std::string& n : o->get_snames()) names += " -" + n;
    }
    return names;
  };
  auto sub_names = [](const CLI::App& a) {
    std::string names;
    for (const CLI::App* sub : a.get_subcommands({})) names += " " + sub->get_name();
    return names;
  };
  std::ostringstream s;
  s << "# bash completion for strata, made by `strata completion bash`; load it with\n"
    << "#   source <(strata completion bash)\n"
    << "_strata() {\n"
    << "  local cur=${COMP_WORDS[COMP_CWORD]} path= w i\n"
    << "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
    << "    w=${COMP_WORDS[i]}\n"
    << "    case \"$path $w\" in\n";
  std::string cases;
  std::ostringstream words;
  // Each command path ("", " submit", " activations get") and the words that complete after it.
  std::function<void(const CLI::App&, const std::string&)> walk = [&](const CLI::App& a, const std::string& path) {
    for (const CLI::App* sub : a.get_subcommands({})) {
      s << "      \"" << path << " " << sub->get_name() << "\") path=\"" << path << " " << sub->get_name() << "\" ;;\n";
    }
    words << "    \"" << path << "\") words=\"" << sub_names(a) << option_names(a) << option_names(app) << "\" ;;\n";
    for (const CLI::App* sub : a.get_subcommands({})) walk(*sub, path + " " + sub->get_name());
  };
  walk(app, "");
  s << "    esac\n"
    << "  done\n"
    << "  local words\n"
    << "  case \"$path\" in\n"
    << words.str() << "  esac\n"
    << "  if [[ $cur == -* || -n $words ]]; then COMPREPLY=($(compgen -W \"$words\" -- \"$cur\")); fi\n"
    << "  [[ $cur != -* ]] && COMPREPLY+=($(compgen -f -- \"$cur\"))\n"
    << "}\n"
    << "complete -F _strata strata\n";
  return s.str();
}

int RunCli(int argc, char** argv) {
  CLI::App app{"strata: train and inspect transformer models on a cluster of workers"};
  app.require_subcommand(1);
  // Global options go anywhere on the line (`strata status --state-dir X` as `strata --state-dir X
  // status`): subcommands made after this inherit fallthrough. Every help shows the defaults.
  app.fallthrough();
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", VersionText(),
                       "print the version, git revision and LibTorch / CUDA versions, then exit");
  GlobalOptions g;
  g.state_dir = client::DefaultStateDir();
  g.environment_first = true;  // $STRATA_CLUSTER over --state-dir, as over the default state directory
  app.add_option("--state-dir", g.state_dir, "local cluster state ($STRATA_STATE_DIR, default ~/.local/share/strata)");
  app.add_option("--cluster", g.cluster, "coordinator endpoint (overrides the state dir; or $STRATA_CLUSTER)");
  app.add_option("--timeout-ms", g.timeout_ms, "how long to wait for the coordinator")->check(CLI::Range(100, 600000));
  app.add_option("--keys", g.keys_dir, "CURVE key directory (or $STRATA_KEYS; default STATE_DIR/keys if present)");

  // Each file registers its own subcommands (cli/command_set.h).
  CommandSet commands(app, g);
  RegisterClusterCommands(commands);
  std::string completion_shell;
  auto* completion =
      commands.Add("completion", "print a shell completion script: `source <(strata completion bash)`", [&app] {
        std::cout << BashCompletion(app);
        return kExitOk;
      });
  completion->add_option("shell", completion_shell, "the shell (bash)")->required()->check(CLI::IsMember({"bash"}));
  RegisterRunCommands(commands);
  RegisterActivationsCommands(commands);
  RegisterLogsCommands(commands);
  RegisterPlanCommand(commands);
  RegisterTokenizeCommand(commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }
  try {
    return commands.RunParsed();
  } catch (const zmq::error_t& e) {  // a safety net: addresses are validated before connecting
    return Fail(
        Unavailable(std::string("ZeroMQ refused the connection: ") + e.what() + "; check --cluster / STRATA_CLUSTER"));
  }
}

}  // namespace strata::cli

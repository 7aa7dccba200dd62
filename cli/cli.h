// The `strata` command line. Exit codes: 0 success, 1 failure (unreachable cluster, run failed),
// 2 bad input (spec, flags). Every listing takes --json.
#pragma once

namespace strata::cli {

int RunCli(int argc, char** argv);

}  // namespace strata::cli

// strata: the command line (see cli.h).
#include "cli/cli.h"

int main(int argc, char** argv) { return strata::cli::RunCli(argc, argv); }

// `strata activations RUN` (what an extract run has stored) and `strata activations get RUN
// --layer L [--site S] [--rows A:B] [--with-tokens] --out FILE` (rows of one layer to .npy /
// .safetensors). Both take --store DIR (repeated) to read worker stores without a cluster.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/cluster_api.h"
#include "common/status.h"

namespace strata::cli {

using client::CoordinatorAddress;

struct ActivationsGet {
  std::string run;
  int64_t layer = -1;
  std::string site;                 // empty: the run's only site, else resid_post
  int64_t head = -1;                // >= 0: only this head of a site with heads (q, k, v, attn_pattern)
  std::string rows;                 // "A:B", "A:" or empty (every stored row)
  std::string out;                  // FILE.npy, FILE.safetensors or "-"
  bool force = false;               // replace an existing --out
  bool with_tokens = false;         // also NAME.tokens.npy beside --out (not with --out -)
  std::vector<std::string> stores;  // --store: read these store directories, not the cluster
};

// An --out that exists is refused unless request.force (checked again when the file is moved
// into place, so one that appears meanwhile is kept too). Called before the cluster is contacted.
Status CheckActivationsOut(const ActivationsGet& request);

// Both return the process exit code (cli/exit.h).
// With `stores` non-empty the coordinator is not asked (activations::ActivationReader::OpenStores).
int ListActivations(const CoordinatorAddress& coordinator, const std::vector<std::string>& stores,
                    const std::string& run, bool as_json);
int GetActivations(const CoordinatorAddress& coordinator, const ActivationsGet& request);

}  // namespace strata::cli

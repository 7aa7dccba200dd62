#include "worker/causal_lm.h"

#include "worker/gpt2.h"
#include "worker/llama.h"

namespace strata::worker {

std::shared_ptr<CausalLm> CreateCausalLm(const ModelSpec& spec) {
  if (spec.family == "llama") return std::make_shared<Llama>(spec);
  return std::make_shared<Gpt2>(spec);  // the run spec admits only these two families
}

}  // namespace strata::worker

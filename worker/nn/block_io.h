// What one transformer block hands back beyond its output, and what a caller may ask of it:
// the seam between a family's block maths (model_family.h), the whole model (causal_lm.h) and
// activation capture (worker/extract/).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>

namespace strata::worker {

// What one transformer block computes, for activation capture and patching (docs/extract.md
// defines every site). Each tensor is laid out [batch, time, row shape...] so that
// reshape({-1, ExtractSiteRowShape(site)...}) gives the stored rows (views, not copies, until
// then):
//   resid_pre    [b, t, hidden]       the block's input
//   attn_out     [b, t, hidden]       attention's output, before it is added to the residual
//   resid_mid    [b, t, hidden]       resid_pre + attn_out (for GPT-NeoX's parallel residual the
//                                     same sum, though the MLP reads resid_pre there)
//   q            [b, t, heads, hd]    queries after rotary (GPT-2: no rotary)
//   k, v         [b, t, kv_heads, hd] keys after rotary, values; before GQA's repeat
//   attn_pattern [b, t, heads, t]     softmax(q k^T / sqrt(hd) + causal mask), per query row;
//                                     only when BlockRequest::attn_pattern
//   mlp_hidden   [b, t, ffn]          act(fc(x)), or act(gate(x)) * up(x) for gated MLPs
//   mlp_out      [b, t, hidden]       the MLP's output, before the residual add
//   resid_post   [b, t, hidden]       the block's output (Hugging Face's hidden_states[layer + 1])
struct BlockOutputs {
  torch::Tensor resid_pre;
  torch::Tensor attn_out;
  torch::Tensor resid_mid;
  torch::Tensor q, k, v;
  torch::Tensor attn_pattern;
  torch::Tensor mlp_hidden;
  torch::Tensor mlp_out;
  torch::Tensor resid_post;
  // The site by name (ExtractSites()); undefined for a site a block does not produce.
  const torch::Tensor& Site(const std::string& site) const;
};

// What a caller asks of one block beyond its output. `patch`, when set, sees each patchable
// site's value as computed ([b, t, row shape...], as in BlockOutputs) and returns the value the
// block goes on with (the same tensor to leave it); patchable: resid_pre, attn_out, resid_mid,
// mlp_hidden, mlp_out, resid_post.
struct BlockRequest {
  bool attn_pattern = false;  // costs a [b, heads, t, t] softmax beside the fused attention
  std::function<torch::Tensor(const std::string& site, const torch::Tensor& value)> patch;
};
using BlockVisitor = std::function<void(int64_t layer, const BlockOutputs& outputs)>;
using BlockRequestFn = std::function<BlockRequest(int64_t layer)>;

}  // namespace strata::worker

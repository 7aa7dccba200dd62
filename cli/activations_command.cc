#include "cli/activations_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "activations/reader.h"
#include "cli/array_file.h"
#include "cli/command_set.h"
#include "cli/exit.h"
#include "common/byte_size.h"
#include "spec/site_names.h"

namespace strata::cli {
namespace {

using json = nlohmann::json;

// "A:B" -> [A, B); "A:" -> [A, total); "" -> [0, total).
Result<std::pair<uint64_t, uint64_t>> ParseRows(const std::string& text, uint64_t total) {
  if (text.empty()) return std::pair<uint64_t, uint64_t>{0, total};
  const size_t colon = text.find(':');
  auto bad = [&] { return InvalidArgument("--rows " + text + " is not a row range; write A:B (rows A to B-1) or A:"); };
  if (colon == std::string::npos) return bad();
  try {
    size_t used = 0;
    const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
    const uint64_t begin = a.empty() ? 0 : std::stoull(a, &used);
    if (!a.empty() && used != a.size()) return bad();
    const uint64_t end = b.empty() ? total : std::stoull(b, &used);
    if (!b.empty() && used != b.size()) return bad();
    return std::pair<uint64_t, uint64_t>{begin, end};
  } catch (const std::exception&) {
    return bad();
  }
}

Result<std::unique_ptr<activations::ActivationReader>> OpenReader(const CoordinatorAddress& coordinator,
                                                                  const std::vector<std::string>& stores) {
  if (!stores.empty()) return activations::ActivationReader::OpenStores(stores);
  return activations::ActivationReader::Connect(coordinator.endpoint, coordinator.timeout_ms, coordinator.keys);
}

// FILE.npy -> FILE.tokens.npy (FILE.safetensors -> FILE.tokens.npy): where --with-tokens writes.
std::string TokensPath(const std::string& out) {
  const size_t dot = out.rfind('.');
  const size_t slash = out.rfind('/');
  const std::string stem =
      dot != std::string::npos && (slash == std::string::npos || dot > slash) ? out.substr(0, dot) : out;
  return stem + ".tokens.npy";
}

}  // namespace

int ListActivations(const CoordinatorAddress& coordinator, const std::vector<std::string>& stores,
                    const std::string& run, bool as_json) {
  auto reader = OpenReader(coordinator, stores);
  if (!reader.ok()) return Fail(reader.status());
  auto index = (*reader)->Index(run);
  if (!index.ok()) return Fail(index.status());
  // Every site's rows are reported at the first site's width when they differ; bytes sum per site.
  const uint64_t stored_row_bytes = index->StoredBytesPerRow();
  const uint64_t row_bytes = index->sites.empty() ? 0 : index->RowBytes(index->sites[0]);
  const uint64_t stored = index->stored_rows();
  std::map<std::string, uint64_t> rows_by_worker;
  for (const auto& c : index->chunks) rows_by_worker[c.worker] += c.row_count;
  if (as_json) {
    json sites = index->sites, layers = index->layers;
    json workers = json::object();
    json missing = json::array();
    for (auto [a, b] : index->MissingRows()) missing.push_back({a, b});
    json shapes = json::object();
    for (const auto& site : index->sites) shapes[site] = index->RowShape(site);
    for (auto& [w, rows] : rows_by_worker) workers[w] = rows;
    json out = {{"run_id", index->run},
                {"state", index->state},
                {"layers", layers},
                {"sites", sites},
                {"dtype", storage::DTypeName(index->dtype)},
                {"hidden", index->hidden},
                {"row_shapes", shapes},
                {"rows_total", index->total_rows},
                {"rows_stored", stored},
                {"rows_complete_from_0", index->contiguous_rows()},
                {"complete", index->complete()},
                {"bytes_per_layer_site", stored * row_bytes},
                {"bytes", stored * stored_row_bytes},
                {"missing_rows", missing},
                {"chunks", index->chunks.size()},
                {"rows_by_worker", workers}};
    std::cout << out.dump(2) << std::endl;
    return kExitOk;
  }
  std::cout << "run " << index->run << " (" << index->state << "): " << stored << " of " << index->total_rows
            << " token rows stored" << (index->complete() ? "" : " - capture still in progress") << "\n";
  std::cout << "dtype " << storage::DTypeName(index->dtype) << ", hidden " << index->hidden << ", "
            << HumanBytes(stored * row_bytes) << " per layer and site, " << HumanBytes(stored * stored_row_bytes)
            << " in all\n";
  std::cout << std::left << std::setw(8) << "LAYER" << std::setw(12) << "SITE" << std::setw(14) << "ROWS"
            << "BYTES\n";
  for (int64_t layer : index->layers) {
    for (const auto& site : index->sites) {
      if (!index->Holds(layer, site)) continue;
      std::cout << std::setw(8) << layer << std::setw(12) << site << std::setw(14) << stored
                << HumanBytes(stored * index->RowBytes(site)) << "\n";
    }
  }
  std::cout << "stored on:";
  for (auto& [w, rows] : rows_by_worker) std::cout << " " << w << " (" << rows << " rows)";
  std::cout << std::endl;
  if (index->offline && !index->complete()) {
    std::cout << "missing (in none of the given stores): rows";
    for (auto [a, b] : index->MissingRows()) std::cout << " " << a << ":" << b;
    std::cout << std::endl;
  }
  return kExitOk;
}

Status CheckActivationsOut(const ActivationsGet& request) {
  if (request.out.empty()) return InvalidArgument("--out is required: FILE.npy, FILE.safetensors or - (npy on stdout)");
  std::error_code ec;
  if (request.out != "-" && !request.force &&
      std::filesystem::symlink_status(request.out, ec).type() != std::filesystem::file_type::not_found) {
    return InvalidArgument("--out " + request.out +
                           " already exists; choose a new path, remove it, or pass --force to replace it");
  }
  if (request.with_tokens && request.out == "-") {
    return InvalidArgument("--with-tokens writes NAME.tokens.npy beside --out; give --out FILE.npy, not -");
  }
  if (request.with_tokens && !request.force &&
      std::filesystem::symlink_status(TokensPath(request.out), ec).type() != std::filesystem::file_type::not_found) {
    return InvalidArgument("--with-tokens: " + TokensPath(request.out) + " already exists; remove it or pass --force");
  }
  return Status::Ok();
}

namespace {

// What `--head` keeps of each row: all of it, or the bytes of one head of a [heads, x] row. Reads
// arrive in spans that need not end on a row boundary, so a partial row waits for the next span.
class HeadSlice {
 public:
  static Result<HeadSlice> For(const activations::ActivationIndex& index, const std::string& site, int64_t head) {
    HeadSlice slice;
    slice.row_shape = index.RowShape(site);
    if (head < 0) return slice;
    if (slice.row_shape.size() != 2) {
      return InvalidArgument("--head " + std::to_string(head) + ": site " + site + " has no heads (its rows are [" +
                             std::to_string(slice.row_shape[0]) + "]); sites with heads: q, k, v, attn_pattern");
    }
    const int64_t heads = slice.row_shape[0];
    if (head >= heads) {
      return InvalidArgument("--head " + std::to_string(head) + " is out of range: site " + site + " has " +
                             std::to_string(heads) + (heads == 1 ? " head" : " heads") + " (0 to " +
                             std::to_string(heads - 1) + ")");
    }
    const uint64_t element = storage::DTypeSize(index.SiteDType(site));
    slice.head_bytes_ = static_cast<uint64_t>(slice.row_shape[1]) * element;
    slice.row_bytes_ = slice.head_bytes_ * static_cast<uint64_t>(heads);
    slice.offset_ = slice.head_bytes_ * static_cast<uint64_t>(head);
    slice.row_shape = {slice.row_shape[1]};
    return slice;
  }

  Status Append(std::span<const uint8_t> data, ArrayFileWriter& writer) {
    if (row_bytes_ == 0) return writer.Append(data);
    while (!data.empty()) {
      if (!partial_.empty() || data.size() < row_bytes_) {
        const size_t take = std::min<size_t>(row_bytes_ - partial_.size(), data.size());
        partial_.insert(partial_.end(), data.begin(), data.begin() + take);
        data = data.subspan(take);
        if (partial_.size() < row_bytes_) return Status::Ok();
        STRATA_RETURN_IF_ERROR(writer.Append(std::span<const uint8_t>(partial_).subspan(offset_, head_bytes_)));
        partial_.clear();
        continue;
      }
      STRATA_RETURN_IF_ERROR(writer.Append(data.subspan(offset_, head_bytes_)));
      data = data.subspan(row_bytes_);
    }
    return Status::Ok();
  }

  Status CheckNoPartialRow() const {
    if (partial_.empty()) return Status::Ok();
    return Internal("the store returned " + std::to_string(partial_.size()) + " bytes past the last whole row");
  }

  std::vector<int64_t> row_shape;  // of what is written

 private:
  uint64_t row_bytes_ = 0;  // 0: whole rows pass through
  uint64_t head_bytes_ = 0;
  uint64_t offset_ = 0;
  std::vector<uint8_t> partial_;
};

}  // namespace

int GetActivations(const CoordinatorAddress& coordinator, const ActivationsGet& request) {
  if (Status st = CheckActivationsOut(request); !st.ok()) return Fail(st);
  // --site: Strata's name, or TransformerLens' hook with its layer (spec/site_names.h).
  std::optional<NamedSite> named;
  if (!request.site.empty()) {
    auto parsed = ParseSiteName(request.site);
    if (!parsed.ok()) return Fail(parsed.status());
    named = *parsed;
    if (named->layer >= 0 && request.layer >= 0 && request.layer != named->layer)
      return Fail(InvalidArgument("--layer " + std::to_string(request.layer) + " and --site " + request.site +
                                  " name different layers; give one of them"));
  }
  auto reader = OpenReader(coordinator, request.stores);
  if (!reader.ok()) return Fail(reader.status());
  auto index = (*reader)->Index(request.run);
  if (!index.ok()) return Fail(index.status());
  std::string site = named ? named->site : (index->sites.size() == 1 ? index->sites[0] : "resid_post");
  int64_t layer = request.layer;
  if (named && named->layer >= 0) layer = named->layer;
  // ln_final.hook_normalized: the model-level site, stored at the model's last layer.
  if (layer < 0 && named && named->site == "final_norm" && request.site != "final_norm" && !index->layers.empty())
    layer = *std::max_element(index->layers.begin(), index->layers.end());
  if (layer < 0)
    return Fail(
        InvalidArgument("--layer is required unless --site names a TransformerLens hook with its layer "
                        "(e.g. --site blocks.6.hook_resid_post)"));
  // Without --rows a running capture yields the rows complete from row 0, and says so.
  // Read from stores (--store), every row is asked for: the read names the rows none of them holds.
  const uint64_t available = index->complete() || index->offline ? index->total_rows : index->contiguous_rows();
  auto rows = ParseRows(request.rows, available);
  if (!rows.ok()) return Fail(rows.status());
  auto [begin, end] = *rows;
  if (request.rows.empty() && available == 0) {
    return Fail(Unavailable("run " + index->run + " has stored no rows from row 0 yet (" + index->state +
                            "); try again when its first chunk is done (`strata status " + index->run + "`)"));
  }
  if (!index->complete() && request.rows.empty()) {
    std::cerr << "strata: run " << index->run << " is still capturing (" << index->state << "): writing the "
              << available << " of " << index->total_rows << " rows complete so far" << std::endl;
  }
  const uint64_t n = end > begin ? end - begin : 0;
  if (Status st = index->CheckSite(layer, site); !st.ok()) return Fail(st);
  auto head = HeadSlice::For(*index, site, request.head);
  if (!head.ok()) return Fail(head.status());
  std::map<std::string, std::string> metadata = {{"strata_run", index->run},
                                                 {"layer", std::to_string(layer)},
                                                 {"site", site},
                                                 {"rows", std::to_string(begin) + ":" + std::to_string(end)}};
  std::string tensor_name = "layer" + std::to_string(layer) + "." + site;
  if (request.head >= 0) {
    metadata["head"] = std::to_string(request.head);
    tensor_name += ".head" + std::to_string(request.head);
  }
  auto writer = ArrayFileWriter::Create(request.out, index->SiteDType(site), n, head->row_shape, tensor_name, metadata,
                                        request.force);
  if (!writer.ok()) return Fail(writer.status());
  const auto start = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  Status st = (*reader)->ReadRows(*index, layer, site, begin, end, [&](std::span<const uint8_t> data) {
    bytes += data.size();
    return head->Append(data, **writer);
  });
  if (st.ok()) st = head->CheckNoPartialRow();
  if (st.ok() && request.with_tokens) {
    // Written before --out is moved into place: a failed tokens read leaves neither file.
    auto tokens = ArrayFileWriter::Create(TokensPath(request.out), storage::DType::kI64, n,
                                          {storage::kActivationTokenColumns}, "tokens", {}, request.force);
    st = tokens.status();
    if (st.ok())
      st = (*reader)->ReadTokens(*index, begin, end,
                                 [&](std::span<const uint8_t> data) { return (*tokens)->Append(data); });
    if (st.ok()) st = (*tokens)->Commit();
  }
  if (st.ok()) st = (*writer)->Commit();
  if (!st.ok()) return Fail(st);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "strata: wrote " << (request.out == "-" ? "stdout" : request.out) << ": " << (*writer)->description()
            << " (rows " << begin << ":" << end << " of layer " << layer << " " << site << "), " << HumanBytes(bytes)
            << " read in " << std::fixed << std::setprecision(2) << seconds << " s ("
            << bytes / std::max(seconds, 1e-9) / 1e9 << " GB/s)" << std::endl;
  return kExitOk;
}

void RegisterActivationsCommands(CommandSet& set) {
  GlobalOptions& g = set.global();
  struct Args {
    std::string run;
    bool as_json = false;
    ActivationsGet get;
    CLI::App* get_cmd = nullptr;
  };
  auto a = std::make_shared<Args>();
  auto* activations_cmd =
      set.Add("activations", "list what an extract run stored (layers, sites, rows, bytes)", [&g, a]() -> int {
        ActivationsGet& get = a->get;
        const bool getting = a->get_cmd->parsed();
        if (getting) {
          if (Status st = CheckActivationsOut(get); !st.ok()) return Fail(st);  // before resolving the cluster
        }
        // --store: the stores alone, no cluster asked (RUN must be the run id: names and prefixes
        // are the coordinator's to resolve).
        if (!get.stores.empty()) {
          if (getting) return GetActivations(CoordinatorAddress{}, get);
          if (a->run.empty()) return Fail(InvalidArgument("name the run: `strata activations RUN --store DIR`"));
          return ListActivations(CoordinatorAddress{}, get.stores, a->run, a->as_json);
        }
        auto coordinator = client::Coordinator(g);
        if (!coordinator.ok()) return Fail(coordinator.status());
        int rc = kExitOk;
        for (std::string* r : {&a->run, &get.run}) {
          if (!ResolveRunArgument(g, *r, &rc)) return rc;
        }
        if (getting) return GetActivations(*coordinator, get);
        if (a->run.empty())
          return Fail(InvalidArgument("name the run: `strata activations RUN` (runs: `strata status`)"));
        return ListActivations(*coordinator, {}, a->run, a->as_json);
      });
  activations_cmd->add_option("run", a->run, std::string("the extract run: ") + kRunHelp);
  activations_cmd->add_flag("--json", a->as_json, "machine-readable output");
  ActivationsGet& get = a->get;
  auto* get_cmd =
      activations_cmd->add_subcommand("get", "write rows of one layer to .npy / .safetensors (or .npy on stdout)");
  a->get_cmd = get_cmd;
  get_cmd->add_option("run", get.run, std::string("the extract run: ") + kRunHelp)->required();
  get_cmd->add_option("--layer", get.layer,
                      "layer index (implied by a TransformerLens --site such as blocks.6.hook_resid_post)");
  get_cmd->add_option("--site", get.site,
                      "a captured site: resid_pre, resid_mid, resid_post, attn_out, mlp_out, q, k, v, attn_pattern, "
                      "mlp_hidden, final_norm, logits, logits_ids (default: the run's only site, else resid_post), or "
                      "TransformerLens' hook name with its layer (blocks.6.hook_resid_post; docs/extract.md)");
  get_cmd->add_option("--head", get.head,
                      "only this attention head of a site with heads (q, k, v, attn_pattern): rows [n, head_dim] or "
                      "[n, sequence] instead of [n, heads, ...]");
  get_cmd->add_option("--rows", get.rows, "token rows A:B (default: every stored row)");
  get_cmd
      ->add_option("--out", get.out,
                   "FILE.npy, FILE.safetensors, or - for .npy on stdout (an existing FILE is refused)")
      ->required();
  get_cmd->add_flag("--force", get.force, "replace an existing --out file");
  get_cmd->add_flag(
      "--with-tokens", get.with_tokens,
      "also write the rows' tokens beside --out: NAME.tokens.npy, int64 [rows, 3] (token id, document, position)");
  get_cmd->add_option(
      "--store", get.stores,
      "read this worker store directory instead of asking the cluster (works with it down); once per worker");
  activations_cmd->add_option("--store", get.stores, "list from these worker store directories instead of the cluster");
}

}  // namespace strata::cli

// Submitting a run spec (cluster_api.h): the checks `strata submit` makes before anything starts,
// the tokenizing of data.format = "text", the memory estimate, then SubmitRun. What is said along
// the way goes to SubmitOptions::log (stderr by default): stdout stays the caller's (the CLI's first
// line there is the run id, for scripts).
#include <filesystem>
#include <iostream>
#include <utility>

#include "client/cluster_api.h"
#include "client/cluster_calls.h"
#include "client/estimate.h"
#include "client/spec_overrides.h"
#include "client/text_data.h"
#include "model/hf_checkpoint.h"
#include "model/peft_adapter.h"
#include "schema/envelope.h"
#include "spec/run_spec.h"

namespace strata::client {

namespace fs = std::filesystem;

namespace {

// `--resume RUN[@STEP]`: the run id and step (0 = its latest complete checkpoint).
Result<std::pair<std::string, int64_t>> ParseResume(const std::string& text) {
  const size_t at = text.rfind('@');
  if (at == std::string::npos) return std::make_pair(text, int64_t{0});
  const std::string step = text.substr(at + 1);
  if (step.empty() || step.find_first_not_of("0123456789") != std::string::npos || std::stoll(step) <= 0) {
    return InvalidArgument("--resume " + text + ": the step after @ must be a positive number, e.g. --resume " +
                           text.substr(0, at) + "@6 (or leave it out for the latest checkpoint)");
  }
  return std::make_pair(text.substr(0, at), static_cast<int64_t>(std::stoll(step)));
}

}  // namespace

Result<std::string> SubmitText(const Target& target, const std::string& text, const std::string& base,
                               const std::string& label, const SubmitOptions& o) {
  std::ostream& log = o.log ? *o.log : std::cerr;
  auto spec = ParseRunSpec(text, base, /*check_files=*/true);
  if (!spec.ok()) return InvalidArgument(label + ": " + spec.status().message());
  if (!spec->model.init_from.empty()) {  // the weights' headers, before anything starts
    if (Status weights = model::CheckHfCheckpoint(spec->model.init_from, spec->model); !weights.ok()) {
      return InvalidArgument(label + ": " + weights.message());
    }
  }
  if (Status adapter = model::CheckAdapterFrom(spec->model, spec->lora); !adapter.ok()) {
    return InvalidArgument(label + ": " + adapter.message());
  }
  // data.format = "text": tokenized once into a cached u32 file, which the run then reads.
  if (Status text_data = PrepareTextData(&*spec, StateDir(target), o.progress_every_s, log); !text_data.ok()) {
    return text_data.code() == StatusCode::kInvalidArgument ? InvalidArgument(label + ": " + text_data.message())
                                                            : text_data;
  }
  std::pair<std::string, int64_t> resume_from;
  if (!o.resume.empty()) {
    STRATA_ASSIGN_OR_RETURN(resume_from, ParseResume(o.resume));
  }
  STRATA_ASSIGN_OR_RETURN(const std::string endpoint, ResolveEndpoint(target));
  if (!resume_from.first.empty()) {
    STRATA_ASSIGN_OR_RETURN(resume_from.first, ResolveRun(target, resume_from.first));
  }
  // A fixed mesh needs dp x pp x tp workers at once: more than the cluster has would wait
  // forever unless workers come, so that takes SubmitOptions::queue (--queue).
  if (const ParallelSpec& p = spec->parallel; !spec->is_extract() && !p.automatic.count("dp") &&
                                              !p.automatic.count("pp") && !p.automatic.count("tp") && !o.queue) {
    STRATA_ASSIGN_OR_RETURN(auto live, CountLiveWorkers(target, endpoint));
    if (p.workers() > live) {
      return InvalidArgument(
          label + ": parallel.dp x parallel.pp x parallel.tp = " + std::to_string(p.dp) + " x " + std::to_string(p.pp) +
          " x " + std::to_string(p.tp) + " = " + std::to_string(p.workers()) + " workers, but the cluster has " +
          std::to_string(live) +
          " live; lower them or set them to \"auto\", start more workers (`strata up --workers N`), or pass --queue to "
          "submit it to wait for workers");
    }
  }
  STRATA_ASSIGN_OR_RETURN(auto client, MakeClient(target, endpoint, target.timeout_ms));
  auto estimate = EstimateForSubmit(*spec, *client);
  if (!estimate.ok() && !o.skip_estimate) return estimate.status();
  if (!estimate.ok()) {
    std::string why = estimate.status().message();
    if (why.rfind("not submitted: ", 0) == 0) why = why.substr(15);
    log << "strata: submitting anyway (--skip-estimate): " << why
        << "; a rank that runs out of memory makes the run re-plan (smaller micro-batch first) and replay the step"
        << std::endl;
  } else if (!estimate->empty()) {
    log << "strata: " << *estimate << std::endl;
  }
  schema::EnvelopeBuilder req;
  auto submit = req.root().initSubmitRun();
  submit.setSpecToml(RunSpecToToml(*spec));
  submit.setResumeRun(resume_from.first);
  submit.setResumeStep(resume_from.second);
  if (spec->lora.enabled) {
    // A LoRA checkpoint holds the adapters only: a resume from it must go back onto this base.
    STRATA_ASSIGN_OR_RETURN(const std::string identity, model::BaseIdentity(spec->model, spec->train.seed));
    submit.setBaseIdentity(identity);
  }
  STRATA_ASSIGN_OR_RETURN(auto reply, client->Call(req));
  return std::string(reply->root().getSubmitted().getRunId().cStr());
}

Result<std::string> Submit(const Target& target, const std::string& spec_path, const SubmitOptions& options) {
  // A regular file of at most 1 MiB: not /dev/zero, not a FIFO.
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadSpecFile(spec_path, "run spec"));
  if (!options.overrides.empty()) {
    STRATA_ASSIGN_OR_RETURN(text, ApplySpecOverrides(text, options.overrides));
  }
  return SubmitText(target, text, fs::absolute(spec_path).parent_path().string(), spec_path, options);
}

}  // namespace strata::client

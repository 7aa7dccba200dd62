// The run spec as a Cap'n Proto struct (schema/spec.capnp): the form a validated spec travels in
// behind the edge where its TOML was parsed - the coordinator's assignments (with the plan in
// `parallel`), the journal's run records and the status replies clients read.
//
// Writing copies every field. Reading checks what a struct from another process could get wrong
// without the TOML parser's help: each enum holds one of its values, each number lies within the
// spec's bounds (spec_bounds) and the fields agree (ValidateModelSpec, ValidateParallel), so a
// damaged or foreign message is an error naming the field, never a division by zero or a
// multi-terabyte allocation. Files are not checked: the process that opens them does.
#pragma once

#include "common/status.h"
#include "schema/messages.capnp.h"
#include "schema/spec.capnp.h"
#include "spec/run_spec.h"

namespace strata {

void WriteRunSpec(const RunSpec& spec, wire::RunSpec::Builder out);

// `what` names the message in errors ("the assignment's run spec").
Result<RunSpec> ReadRunSpec(wire::RunSpec::Reader in, const std::string& what);

// The spec of a stored or reported run: its struct, or, for a record the journal wrote before
// specs travelled as structs, its canonical TOML (ParseStoredRunSpec).
Result<RunSpec> ReadRunRecordSpec(RunRecord::Reader record);

}  // namespace strata

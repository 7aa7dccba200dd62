// Messages off the network: every receiver (coordinator, worker, store server, CLI, activations
// reader) goes through schema::DecodeEnvelope. It must reject anything malformed with a Status and
// never throw or crash; what it accepts must be readable field by field without an exception
// (its contract in schema/envelope.h).
#include <cstddef>
#include <cstdint>

#include "fuzz/read_everything.h"
#include "schema/envelope.h"
#include "spec/run_spec_capnp.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::schema;
  auto decoded = DecodeEnvelope(std::span<const uint8_t>(data, size));
  if (!decoded.ok()) return 0;
  Envelope::Reader root = (*decoded)->root();
  STRATA_CHECK(root.getVersion() == kProtocolVersion);
  strata::fuzz::ReadEverything(root);
  // The helpers receivers call on parts of a message.
  switch (root.which()) {
    case Envelope::ERROR:
      (void)StatusFromError(root.getError());
      break;
    case Envelope::REGISTER_WORKER:
      (void)ReadMemoryStats(root.getRegisterWorker().getMemory());
      break;
    case Envelope::HEARTBEAT:
      (void)ReadMemoryStats(root.getHeartbeat().getMemory());
      break;
    case Envelope::STATUS_REPLY:
      for (auto run : root.getStatusReply().getRuns()) {
        (void)RunStateName(run.getState());
        (void)strata::ReadRunRecordSpec(run);
      }
      break;
    case Envelope::ASSIGN_TASK:
      (void)strata::ReadRunSpec(root.getAssignTask().getSpec(), "the assignment's run spec");
      break;
    case Envelope::WORKERS_REPLY:
      for (auto worker : root.getWorkersReply().getWorkers()) {
        (void)WorkerStateName(worker.getState());
        (void)ReadMemoryStats(worker.getMemory());
      }
      break;
    case Envelope::ACTIVATION_DATA:
      (void)DTypeName(root.getActivationData().getDtype());
      break;
    default:
      break;
  }
  return 0;
}

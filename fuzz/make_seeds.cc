// Writes seed corpora for the fuzzers: valid inputs of every kind each one reads, built with the
// same encoders Strata writes with, so libFuzzer starts from the shapes real data has.
//   strata_fuzz_seeds DIR   ->   DIR/envelope_fuzz/seed-000, DIR/tensor_record_fuzz/..., ...
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "schema/envelope.h"
#include "spec/run_spec_capnp.h"
#include "storage/records.h"
#include "storage/safetensors.h"
#include "storage/shard_store.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using storage::DType;

class SeedWriter {
 public:
  explicit SeedWriter(fs::path dir) : dir_(std::move(dir)) {}
  void Add(const std::string& fuzzer, const std::string& bytes) {
    const fs::path dir = dir_ / fuzzer;
    fs::create_directories(dir);
    char name[32];
    snprintf(name, sizeof(name), "seed-%03d", count_[fuzzer]++);
    std::ofstream(dir / name, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  int total() const {
    int n = 0;
    for (const auto& [fuzzer, count] : count_) n += count;
    return n;
  }

 private:
  fs::path dir_;
  std::map<std::string, int> count_;
};

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * 37 + 11);
  return out;
}

void FillManifest(::CheckpointManifest::Builder m) {
  m.setRunId("run-1");
  m.setStep(20);
  m.setCommittedUnixMs(1700000000000);
  auto shards = m.initShards(2);
  for (unsigned r = 0; r < 2; ++r) {
    shards[r].setStep(20);
    shards[r].setStorePath("/var/lib/strata/worker-" + std::to_string(r));
    auto tensors = shards[r].initTensors(2);
    tensors[0].setName("h.0.attn.c_attn.weight");
    tensors[0].setDtype(::DType::F32);
    auto shape = tensors[0].initShape(2);
    shape.set(0, 64);
    shape.set(1, 192);
    tensors[0].setChecksum(0x1234 + r);
    tensors[0].setSizeBytes(64 * 192 * 4);
    tensors[1].setName("step");
    tensors[1].setDtype(::DType::I64);
    tensors[1].initShape(0);
    tensors[1].setSizeBytes(8);
  }
}

void FillRunRecord(::RunRecord::Builder r) {
  r.setRunId("run-1");
  r.setName("gpt2-tiny");
  r.setSpecToml("name = \"gpt2-tiny\"\n[model]\nfamily = \"gpt2\"\n");
  r.setState(::RunState::RUNNING);
  r.setCreatedUnixMs(1700000000000);
  r.setUpdatedUnixMs(1700000001000);
  r.setTotalSteps(100);
  r.setStep(3);
  auto losses = r.initLosses(3);
  for (unsigned i = 0; i < 3; ++i) losses.set(i, 5.5 - i);
  auto workers = r.initWorkers(2);
  workers.set(0, "w-0");
  workers.set(1, "w-1");
  r.setWorldSize(2);
  r.setTaskToken(77);
  auto handled = r.initHandled(2);
  handled[0].setKind("oom");
  handled[0].setCount(3);
  handled[1].setKind("worker-lost");
  handled[1].setCount(1);
  r.setTokensPerSecond(1234.5);
  r.setKind("train");
  auto memory = r.initMemory(2);
  for (unsigned i = 0; i < 2; ++i) {
    memory[i].setWorker(i == 0 ? "w-0" : "w-1");
    memory[i].setEstimateBytes(uint64_t{7} << 30);
    memory[i].setWorkspaceBytes(uint64_t{1} << 30);
    memory[i].setMeasuredPeakBytes(uint64_t{7} << 30);
  }
}

void FillChunk(::ChunkLocation::Builder c, uint64_t i) {
  c.setChunk(i);
  c.setRowBegin(512 * i);
  c.setRowCount(512);
  c.setBytes(512 * 64 * 4);
  c.setWorker("w-0");
  c.setStorePath("/var/lib/strata/worker-0");
  c.setServeAddress("tcp://127.0.0.1:5601");
}

void WriteMemory(::MemoryStats::Builder m) {
  MemorySnapshot s;
  s.device = "cuda:0";
  s.total_bytes = 80ull << 30;
  s.free_bytes = 70ull << 30;
  s.allocated_bytes = 1 << 30;
  s.reserved_bytes = 2 << 30;
  s.peak_bytes = 3 << 30;
  schema::WriteMemoryStats(s, m);
}

void EnvelopeSeeds(SeedWriter& out) {
  const std::string kFuzzer = "envelope_fuzz";
  auto add = [&](auto fill) {
    schema::EnvelopeBuilder b(7);
    fill(b.root());
    out.Add(kFuzzer, b.Serialize());
  };
  add([](Envelope::Builder e) { e.setAck(); });
  add([](Envelope::Builder e) { e.setShutdown(); });
  out.Add(kFuzzer, schema::MakeErrorReply(3, NotFound("run 'x' is not known; list runs with strata status")));
  add([](Envelope::Builder e) {
    auto r = e.initRegisterWorker();
    r.setName("worker-0");
    r.setHost("node-1");
    r.setPid(4242);
    WriteMemory(r.initMemory());
    r.setStorePath("/var/lib/strata/worker-0");
    r.setDataAddress("tcp://10.0.0.1:5600");
    r.setCurrentRun("run-1");
    r.setCurrentStep(12);
    r.setServeAddress("tcp://10.0.0.1:5601");
  });
  add([](Envelope::Builder e) {
    auto h = e.initHeartbeat();
    h.setWorkerId("w-0");
    WriteMemory(h.initMemory());
    h.setCurrentRun("run-1");
    h.setCurrentStep(5);
  });
  add([](Envelope::Builder e) {
    auto r = e.initRegistered();
    r.setWorkerId("w-0");
    r.setHeartbeatIntervalMs(1000);
  });
  add([](Envelope::Builder e) {
    auto a = e.initAssignTask();
    a.setRunId("run-1");
    RunSpec spec;
    spec.name = "x";
    spec.parallel.dp = 2;
    WriteRunSpec(spec, a.initSpec());
    a.setRank(1);
    a.setWorldSize(2);
    auto peers = a.initPeerDataAddresses(2);
    peers.set(0, "tcp://10.0.0.1:5600");
    peers.set(1, "tcp://10.0.0.2:5600");
    a.setTaskToken(99);
    auto chunks = a.initChunks(3);
    for (unsigned i = 0; i < 3; ++i) chunks.set(i, 2 * i);
    FillManifest(a.initResumeFrom());
  });
  add([](Envelope::Builder e) {
    auto c = e.initCancelTask();
    c.setRunId("run-1");
    c.setReason("cancelled by the user");
  });
  add([](Envelope::Builder e) {
    auto t = e.initTaskEvent();
    t.setRunId("run-1");
    t.setRank(0);
    auto s = t.initStep();
    s.setStep(4);
    s.setLoss(3.25);
    s.setTokensPerSecond(900);
    s.setSchedulePeakBytes(uint64_t{5} << 30);
    s.setUpdatePeakBytes(uint64_t{4} << 30);
  });
  add([](Envelope::Builder e) {
    auto t = e.initTaskEvent();
    t.setRunId("run-1");
    auto u = t.initCheckpointUnreadable();
    u.setSourceRun("run-0");
    u.setStep(8);
    u.setWhy("checkpoint tensor 'param/wte.weight' is truncated");
  });
  add([](Envelope::Builder e) {
    auto t = e.initTaskEvent();
    t.setRunId("run-1");
    capnp::MallocMessageBuilder manifest;
    FillManifest(manifest.initRoot<::CheckpointManifest>());
    t.setCheckpointSaved(manifest.getRoot<::CheckpointManifest>().asReader().getShards()[0]);
  });
  add([](Envelope::Builder e) {
    auto t = e.initTaskEvent();
    t.setRunId("run-1");
    t.setFailed("CUDA out of memory");
  });
  add([](Envelope::Builder e) {
    auto t = e.initTaskEvent();
    t.setRunId("run-2");
    auto c = t.initChunkStored();
    c.setChunk(3);
    c.setRowBegin(1536);
    c.setRowCount(512);
    c.setBytes(1 << 20);
    c.setComputed(true);
  });
  add([](Envelope::Builder e) {
    auto t = e.initTaskEvent();
    auto n = t.initNotice();
    n.setKind("oom");
    n.setMessage("halved the batch to 4");
  });
  add([](Envelope::Builder e) {
    auto t = e.initTaskEvent();
    t.setRunId("run-1");
    t.setRank(1);
    t.setTaskToken(77);
    auto o = t.initOutOfMemory();
    o.setStep(3);
    o.setMicroBatch(8);
    o.setIntactStep(2);
    o.setDetail("CUDA out of memory. Tried to allocate 192.00 MiB");
    o.setFreeBytes(74 << 20);
    o.setTotalBytes(uint64_t{8} << 30);
  });
  add([](Envelope::Builder e) {
    auto t = e.initTaskEvent();
    t.setRunId("run-1");
    auto st = t.initStalled();
    st.setMissingRank(3);
    st.setDetail("rank 0 waited 120 s for rank 3");
  });
  add([](Envelope::Builder e) {
    auto c = e.initCancelTask();
    c.setRunId("run-1");
    c.setReason("rank 1 ran out of memory");
    c.setSnapshotStep(2);
  });
  add([](Envelope::Builder e) {
    auto s = e.initSubmitRun();
    s.setSpecToml("name = \"gpt2-tiny\"\n");
    s.setResumeRun("run-1");
    s.setResumeStep(20);
  });
  add([](Envelope::Builder e) { e.initSubmitted().setRunId("run-3"); });
  add([](Envelope::Builder e) { e.initStatusRequest().setRunId(""); });
  add([](Envelope::Builder e) {
    auto runs = e.initStatusReply().initRuns(2);
    FillRunRecord(runs[0]);
    FillRunRecord(runs[1]);
    runs[1].setState(::RunState::FAILED);
    runs[1].setMessage("worker lost");
  });
  add([](Envelope::Builder e) { e.setWorkersRequest(); });
  add([](Envelope::Builder e) {
    auto workers = e.initWorkersReply().initWorkers(2);
    for (unsigned i = 0; i < 2; ++i) {
      workers[i].setWorkerId("w-" + std::to_string(i));
      workers[i].setName("worker-" + std::to_string(i));
      workers[i].setHost("node-1");
      workers[i].setPid(100 + i);
      workers[i].setState(i ? ::WorkerState::LOST : ::WorkerState::BUSY);
      WriteMemory(workers[i].initMemory());
      workers[i].setLastHeartbeatMsAgo(250);
    }
  });
  add([](Envelope::Builder e) { e.initEventsRequest().setRunId("run-1"); });
  add([](Envelope::Builder e) {
    auto events = e.initEventsReply().initEvents(2);
    events[0].setUnixMs(1);
    events[0].setKind("submitted");
    events[0].setMessage("by alice");
    events[1].setUnixMs(2);
    events[1].setKind("worker-lost");
  });
  add([](Envelope::Builder e) { e.initCancelRun().setRunId("run-1"); });
  add([](Envelope::Builder e) { e.initCheckpointsRequest().setRunId("run-1"); });
  add([](Envelope::Builder e) { FillManifest(e.initCheckpointsReply().initCheckpoints(1)[0]); });
  add([](Envelope::Builder e) { e.initActivationsRequest().setRunId("run-2"); });
  add([](Envelope::Builder e) {
    auto a = e.initActivationsReply();
    a.setRunId("run-2");
    a.setState(::RunState::FINISHED);
    auto layers = a.initLayers(2);
    layers.set(0, 0);
    layers.set(1, 1);
    auto sites = a.initSites(2);
    sites.set(0, "resid_post");
    sites.set(1, "mlp_out");
    a.setDtype(::DType::BF16);
    a.setHidden(64);
    a.setTotalRows(1024);
    auto chunks = a.initChunks(2);
    FillChunk(chunks[0], 0);
    FillChunk(chunks[1], 1);
  });
  add([](Envelope::Builder e) {
    auto r = e.initReadActivation();
    r.setRunId("run-2");
    r.setLayer(1);
    r.setSite("resid_post");
    r.setRowBegin(512);
  });
  add([](Envelope::Builder e) {
    auto d = e.initActivationData();
    d.setDtype(::DType::F32);
    auto shape = d.initShape(2);
    shape.set(0, 512);
    shape.set(1, 64);
    d.setChecksum(42);
  });
}

void StoreRecordSeeds(SeedWriter& out) {
  // The first byte picks the type (store_record_fuzz.cc): 0 RunRecord, 1 Event, 2 StepReport,
  // 3 CheckpointManifest, 4 CheckpointShard, 5 ChunkLocation.
  auto add = [&](char type, const std::string& bytes) { out.Add("store_record_fuzz", std::string(1, type) + bytes); };
  capnp::MallocMessageBuilder run;
  FillRunRecord(run.initRoot<::RunRecord>());
  add(0, schema::StructToBytes(run.getRoot<::RunRecord>().asReader()));
  capnp::MallocMessageBuilder event;
  auto e = event.initRoot<::Event>();
  e.setUnixMs(1700000000000);
  e.setKind("checkpoint");
  e.setMessage("step 20 committed");
  add(1, schema::StructToBytes(e.asReader()));
  capnp::MallocMessageBuilder step;
  auto s = step.initRoot<::StepReport>();
  s.setStep(7);
  s.setLoss(2.5);
  s.setTokensPerSecond(1e4);
  add(2, schema::StructToBytes(s.asReader()));
  capnp::MallocMessageBuilder manifest;
  FillManifest(manifest.initRoot<::CheckpointManifest>());
  add(3, schema::StructToBytes(manifest.getRoot<::CheckpointManifest>().asReader()));
  add(4, schema::StructToBytes(manifest.getRoot<::CheckpointManifest>().asReader().getShards()[1]));
  capnp::MallocMessageBuilder chunk;
  FillChunk(chunk.initRoot<::ChunkLocation>(), 4);
  add(5, schema::StructToBytes(chunk.getRoot<::ChunkLocation>().asReader()));
}

struct SeedTensor {
  DType dtype;
  std::vector<int64_t> shape;
};
const std::vector<SeedTensor> kTensors = {
    {DType::kF32, {4, 3}}, {DType::kBF16, {2, 2, 2}}, {DType::kI64, {}}, {DType::kU8, {0, 5}}, {DType::kF16, {7}},
};

void TensorRecordSeeds(SeedWriter& out) {
  for (const SeedTensor& t : kTensors) {
    std::vector<uint8_t> bytes = Pattern(*storage::records::ByteSize(t.dtype, t.shape));
    storage::TensorView view{t.dtype, t.shape, bytes};
    std::string value = storage::records::EncodeTensorPrefix(view, storage::Checksum(bytes));
    value.append(bytes.begin(), bytes.end());
    out.Add("tensor_record_fuzz", value);
    const uint64_t size = *storage::records::ByteSize(t.dtype, t.shape);
    out.Add("tensor_record_fuzz",
            storage::records::EncodeFileRef({"20-4242-1764200000-0.bin", 4096, size, 77, t.dtype, t.shape}));
  }
}

void ManifestSeeds(SeedWriter& out) {
  storage::CheckpointInfo info{"run-1", 20, {}};
  out.Add("manifest_fuzz", storage::records::EncodeManifest(info));
  for (const SeedTensor& t : kTensors) {
    const uint64_t size = *storage::records::ByteSize(t.dtype, t.shape);
    info.tensors.push_back({"t" + std::to_string(info.tensors.size()), t.dtype, t.shape, size * 31 + 7, size});
  }
  out.Add("manifest_fuzz", storage::records::EncodeManifest(info));
}

void SafetensorsSeeds(SeedWriter& out) {
  for (size_t n = 1; n <= kTensors.size(); n += 2) {
    std::vector<storage::SafetensorsEntry> entries;
    std::string data;
    for (size_t i = 0; i < n; ++i) {
      entries.push_back({"model.layers." + std::to_string(i) + ".weight", kTensors[i].dtype, kTensors[i].shape});
      std::vector<uint8_t> bytes = Pattern(*storage::records::ByteSize(kTensors[i].dtype, kTensors[i].shape));
      data.append(bytes.begin(), bytes.end());
    }
    std::map<std::string, std::string> metadata;
    if (n > 1) metadata["format"] = "pt";
    out.Add("safetensors_fuzz", storage::SafetensorsPrefix(entries, metadata).value() + data);
  }
}

void KeySeeds(SeedWriter& out) {
  // [op count][ops: even = string piece, odd = u64 piece][key] (key_fuzz.cc)
  out.Add("key_fuzz", std::string("\x03\x00\x01\x00", 4) + storage::EncodeKeyString("run-1") +
                          storage::EncodeKeyU64(20) + storage::EncodeKeyString("h.0.mlp.c_fc.weight"));
  out.Add("key_fuzz", std::string("\x04\x00\x00\x01\x01", 5) + storage::EncodeKeyString("run-2") +
                          storage::EncodeKeyString("resid_post") + storage::EncodeKeyU64(3) +
                          storage::EncodeKeyU64(1536));
}

void NpyHeaderSeeds(SeedWriter& out) {
  // np.save's headers (format 1.0 and 2.0) of token and document-offset arrays.
  struct Header {
    int major;
    const char* descr;
    uint64_t n;
  };
  for (const Header& h : {Header{1, "<u2", 1000}, Header{1, "<u4", 7}, Header{2, "<i8", 3}, Header{1, "|u1", 0},
                          Header{3, "<u8", 12345678901}}) {
    const auto& [major, descr, n] = h;
    std::string dict =
        std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(n) + ",), }";
    const size_t prefix = major == 1 ? 10 : 12;
    dict.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
    dict += '\n';
    std::string bytes = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
    for (size_t i = 0; i < prefix - 8; ++i) bytes += static_cast<char>((dict.size() >> (8 * i)) & 0xff);
    out.Add("npy_header_fuzz", bytes + dict + std::string(16, '\x01'));
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: strata_fuzz_seeds DIR  (writes DIR/<fuzzer>/seed-NNN)\n";
    return 2;
  }
  strata::SeedWriter out(argv[1]);
  strata::EnvelopeSeeds(out);
  strata::StoreRecordSeeds(out);
  strata::TensorRecordSeeds(out);
  strata::ManifestSeeds(out);
  strata::SafetensorsSeeds(out);
  strata::KeySeeds(out);
  strata::NpyHeaderSeeds(out);
  std::cout << "strata_fuzz_seeds: " << out.total() << " seeds in " << argv[1] << "\n";
  return 0;
}

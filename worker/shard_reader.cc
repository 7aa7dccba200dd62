// OpenShardReader (worker/task.h): where a resuming rank reads a checkpoint shard from. A store
// on this host is opened by path (its owner may be running: read-only, beside it); a store on
// another host is read through its worker's store server, the only way to it. The shard's own
// store comes first, then its copies (made on other hosts when the cluster spans hosts), so a
// host that is gone with its disks costs nothing but the first attempt.
#include <mutex>

#include "client/store_client.h"
#include "common/thread_annotations.h"
#include "worker/task.h"

namespace strata::worker {
namespace {

class LocalShardReader final : public ShardReader {
 public:
  LocalShardReader(storage::ShardStore* store, std::unique_ptr<storage::ShardStore> opened, std::string key_run,
                   int64_t step, std::string where)
      : store_(store),
        opened_(std::move(opened)),
        key_run_(std::move(key_run)),
        step_(step),
        where_(std::move(where)) {}

  Status ReadInto(const std::string& name, storage::DType dtype, std::span<uint8_t> out) override {
    return store_->ReadCheckpointTensorInto(key_run_, step_, name, dtype, out);
  }
  const std::string& where() const override { return where_; }
  bool remote() const override { return false; }

 private:
  storage::ShardStore* store_;
  std::unique_ptr<storage::ShardStore> opened_;  // null when store_ is the worker's own
  std::string key_run_;
  int64_t step_;
  std::string where_;
};

class RemoteShardReader final : public ShardReader {
 public:
  RemoteShardReader(std::unique_ptr<client::StoreClient> client, std::string key_run, int64_t step, std::string where)
      : client_(std::move(client)), key_run_(std::move(key_run)), step_(step), where_(std::move(where)) {}

  Status ReadInto(const std::string& name, storage::DType, std::span<uint8_t> out) override {
    MutexLock lock(mutex_);  // one socket: one request at a time
    return client_->ReadCheckpointPieceInto(key_run_, step_, name, out);
  }
  const std::string& where() const override { return where_; }
  bool remote() const override { return true; }

 private:
  Mutex mutex_;
  const std::unique_ptr<client::StoreClient> client_ STRATA_PT_GUARDED_BY(mutex_);
  std::string key_run_;
  int64_t step_;
  std::string where_;
};

}  // namespace

Result<std::unique_ptr<ShardReader>> OpenShardReader(const ResumePoint& resume, const ResumePoint::Shard& shard,
                                                     storage::ShardStore* own_store, const std::string& own_store_path,
                                                     const ShardAccess& access) {
  std::vector<ResumePoint::Location> copies = shard.copies;
  if (copies.empty()) copies.push_back({shard.store_path, resume.run_id, access.host, ""});
  std::string tried;
  for (const auto& copy : copies) {
    const std::string key_run = copy.key_run.empty() ? resume.run_id : copy.key_run;
    if (own_store && copy.store_path == own_store_path) {
      return std::unique_ptr<ShardReader>(
          std::make_unique<LocalShardReader>(own_store, nullptr, key_run, resume.step, copy.store_path));
    }
    if (copy.host == access.host) {
      storage::StoreOptions options;
      options.create_if_missing = false;
      options.read_only = true;  // the store's owner may be running: read beside it
      auto open = storage::ShardStore::Open(copy.store_path, options);
      if (open.ok()) {
        storage::ShardStore* store = open->get();
        return std::unique_ptr<ShardReader>(
            std::make_unique<LocalShardReader>(store, std::move(open).value(), key_run, resume.step, copy.store_path));
      }
      tried += "; " + copy.store_path + ": " + open.status().message();
      continue;
    }
    if (copy.serve_address.empty()) {
      tried += "; " + copy.store_path + " on host " + copy.host + ": no live worker serves it";
      continue;
    }
    auto client = client::StoreClient::Connect(copy.serve_address, access.keys, access.timeout_ms);
    if (client.ok()) {
      return std::unique_ptr<ShardReader>(std::make_unique<RemoteShardReader>(
          std::move(client).value(), key_run, resume.step,
          copy.store_path + " on host " + copy.host + " (via " + copy.serve_address + ")"));
    }
    tried += "; " + copy.store_path + " on host " + copy.host + ": " + client.status().message();
  }
  return Unavailable("no copy of the shard written to " + shard.store_path + " is reachable from host " + access.host +
                     tried);
}

}  // namespace strata::worker

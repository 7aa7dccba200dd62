// Several metadata writes as one atomic, synced RocksDB batch: all are durable or none is (the
// coordinator's run record and its events). A free function rather than a ShardStore method so
// that shard_store.h, which every worker translation unit includes, keeps its layout; stores
// other than ShardStore::Open's write the puts one by one.
#pragma once

#include <span>
#include <string>
#include <utility>

#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::storage {

struct MetadataPut {
  std::string key;
  std::string value;
};

Status PutMetadataBatch(ShardStore& store, std::span<const MetadataPut> puts);

}  // namespace strata::storage

@0xd3a1f0c2b4e59a71;
# Headers of records in the shard stores (storage/). Raw tensor bytes follow the header in the
# same RocksDB value; they are never inside a Cap'n Proto message.

enum DType { f32 @0; f16 @1; bf16 @2; f64 @3; i64 @4; i32 @5; u16 @6; u8 @7; }
enum ByteOrder { little @0; big @1; }
enum Codec { raw @0; }

struct TensorHeader {
  dtype @0 :DType;
  shape @1 :List(Int64);
  byteOrder @2 :ByteOrder;
  codec @3 :Codec;
  checksum @4 :UInt64;     # XXH3-64 of the raw bytes that follow
  sizeBytes @5 :UInt64;
}

struct CheckpointManifestRecord {
  run @0 :Text;
  step @1 :Int64;
  tensors @2 :List(Entry);
  struct Entry {
    name @0 :Text;
    dtype @1 :DType;
    shape @2 :List(Int64);
    checksum @3 :UInt64;
    sizeBytes @4 :UInt64;
  }
}

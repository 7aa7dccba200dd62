#include "fuzz/read_everything.h"

#include <cstring>

namespace strata::fuzz {
namespace {

uint64_t ReadValue(capnp::DynamicValue::Reader value);

uint64_t ReadStruct(capnp::DynamicStruct::Reader s) {
  uint64_t sum = 0;
  for (capnp::StructSchema::Field field : s.getSchema().getNonUnionFields()) sum += ReadValue(s.get(field));
  KJ_IF_MAYBE (field, s.which()) {
    sum += ReadValue(s.get(*field));
  }  // unknown members: nullptr
  return sum;
}

uint64_t ReadValue(capnp::DynamicValue::Reader value) {
  switch (value.getType()) {
    case capnp::DynamicValue::BOOL:
      return value.as<bool>();
    case capnp::DynamicValue::INT:
      return static_cast<uint64_t>(value.as<int64_t>());
    case capnp::DynamicValue::UINT:
      return value.as<uint64_t>();
    case capnp::DynamicValue::FLOAT:
      return static_cast<uint64_t>(value.as<double>() == 0.0);
    case capnp::DynamicValue::TEXT:
      return std::strlen(value.as<capnp::Text>().cStr());  // as receivers do
    case capnp::DynamicValue::DATA:
      return value.as<capnp::Data>().size();
    case capnp::DynamicValue::ENUM:
      return value.as<capnp::DynamicEnum>().getRaw();
    case capnp::DynamicValue::STRUCT:
      return ReadStruct(value.as<capnp::DynamicStruct>());
    case capnp::DynamicValue::LIST: {
      uint64_t sum = 0;
      for (capnp::DynamicValue::Reader element : value.as<capnp::DynamicList>()) sum += ReadValue(element);
      return sum;
    }
    default:
      return 0;  // VOID, ANY_POINTER, CAPABILITY: nothing to read
  }
}

}  // namespace

uint64_t ReadEverything(capnp::DynamicStruct::Reader root) { return ReadStruct(root); }

}  // namespace strata::fuzz

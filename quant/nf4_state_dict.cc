// bitsandbytes' state-dict layout of an Nf4Tensor (nf4.h): ToBnbStateDict / FromBnbStateDict, the
// packed quant-state JSON (BnbQuantStateJson, PythonFloatRepr) and the strict parser that reads it
// back. The quantization itself, and the maths comment, are in nf4.cc.
#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "quant/nf4.h"
#include "quant/nf4_internal.h"

namespace strata::quant {

using internal::CeilDiv;
using internal::CheckedNumel;
using internal::ShapeString;
using internal::ValidBlocksize;

static_assert(std::endian::native == std::endian::little, "state-dict bytes are written little-endian by memcpy");

// ---- the packed JSON -------------------------------------------------------------------------------

std::string PythonFloatRepr(double x) {
  if (std::isnan(x)) return "NaN";  // json.dumps' spelling (allow_nan=True)
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits, from to_chars' scientific form "d.ddde[+-]X".
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::stoi(sci.substr(e + 1));
  // CPython's float_repr_style 'short': positional when -4 <= exponent < 16, else exponent form.
  if (exp10 < -4 || exp10 >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    const int a = exp10 < 0 ? -exp10 : exp10;
    return sign + m + "e" + (exp10 < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
  }
  std::string out;
  if (exp10 < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  } else if (static_cast<size_t>(exp10) + 1 >= digits.size()) {
    out = digits + std::string(static_cast<size_t>(exp10) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(exp10) + 1) + "." + digits.substr(static_cast<size_t>(exp10) + 1);
  }
  return sign + out;
}

std::string BnbQuantStateJson(const Nf4Tensor& t) {
  // json.dumps of QuantState.as_dict()'s non-tensor items, in the dict's insertion order, with
  // json's default separators ", " and ": ". dtype is str(torch.dtype).strip("torch.").
  std::string j = "{\"quant_type\": \"nf4\", \"blocksize\": " + std::to_string(t.blocksize) + ", \"dtype\": \"" +
                  std::string(SourceDtypeName(t.dtype)) + "\", \"shape\": " + ShapeString(t.shape);
  if (t.nested) {
    j += ", \"nested_blocksize\": " + std::to_string(t.nested_blocksize) +
         ", \"nested_dtype\": \"float32\", \"nested_offset\": " + PythonFloatRepr(static_cast<double>(t.offset));
  }
  return j + "}";
}

namespace {

// The JSON that json.dumps writes for the packed quant state: one object of strings, numbers,
// lists of numbers and null. Parsed strictly; anything else is an error.
struct JsonValue {
  enum Kind { kNull, kString, kNumber, kList } kind = kNull;
  std::string str;        // kString; kNumber: the token as written
  double num = 0;         // kNumber
  bool integral = false;  // kNumber written without '.', 'e' or a NaN/Infinity word
  std::vector<JsonValue> list;
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}

  Result<std::vector<std::pair<std::string, JsonValue>>> Object() {
    std::vector<std::pair<std::string, JsonValue>> out;
    Ws();
    if (!Eat('{')) return Err("expected '{'");
    Ws();
    if (Eat('}')) return End(std::move(out));
    while (true) {
      Ws();
      JsonValue key;
      STRATA_RETURN_IF_ERROR(String(key));
      Ws();
      if (!Eat(':')) return Err("expected ':'");
      JsonValue v;
      STRATA_RETURN_IF_ERROR(Value(v, 0));
      out.emplace_back(key.str, std::move(v));
      Ws();
      if (Eat(',')) continue;
      if (Eat('}')) return End(std::move(out));
      return Err("expected ',' or '}'");
    }
  }

 private:
  Result<std::vector<std::pair<std::string, JsonValue>>> End(std::vector<std::pair<std::string, JsonValue>> out) {
    Ws();
    if (i_ != s_.size()) return Err("trailing bytes after the object");
    return out;
  }
  Status Err(const std::string& what) const { return Corruption("JSON at byte " + std::to_string(i_) + ": " + what); }
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool Word(std::string_view w) {
    if (s_.substr(i_, w.size()) == w) {
      i_ += w.size();
      return true;
    }
    return false;
  }
  Status String(JsonValue& v) {
    if (!Eat('"')) return Err("expected a string");
    v.kind = JsonValue::kString;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) return Err("control character in a string");
      if (c == '\\') {
        if (i_ >= s_.size()) return Err("unterminated escape");
        const char e = s_[i_++];
        switch (e) {
          case '"':
          case '\\':
          case '/':
            c = e;
            break;
          case 'n':
            c = '\n';
            break;
          case 't':
            c = '\t';
            break;
          default:
            return Err(std::string("unsupported escape \\") + e);  // bnb's fields are plain ASCII
        }
      }
      v.str += c;
    }
    if (!Eat('"')) return Err("unterminated string");
    return Status::Ok();
  }
  Status Value(JsonValue& v, int depth) {
    Ws();
    if (i_ >= s_.size()) return Err("expected a value");
    const char c = s_[i_];
    if (c == '"') return String(v);
    if (c == '[') {
      if (depth > 2) return Err("lists nested too deeply");
      ++i_;
      v.kind = JsonValue::kList;
      Ws();
      if (Eat(']')) return Status::Ok();
      while (true) {
        JsonValue e;
        STRATA_RETURN_IF_ERROR(Value(e, depth + 1));
        v.list.push_back(std::move(e));
        Ws();
        if (Eat(',')) continue;
        if (Eat(']')) return Status::Ok();
        return Err("expected ',' or ']'");
      }
    }
    if (Word("null")) {
      v.kind = JsonValue::kNull;
      return Status::Ok();
    }
    v.kind = JsonValue::kNumber;
    if (Word("NaN")) {
      v.num = std::numeric_limits<double>::quiet_NaN();
      return Status::Ok();
    }
    if (Word("Infinity")) {
      v.num = std::numeric_limits<double>::infinity();
      return Status::Ok();
    }
    if (Word("-Infinity")) {
      v.num = -std::numeric_limits<double>::infinity();
      return Status::Ok();
    }
    const size_t begin = i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '+' ||
                              s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
      ++i_;
    v.str = std::string(s_.substr(begin, i_ - begin));
    if (v.str.empty()) return Err("expected a value");
    const char* first = v.str.data();
    if (*first == '+') return Err("bad number " + v.str);
    auto r = std::from_chars(first, first + v.str.size(), v.num);
    if (r.ec != std::errc() || r.ptr != first + v.str.size()) return Err("bad number " + v.str);
    v.integral = v.str.find_first_of(".eE") == std::string::npos;
    return Status::Ok();
  }

  std::string_view s_;
  size_t i_ = 0;
};

size_t DtypeSize(const std::string& d) { return d == "U8" ? 1 : d == "F32" ? 4 : 0; }

template <typename T>
StateEntry MakeEntry(std::string name, std::string dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
  StateEntry e{std::move(name), std::move(dtype), std::move(shape), std::vector<uint8_t>(v.size() * sizeof(T))};
  if (!v.empty()) std::memcpy(e.bytes.data(), v.data(), e.bytes.size());
  return e;
}

// The entry `name`, checked to be `dtype` with `count` elements and bytes to match. A shape of
// other rank is accepted when its element count is right (bnb also reads [1, k] weights).
Result<const StateEntry*> Expect(const std::map<std::string_view, const StateEntry*>& by_name, const std::string& name,
                                 const std::string& dtype, int64_t count) {
  auto it = by_name.find(name);
  if (it == by_name.end()) return NotFound("bnb 4-bit state dict: no entry " + name);
  const StateEntry& e = *it->second;
  if (e.dtype != dtype)
    return Corruption("bnb 4-bit state dict: " + name + " has dtype " + e.dtype + ", expected " + dtype);
  Result<int64_t> n = CheckedNumel(e.shape);
  if (!n.ok()) return Corruption("bnb 4-bit state dict: " + name + ": " + n.status().message());
  if (*n != count)
    return Corruption("bnb 4-bit state dict: " + name + " has shape " + ShapeString(e.shape) + " (" +
                      std::to_string(*n) + " elements), expected " + std::to_string(count) + " elements");
  if (e.bytes.size() != static_cast<size_t>(count) * DtypeSize(dtype))
    return Corruption("bnb 4-bit state dict: " + name + " holds " + std::to_string(e.bytes.size()) + " bytes; shape " +
                      ShapeString(e.shape) + " of " + dtype + " needs " +
                      std::to_string(static_cast<size_t>(count) * DtypeSize(dtype)));
  return &e;
}

template <typename T>
std::vector<T> Values(const StateEntry& e) {
  std::vector<T> v(e.bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), e.bytes.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace

Result<std::vector<StateEntry>> ToBnbStateDict(const Nf4Tensor& t, std::string_view weight_name) {
  STRATA_RETURN_IF_ERROR(ValidateNf4(t));
  const std::string w(weight_name);
  std::vector<StateEntry> out;
  out.push_back(MakeEntry(w, "U8", {static_cast<int64_t>(t.codes.size()), 1}, t.codes));
  if (t.nested) {
    out.push_back(MakeEntry(w + ".absmax", "U8", {static_cast<int64_t>(t.absmax_codes.size())}, t.absmax_codes));
  } else {
    out.push_back(MakeEntry(w + ".absmax", "F32", {static_cast<int64_t>(t.absmax.size())}, t.absmax));
  }
  std::vector<float> table(Nf4Table().begin(), Nf4Table().end());
  out.push_back(MakeEntry(w + ".quant_map", "F32", {16}, table));
  if (t.nested) {
    out.push_back(
        MakeEntry(w + ".nested_absmax", "F32", {static_cast<int64_t>(t.nested_absmax.size())}, t.nested_absmax));
    out.push_back(MakeEntry(w + ".nested_quant_map", "F32", {256}, t.nested_quant_map));
  }
  const std::string json = BnbQuantStateJson(t);
  out.push_back(MakeEntry(w + ".quant_state.bitsandbytes__nf4", "U8", {static_cast<int64_t>(json.size())},
                          std::vector<uint8_t>(json.begin(), json.end())));
  return out;
}

Result<Nf4Tensor> FromBnbStateDict(const std::vector<StateEntry>& entries, std::string_view weight_name) {
  const std::string w(weight_name);
  std::map<std::string_view, const StateEntry*> by_name;
  for (const StateEntry& e : entries) by_name.emplace(e.name, &e);

  const std::string qs_key = w + ".quant_state.bitsandbytes__nf4";
  auto qs = by_name.find(qs_key);
  if (qs == by_name.end()) {
    if (by_name.count(w + ".quant_state.bitsandbytes__fp4"))
      return InvalidArgument("bnb 4-bit state dict: " + w +
                             ".quant_state.bitsandbytes__fp4 is FP4; only NF4 is supported");
    return NotFound("bnb 4-bit state dict: no entry " + qs_key);
  }
  if (qs->second->dtype != "U8" || qs->second->shape.size() != 1 ||
      qs->second->bytes.size() != static_cast<size_t>(qs->second->shape[0]))
    return Corruption("bnb 4-bit state dict: " + qs_key + " must be a 1-d U8 tensor of the JSON's bytes");
  const std::string json(qs->second->bytes.begin(), qs->second->bytes.end());
  auto parsed = JsonParser(json).Object();
  if (!parsed.ok()) return Corruption("bnb 4-bit state dict: " + qs_key + ": " + parsed.status().message());

  // QuantState.from_dict asserts the keys are among valid_qs_keys.
  static const char* kValid[] = {"quant_type",       "blocksize",    "dtype",        "shape",
                                 "nested_blocksize", "nested_dtype", "nested_offset"};
  std::map<std::string, JsonValue> f;
  for (auto& [k, v] : *parsed) {
    const std::string& key = k;
    if (std::none_of(std::begin(kValid), std::end(kValid), [&key](const char* s) { return key == s; }))
      return Corruption("bnb 4-bit state dict: " + qs_key + " has field \"" + k +
                        "\", which bitsandbytes does not know");
    if (!f.emplace(k, std::move(v)).second)
      return Corruption("bnb 4-bit state dict: " + qs_key + " repeats field \"" + k + "\"");
  }
  auto field = [&](const std::string& k, JsonValue::Kind kind) -> Result<const JsonValue*> {
    auto it = f.find(k);
    if (it == f.end()) return NotFound("bnb 4-bit state dict: " + qs_key + " has no field \"" + k + "\"");
    if (it->second.kind != kind)
      return Corruption("bnb 4-bit state dict: " + qs_key + " field \"" + k + "\" has the wrong type");
    return &it->second;
  };
  auto int_field = [&](const std::string& k) -> Result<int64_t> {
    STRATA_ASSIGN_OR_RETURN(const JsonValue* v, field(k, JsonValue::kNumber));
    if (!v->integral || std::fabs(v->num) > 9.0e15)
      return Corruption("bnb 4-bit state dict: " + qs_key + " field \"" + k + "\" is not an integer: " + v->str);
    return static_cast<int64_t>(v->num);
  };

  Nf4Tensor t;
  STRATA_ASSIGN_OR_RETURN(const JsonValue* qt, field("quant_type", JsonValue::kString));
  if (qt->str != "nf4")
    return InvalidArgument("bnb 4-bit state dict: " + qs_key + " says quant_type \"" + qt->str +
                           "\"; only nf4 is supported");
  STRATA_ASSIGN_OR_RETURN(t.blocksize, int_field("blocksize"));
  if (!ValidBlocksize(t.blocksize))
    return Corruption("bnb 4-bit state dict: " + qs_key + " blocksize " + std::to_string(t.blocksize) +
                      " is not one bitsandbytes accepts (32, 64, ..., 4096)");
  STRATA_ASSIGN_OR_RETURN(const JsonValue* dt, field("dtype", JsonValue::kString));
  if (dt->str == "float32") {
    t.dtype = SourceDtype::kFloat32;
  } else if (dt->str == "bfloat16") {
    t.dtype = SourceDtype::kBfloat16;
  } else if (dt->str == "float16") {
    t.dtype = SourceDtype::kFloat16;
  } else {
    return Corruption("bnb 4-bit state dict: " + qs_key + " dtype \"" + dt->str +
                      "\" is not float32, bfloat16 or float16");
  }
  STRATA_ASSIGN_OR_RETURN(const JsonValue* sh, field("shape", JsonValue::kList));
  for (const JsonValue& d : sh->list) {
    if (d.kind != JsonValue::kNumber || !d.integral || d.num < 0 || d.num > 9.0e15)
      return Corruption("bnb 4-bit state dict: " + qs_key + " shape holds a non-integer or negative entry");
    t.shape.push_back(static_cast<int64_t>(d.num));
  }
  Result<int64_t> n = CheckedNumel(t.shape);
  if (!n.ok() || *n == 0)
    return Corruption("bnb 4-bit state dict: " + qs_key + " shape " + ShapeString(t.shape) + " is empty or too large");
  const int64_t blocks = CeilDiv(*n, t.blocksize);

  STRATA_ASSIGN_OR_RETURN(const StateEntry* codes, Expect(by_name, w, "U8", CeilDiv(*n, 2)));
  t.codes = codes->bytes;
  STRATA_ASSIGN_OR_RETURN(const StateEntry* qmap, Expect(by_name, w + ".quant_map", "F32", 16));
  const std::vector<float> map = Values<float>(*qmap);
  for (size_t i = 0; i < 16; ++i)
    if (std::bit_cast<uint32_t>(map[i]) != std::bit_cast<uint32_t>(Nf4Table()[i]))
      return Corruption("bnb 4-bit state dict: " + w + ".quant_map entry " + std::to_string(i) + " is " +
                        std::to_string(map[i]) + ", not NF4's " + std::to_string(Nf4Table()[i]));

  // from_dict: nested exactly when nested_absmax is present; then the nested_* fields must be too.
  t.nested = by_name.count(w + ".nested_absmax") > 0;
  if (!t.nested) {
    for (const char* k : {"nested_blocksize", "nested_dtype", "nested_offset"})
      if (f.count(k))
        return NotFound("bnb 4-bit state dict: " + qs_key + " has \"" + k + "\" but there is no entry " + w +
                        ".nested_absmax");
    STRATA_ASSIGN_OR_RETURN(const StateEntry* am, Expect(by_name, w + ".absmax", "F32", blocks));
    t.absmax = Values<float>(*am);
    return t;
  }
  STRATA_ASSIGN_OR_RETURN(t.nested_blocksize, int_field("nested_blocksize"));
  if (t.nested_blocksize <= 0 || t.nested_blocksize > (1 << 20))
    return Corruption("bnb 4-bit state dict: " + qs_key + " nested_blocksize " + std::to_string(t.nested_blocksize) +
                      " is out of range");
  STRATA_ASSIGN_OR_RETURN(const JsonValue* ndt, field("nested_dtype", JsonValue::kString));
  if (ndt->str != "float32")
    return Corruption("bnb 4-bit state dict: " + qs_key + " nested_dtype \"" + ndt->str + "\" is not float32");
  STRATA_ASSIGN_OR_RETURN(const JsonValue* off, field("nested_offset", JsonValue::kNumber));
  t.offset = static_cast<float>(off->num);  // from_dict: torch.tensor(float(...)), a float32
  STRATA_ASSIGN_OR_RETURN(const StateEntry* am, Expect(by_name, w + ".absmax", "U8", blocks));
  t.absmax_codes = am->bytes;
  STRATA_ASSIGN_OR_RETURN(const StateEntry* nam,
                          Expect(by_name, w + ".nested_absmax", "F32", CeilDiv(blocks, t.nested_blocksize)));
  t.nested_absmax = Values<float>(*nam);
  STRATA_ASSIGN_OR_RETURN(const StateEntry* nqm, Expect(by_name, w + ".nested_quant_map", "F32", 256));
  t.nested_quant_map = Values<float>(*nqm);
  return t;
}

}  // namespace strata::quant

// Cross-check driver: our quant/nf4 against files written by real bitsandbytes (bnb_crosscheck.py).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "quant/nf4.h"

using namespace strata::quant;

static std::vector<uint8_t> ReadFile(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
static void WriteFile(const std::string& p, const void* d, size_t n) {
  std::ofstream f(p, std::ios::binary);
  f.write(static_cast<const char*>(d), static_cast<std::streamsize>(n));
}
static void WriteEntries(const std::vector<StateEntry>& es, const std::string& w, const std::string& dir) {
  for (const auto& e : es) {
    std::string key = e.name == w ? "weight" : e.name.substr(w.size() + 1);
    WriteFile(dir + "/" + key + ".bin", e.bytes.data(), e.bytes.size());
    std::ofstream m(dir + "/" + key + ".meta");
    m << e.dtype;
    for (auto d : e.shape) m << " " << d;
    m << "\n";
  }
}
static int Fail(const strata::Status& s) {
  std::cerr << "ERROR " << s.ToString() << "\n";
  return 2;
}

int main(int argc, char** argv) {
  std::string cmd = argv[1];
  const std::string w = "model.layers.0.self_attn.q_proj.weight";
  if (cmd == "map") {
    auto m = DynamicMap8bit();
    WriteFile(argv[2], m.data(), m.size() * 4);
    return 0;
  }
  if (cmd == "quant") {  // quant in.bin f32|bf16 outdir nested dims...
    auto in = ReadFile(argv[2]);
    std::string dt = argv[3], dir = argv[4];
    bool nested = std::string(argv[5]) == "1";
    std::vector<int64_t> shape;
    for (int i = 6; i < argc; ++i) shape.push_back(std::stoll(argv[i]));
    strata::Result<Nf4Tensor> t =
        dt == "f32" ? QuantizeNf4(reinterpret_cast<const float*>(in.data()), shape, 64, nested)
                    : QuantizeNf4Bf16(reinterpret_cast<const uint16_t*>(in.data()), shape, 64, nested);
    if (!t.ok()) return Fail(t.status());
    auto es = ToBnbStateDict(*t, w);
    if (!es.ok()) return Fail(es.status());
    WriteEntries(*es, w, dir);
    auto f = DequantizeNf4(*t);
    auto b = DequantizeNf4Bf16(*t);
    WriteFile(dir + "/deq.f32", f->data(), f->size() * 4);
    WriteFile(dir + "/deq.bf16", b->data(), b->size() * 2);
    if (nested) {  // the un-nested absmax, for the nest command
      auto u = dt == "f32" ? QuantizeNf4(reinterpret_cast<const float*>(in.data()), shape, 64, false)
                           : QuantizeNf4Bf16(reinterpret_cast<const uint16_t*>(in.data()), shape, 64, false);
      WriteFile(dir + "/absmax_raw.f32", u->absmax.data(), u->absmax.size() * 4);
    }
    return 0;
  }
  if (cmd == "load") {  // load indir outdir keys...
    std::string in = argv[2], out = argv[3];
    std::vector<StateEntry> es;
    for (int i = 4; i < argc; ++i) {
      std::string key = argv[i];
      StateEntry e;
      e.name = key == "weight" ? w : w + "." + key;
      std::ifstream m(in + "/" + key + ".meta");
      m >> e.dtype;
      int64_t d;
      while (m >> d) e.shape.push_back(d);
      e.bytes = ReadFile(in + "/" + key + ".bin");
      es.push_back(std::move(e));
    }
    auto t = FromBnbStateDict(es, w);
    if (!t.ok()) return Fail(t.status());
    auto again = ToBnbStateDict(*t, w);
    if (!again.ok()) return Fail(again.status());
    WriteEntries(*again, w, out);
    auto f = DequantizeNf4(*t);
    auto b = DequantizeNf4Bf16(*t);
    WriteFile(out + "/deq.f32", f->data(), f->size() * 4);
    WriteFile(out + "/deq.bf16", b->data(), b->size() * 2);
    return 0;
  }
  if (cmd == "nest") {  // nest absmax.f32 offset_bits_hex outdir
    auto a = ReadFile(argv[2]);
    std::vector<float> am(a.size() / 4);
    std::memcpy(am.data(), a.data(), a.size());
    uint32_t bits = static_cast<uint32_t>(std::stoul(argv[3], nullptr, 16));
    float off;
    std::memcpy(&off, &bits, 4);
    Nf4Tensor t;
    auto s = NestAbsmax(t, am, off);
    if (!s.ok()) return Fail(s);
    std::string dir = argv[4];
    WriteFile(dir + "/absmax.bin", t.absmax_codes.data(), t.absmax_codes.size());
    WriteFile(dir + "/nested_absmax.bin", t.nested_absmax.data(), t.nested_absmax.size() * 4);
    return 0;
  }
  if (cmd == "repr") {  // repr in.f64 out.txt: PythonFloatRepr of each double, one a line
    auto a = ReadFile(argv[2]);
    std::ofstream o(argv[3]);
    for (size_t i = 0; i + 8 <= a.size(); i += 8) {
      double d;
      std::memcpy(&d, a.data() + i, 8);
      o << PythonFloatRepr(d) << "\n";
    }
    return 0;
  }
  std::cerr << "unknown command\n";
  return 1;
}

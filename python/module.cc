// strata._strata: the C++ half of the Python package (python/strata/__init__.py is the API users
// call; docs/python.md). Every call that waits on the network or the disk releases the GIL, and a
// Status that is not OK becomes the Python exception that fits it, with the Status's message.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <vector>

#include "activations/batches.h"
#include "activations/reader.h"
#include "client/cluster_api.h"
#include "client/spec_overrides.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "spec/site_names.h"

namespace py = pybind11;

namespace strata::python {
namespace {

// Thrown where the GIL may be released; turned into the Python exception by the translator
// registered in the module (which runs with the GIL held).
struct StatusError : std::runtime_error {
  StatusError(StatusCode c, const std::string& m) : std::runtime_error(m), code(c) {}
  StatusCode code;
};

[[noreturn]] void Raise(const Status& st) { throw StatusError(st.code(), st.message()); }

void Translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const StatusError& e) {
    PyObject* type = PyExc_RuntimeError;
    switch (e.code) {
      case StatusCode::kInvalidArgument:
        type = PyExc_ValueError;
        break;
      case StatusCode::kNotFound:
        type = PyExc_LookupError;
        break;
      case StatusCode::kUnavailable:
      case StatusCode::kDeadlineExceeded:
        type = PyExc_ConnectionError;
        break;
      case StatusCode::kCorruption:
      case StatusCode::kIoError:
        type = PyExc_OSError;
        break;
      default:
        break;
    }
    PyErr_SetString(type, e.what());
  }
}

void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}

template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(*r);
}

py::dtype NumpyDType(storage::DType d) {
  switch (d) {
    case storage::DType::kF32:
      return py::dtype("<f4");
    case storage::DType::kF16:
      return py::dtype("<f2");
    case storage::DType::kBF16:
      return py::dtype("<u2");  // numpy has no bfloat16: the raw bits
    case storage::DType::kI64:
      return py::dtype("<i8");
    case storage::DType::kI32:
      return py::dtype("<i4");
    default:
      throw std::runtime_error(std::string("no numpy dtype for ") + storage::DTypeName(d));
  }
}

// An array that owns `bytes` (moved in, no copy).
py::array OwningArray(storage::DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  auto* owned = new std::vector<uint8_t>(std::move(bytes));
  py::capsule free(owned, [](void* p) { delete static_cast<std::vector<uint8_t>*>(p); });
  return py::array(NumpyDType(dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()), owned->data(), free);
}

// A source of activations: the coordinator (and the workers' store servers) or store directories.
// Reads go through one reader under a lock; batch streams open readers of their own.
class Reader {
 public:
  explicit Reader(activations::BatchStream::OpenReader open) : open_(std::move(open)) {
    py::gil_scoped_release release;
    reader_ = Take(open_());
  }

  activations::ActivationIndex Index(const std::string& run) STRATA_EXCLUDES(mu_) {
    py::gil_scoped_release release;
    MutexLock lock(mu_);
    return Take(reader_->Index(run));
  }

  // Rows [begin, end) of (layer, site) or (site "#tokens") the token record, into a new array.
  py::array Read(const activations::ActivationIndex& index, int64_t layer, const std::string& site, uint64_t begin,
                 uint64_t end) STRATA_EXCLUDES(mu_) {
    const bool tokens = site == storage::kActivationTokensSite;
    const storage::DType dtype = tokens ? storage::DType::kI64 : index.SiteDType(site);
    std::vector<int64_t> shape = {static_cast<int64_t>(end > begin ? end - begin : 0)};
    if (tokens) {
      shape.push_back(storage::kActivationTokenColumns);
    } else {
      for (int64_t d : index.RowShape(site)) shape.push_back(d);
    }
    py::array out(NumpyDType(dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()));
    auto* dst = static_cast<uint8_t*>(out.mutable_data());
    const size_t capacity = static_cast<size_t>(out.nbytes());
    Status st;
    {
      py::gil_scoped_release release;
      MutexLock lock(mu_);
      size_t at = 0;
      auto sink = [&](std::span<const uint8_t> bytes) {
        if (at + bytes.size() > capacity) return Internal("the reader gave more bytes than the rows asked for hold");
        std::memcpy(dst + at, bytes.data(), bytes.size());
        at += bytes.size();
        return Status::Ok();
      };
      st = tokens ? reader_->ReadTokens(index, begin, end, sink)
                  : reader_->ReadRows(index, layer, site, begin, end, sink);
    }
    Check(st);
    return out;
  }

  const activations::BatchStream::OpenReader& opener() const { return open_; }

 private:
  activations::BatchStream::OpenReader open_;
  Mutex mu_;
  std::unique_ptr<activations::ActivationReader> reader_ STRATA_GUARDED_BY(mu_);
};

class Stream {
 public:
  Stream(const Reader& reader, const activations::ActivationIndex& index, activations::BatchOptions options)
      : index_(index), options_(options) {
    py::gil_scoped_release release;
    stream_ = Take(activations::BatchStream::Start(reader.opener(), index, std::move(options)));
  }

  // An array over a batch buffer that goes back to the stream's pool when the array is freed.
  py::array PooledArray(storage::DType dtype, const std::vector<int64_t>& shape, activations::Bytes bytes) {
    struct Owned {
      activations::Bytes bytes;
      std::shared_ptr<activations::BufferPool> pool;
    };
    auto* owned = new Owned{std::move(bytes), stream_->buffers()};
    py::capsule free(owned, [](void* p) {
      auto* o = static_cast<Owned*>(p);
      o->pool->Give(std::move(o->bytes));
      delete o;
    });
    return py::array(NumpyDType(dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()), owned->bytes.data(),
                     free);
  }

  // (epoch, rows, [array per record]); StopIteration after the last.
  py::tuple Next() {
    Result<std::optional<activations::Batch>> next = std::optional<activations::Batch>();
    {
      py::gil_scoped_release release;
      next = stream_->Next();
    }
    if (!next.ok()) Raise(next.status());
    if (!*next) throw py::stop_iteration();
    activations::Batch& b = **next;
    const int64_t n = static_cast<int64_t>(b.rows.size());
    std::vector<uint8_t> rows(b.rows.size() * sizeof(uint64_t));
    std::memcpy(rows.data(), b.rows.data(), rows.size());
    py::array rows_array = OwningArray(storage::DType::kI64, {n}, std::move(rows));
    py::list arrays;
    for (size_t r = 0; r < b.data.size(); ++r) {
      std::vector<int64_t> shape = {n};
      for (int64_t d : index_.RowShape(options_.records[r].second)) shape.push_back(d);
      arrays.append(PooledArray(index_.SiteDType(options_.records[r].second), shape, std::move(b.data[r])));
    }
    return py::make_tuple(b.epoch, rows_array, arrays);
  }

 private:
  activations::ActivationIndex index_;
  activations::BatchOptions options_;
  std::unique_ptr<activations::BatchStream> stream_;
};

}  // namespace
}  // namespace strata::python

PYBIND11_MODULE(_strata, m) {
  using namespace strata;
  using namespace strata::python;
  namespace api = strata::client;
  m.doc() = "C++ half of the strata package; use `import strata` (docs/python.md)";
  m.attr("TOKENS_SITE") = storage::kActivationTokensSite;
  py::register_exception_translator(&Translate);

  py::class_<api::Target>(m, "Target")
      .def(py::init([](std::string state_dir, std::string cluster, std::string keys_dir, int timeout_ms) {
             return api::Target{std::move(state_dir), std::move(cluster), std::move(keys_dir), timeout_ms};
           }),
           py::arg("state_dir") = "", py::arg("cluster") = "", py::arg("keys_dir") = "", py::arg("timeout_ms") = 3000)
      .def_readonly("state_dir", &api::Target::state_dir)
      .def_readonly("cluster", &api::Target::cluster);

  // `overrides`: "key=value" strings, as `strata submit --set` takes them (client/spec_overrides.h).
  m.def("submit_text", [](const api::Target& t, const std::string& toml, const std::string& base,
                          const std::string& label, const std::vector<std::string>& overrides) {
    py::gil_scoped_release release;
    std::string text = toml;
    if (!overrides.empty()) text = Take(api::ApplySpecOverrides(toml, overrides));
    return Take(api::SubmitText(t, text, base, label));
  });
  m.def("submit_file", [](const api::Target& t, const std::string& path, const std::vector<std::string>& overrides) {
    py::gil_scoped_release release;
    api::SubmitOptions options;
    options.overrides = overrides;
    return Take(api::Submit(t, path, options));
  });
  m.def("resolve_run", [](const api::Target& t, const std::string& run) {
    py::gil_scoped_release release;
    return Take(api::ResolveRun(t, run));
  });
  m.def("status_json", [](const api::Target& t, const std::string& run) {
    py::gil_scoped_release release;
    return Take(api::StatusJson(t, run));
  });
  m.def("events_json", [](const api::Target& t, const std::string& run) {
    py::gil_scoped_release release;
    return Take(api::EventsJson(t, run));
  });
  m.def("cancel", [](const api::Target& t, const std::string& run) {
    py::gil_scoped_release release;
    Check(api::Cancel(t, run));
  });
  m.def("parse_site_name", [](const std::string& name) {
    const NamedSite named = Take(ParseSiteName(name));
    return std::make_pair(named.layer, named.site);
  });
  m.def("coordinator_endpoint", [](const api::Target& t) { return Take(api::Coordinator(t)).endpoint; });

  py::class_<activations::ActivationIndex>(m, "Index")
      .def_readonly("run", &activations::ActivationIndex::run)
      .def_readonly("state", &activations::ActivationIndex::state)
      .def_readonly("layers", &activations::ActivationIndex::layers)
      .def_readonly("sites", &activations::ActivationIndex::sites)
      .def_readonly("total_rows", &activations::ActivationIndex::total_rows)
      .def_readonly("sequence", &activations::ActivationIndex::sequence)
      .def_readonly("source", &activations::ActivationIndex::source)
      .def_readonly("offline", &activations::ActivationIndex::offline)
      .def_property_readonly("dtype", [](const activations::ActivationIndex& i) { return storage::DTypeName(i.dtype); })
      .def_property_readonly("numpy_dtype", [](const activations::ActivationIndex& i) { return NumpyDType(i.dtype); })
      .def_property_readonly("stored_rows", &activations::ActivationIndex::stored_rows)
      .def_property_readonly("complete", &activations::ActivationIndex::complete)
      .def("row_shape", &activations::ActivationIndex::RowShape)
      .def("missing_rows", &activations::ActivationIndex::MissingRows)
      .def_property_readonly("chunks", [](const activations::ActivationIndex& i) {
        py::list out;
        for (const auto& c : i.chunks) out.append(py::make_tuple(c.row_begin, c.row_count, c.worker));
        return out;
      });

  py::class_<Reader>(m, "Reader")
      .def("index", &Reader::Index)
      .def("read", &Reader::Read)
      .def("batches", [](const Reader& reader, const activations::ActivationIndex& index,
                         std::vector<std::pair<int64_t, std::string>> records, uint64_t batch_rows, bool shuffle,
                         uint64_t seed, int64_t epochs, uint64_t buffer_rows, bool drop_last, size_t prefetch,
                         size_t threads, std::optional<bool> page_cache) {
        activations::BatchOptions o;
        o.records = std::move(records);
        o.batch_rows = batch_rows;
        o.shuffle = shuffle;
        o.seed = seed;
        o.epochs = epochs;
        o.buffer_rows = buffer_rows;
        o.drop_last = drop_last;
        o.prefetch = prefetch;
        o.threads = threads;
        o.page_cache = page_cache;
        return std::make_unique<Stream>(reader, index, std::move(o));
      });

  py::class_<Stream>(m, "Stream").def("__iter__", [](py::object self) { return self; }).def("__next__", &Stream::Next);

  m.def("connect_reader", [](const api::Target& t, int timeout_ms) {
    auto address = Take(api::Coordinator(t));
    const int timeout = std::max(timeout_ms, address.timeout_ms);
    return std::make_unique<Reader>([address, timeout]() {
      return activations::ActivationReader::Connect(address.endpoint, timeout, address.keys);
    });
  });
  m.def("open_stores", [](std::vector<std::string> dirs) {
    return std::make_unique<Reader>([dirs]() { return activations::ActivationReader::OpenStores(dirs); });
  });
}

# Finds every third-party dependency the same way on Debian 12 (packages under /usr) and on the
# GPU node (Debian .debs unpacked under a prefix named by CMAKE_PREFIX_PATH, pip LibTorch).
# Packaged CMake configs that misbehave there (Cap'n Proto hard-codes /usr, RocksDB's exports the
# static library) are bypassed with find_program / find_path / find_library. The GPU node's bundle: scripts/gpu-node/
find_package(Threads REQUIRED)

# --- Cap'n Proto -------------------------------------------------------------------------------
find_program(CAPNP_EXECUTABLE capnp REQUIRED)
find_program(CAPNPC_CXX_EXECUTABLE capnpc-c++ REQUIRED)
find_path(CAPNP_INCLUDE_DIRS capnp/message.h REQUIRED)
find_library(CAPNP_LIB capnp REQUIRED)
find_library(KJ_LIB kj REQUIRED)
find_file(CAPNP_MACROS CapnProto/CapnProtoMacros.cmake PATH_SUFFIXES lib/x86_64-linux-gnu/cmake lib/cmake REQUIRED)
include(${CAPNP_MACROS})
add_library(strata_capnp INTERFACE)
target_include_directories(strata_capnp INTERFACE ${CAPNP_INCLUDE_DIRS})
target_link_libraries(strata_capnp INTERFACE ${CAPNP_LIB} ${KJ_LIB} Threads::Threads)

# --- RocksDB (shared library) ------------------------------------------------------------------
find_path(ROCKSDB_INCLUDE_DIR rocksdb/db.h REQUIRED)
find_library(ROCKSDB_LIB rocksdb REQUIRED)
add_library(strata_rocksdb INTERFACE)
target_include_directories(strata_rocksdb INTERFACE ${ROCKSDB_INCLUDE_DIR})
target_link_libraries(strata_rocksdb INTERFACE ${ROCKSDB_LIB})

# --- ZeroMQ + cppzmq ---------------------------------------------------------------------------
find_path(ZMQ_INCLUDE_DIR zmq.hpp REQUIRED)
find_library(ZMQ_LIB zmq REQUIRED)
add_library(strata_zmq INTERFACE)
target_include_directories(strata_zmq INTERFACE ${ZMQ_INCLUDE_DIR})
target_link_libraries(strata_zmq INTERFACE ${ZMQ_LIB})

# --- xxHash (record checksums) -----------------------------------------------------------------
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIB xxhash REQUIRED)
add_library(strata_xxhash INTERFACE)
target_include_directories(strata_xxhash INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(strata_xxhash INTERFACE ${XXHASH_LIB})

# --- libsystemd (sd_notify: readiness, status and watchdog under Type=notify units) ------------
find_path(SYSTEMD_INCLUDE_DIR systemd/sd-daemon.h REQUIRED)
# NAMES libsystemd.so.0: nodes with the runtime library but no -dev symlink (the GPU node).
find_library(SYSTEMD_LIB NAMES systemd libsystemd.so.0 REQUIRED)
add_library(strata_systemd INTERFACE)
target_include_directories(strata_systemd INTERFACE ${SYSTEMD_INCLUDE_DIR})
target_link_libraries(strata_systemd INTERFACE ${SYSTEMD_LIB})

# --- cpp-httplib (the coordinator's HTTP dashboard) --------------------------------------------
# Debian ships it compiled (libcpp-httplib.so, "split" header). The library was built with TLS,
# zlib and brotli support; its users must see the same macros (its pkg-config Cflags) so the
# header's declarations match the library.
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
find_library(HTTPLIB_LIB cpp-httplib REQUIRED)
add_library(strata_httplib INTERFACE)
target_include_directories(strata_httplib INTERFACE ${HTTPLIB_INCLUDE_DIR})
target_compile_definitions(strata_httplib INTERFACE CPPHTTPLIB_OPENSSL_SUPPORT CPPHTTPLIB_ZLIB_SUPPORT CPPHTTPLIB_BROTLI_SUPPORT)
target_link_libraries(strata_httplib INTERFACE ${HTTPLIB_LIB} Threads::Threads)

# --- Tokenizers (tokenizer/): PCRE2 runs the pre-tokenizer regexes, ICU's NFC, SentencePiece ------
find_path(PCRE2_INCLUDE_DIR pcre2.h REQUIRED)
find_library(PCRE2_LIB pcre2-8 REQUIRED)
add_library(strata_pcre2 INTERFACE)
target_include_directories(strata_pcre2 INTERFACE ${PCRE2_INCLUDE_DIR})
target_link_libraries(strata_pcre2 INTERFACE ${PCRE2_LIB})
find_path(ICU_INCLUDE_DIR unicode/normalizer2.h REQUIRED)
find_library(ICU_UC_LIB icuuc REQUIRED)
add_library(strata_icu INTERFACE)
target_include_directories(strata_icu INTERFACE ${ICU_INCLUDE_DIR})
target_link_libraries(strata_icu INTERFACE ${ICU_UC_LIB})
# Debian's libsentencepiece carries its own protobuf-lite and exports its symbols, which clash with
# the libprotobuf that Debian's LibTorch loads: a process that loads both crashes before main().
# So strata_tokenizer does not carry it in its link interface (a test that links strata_cli and
# LibTorch would load it): a program that calls into the tokenizer links strata_sentencepiece
# itself (the strata CLI, the tokenizer tests and bench; nothing that links LibTorch).
find_path(SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h REQUIRED)
find_library(SENTENCEPIECE_LIB sentencepiece REQUIRED)
add_library(strata_sentencepiece INTERFACE)
target_include_directories(strata_sentencepiece INTERFACE ${SENTENCEPIECE_INCLUDE_DIR})
target_link_libraries(strata_sentencepiece INTERFACE ${SENTENCEPIECE_LIB})
# The trainer: only the tests, which make a small model rather than ship one.
find_library(SENTENCEPIECE_TRAIN_LIB sentencepiece_train REQUIRED)
add_library(strata_sentencepiece_train INTERFACE)
target_link_libraries(strata_sentencepiece_train INTERFACE ${SENTENCEPIECE_TRAIN_LIB} strata_sentencepiece)

# --- header-only helpers -----------------------------------------------------------------------
find_path(TOMLPP_INCLUDE_DIR toml++/toml.h REQUIRED)
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
find_path(NLOHMANN_INCLUDE_DIR nlohmann/json.hpp REQUIRED)
add_library(strata_header_libs INTERFACE)
target_include_directories(strata_header_libs INTERFACE ${TOMLPP_INCLUDE_DIR} ${CLI11_INCLUDE_DIR} ${NLOHMANN_INCLUDE_DIR})

# --- spdlog (only in common/log.cc: never in a file that sees LibTorch's fmt) -------------------
find_package(spdlog REQUIRED)

# --- LibTorch (only worker execution links it) ---------------------------------------------------
# OFF: the control plane alone on a machine without LibTorch - strata, strata-coordinator, the
# planner, storage, the Python package's module and the tests that need no strata-worker.
option(STRATA_WITH_TORCH "Build the worker's execution (strata-worker; needs LibTorch)" ON)
if(STRATA_WITH_TORCH)
  find_package(Torch REQUIRED)
  # CUDA parts are built only against a LibTorch that has CUDA (pip PyTorch on the GPU node).
  set(STRATA_TORCH_HAS_CUDA OFF)
  if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda OR CAFFE2_USE_CUDA)
    set(STRATA_TORCH_HAS_CUDA ON)
  endif()
  option(STRATA_WITH_CUDA "Build CUDA parts (needs a CUDA LibTorch)" ${STRATA_TORCH_HAS_CUDA})
  if(STRATA_WITH_CUDA AND NOT STRATA_TORCH_HAS_CUDA)
    message(FATAL_ERROR "STRATA_WITH_CUDA=ON but the LibTorch found at ${Torch_DIR} has no CUDA")
  endif()
  message(STATUS "Strata: LibTorch ${Torch_VERSION} from ${Torch_DIR}; CUDA parts: ${STRATA_WITH_CUDA}")
else()
  set(STRATA_WITH_CUDA OFF)
  message(STATUS "Strata: without LibTorch (STRATA_WITH_TORCH=OFF): no strata-worker, no test that needs one")
endif()

# LibTorch's headers cost about 30 s to parse and 30 s more to compile in every file that includes
# them (measured on a 2-core box); one precompiled <torch/torch.h>, built with strata_nn (the lowest
# LibTorch library), serves every target that sees LibTorch. Targets call strata_use_torch_pch(TARGET).
function(strata_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM strata_nn)
endfunction()

# A library of LibTorch code (worker/ and its rooms): LibTorch private to it, the shared
# precompiled header, STRATA_WITH_CUDA in CUDA builds.
function(strata_torch_library target)
  add_library(${target} ${ARGN})
  target_link_libraries(${target} PRIVATE ${TORCH_LIBRARIES})
  target_include_directories(${target} PRIVATE ${TORCH_INCLUDE_DIRS})
  if(STRATA_WITH_CUDA)
    target_compile_definitions(${target} PRIVATE STRATA_WITH_CUDA=1)
  endif()
  if(target STREQUAL "strata_nn")
    target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<torch/torch.h>>")
  else()
    strata_use_torch_pch(${target})
  endif()
endfunction()

# A test of LibTorch code: GoogleTest, LibTorch, the shared precompiled header.
function(strata_torch_test target)
  add_executable(${target} ${ARGN})
  target_link_libraries(${target} ${TORCH_LIBRARIES} GTest::gtest_main)
  strata_use_torch_pch(${target})
  gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60)
endfunction()

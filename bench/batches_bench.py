"""Shuffled training batches from a capture, as a sparse-autoencoder trainer reads them
(bench/activations_bench.sh): `capture.batches(layer, site, 4096, shuffle=True)` over every row of
one layer, from the worker stores alone (stores=, no cluster):
  - cold: every file of the stores dropped from the page cache first (posix_fadvise DONTNEED after
    a sync), so the bytes come from the disk;
  - cold through the page cache (page_cache=True: buffered reads, as before O_DIRECT), which
    leaves the layer's records cached;
  - warm: right after, from the page cache.
Also the disk's own sequential read bandwidth on the same files (cold, 16 MiB reads) for scale,
and the batches' read pattern with plain preads and nothing else (bench/read_pattern_bench.cc: the
same records in the same order by as many threads, cold; buffered, after WILLNEED and O_DIRECT, and the chunk
files read whole by as many threads): pattern vs disk vs ours. The block device's queue settings
(read_ahead_kb, max_sectors_kb, ...) are printed first, since buffered reads depend on them, and
every measure carries the disk's read requests during it (/proc/diskstats: count, mean size and
latency, mean number in flight).

usage: batches_bench.py RUN LAYER SITE STORE_DIR [STORE_DIR...]
  BATCHES_THREADS=0,2,8  cold batches once per thread count (0: the default, min(cores, 8))
  STRATA_BIN_DIR         where read_pattern_bench is (default: the build's bin/ beside python/)
Prints one JSON line per measurement: bytes delivered into numpy, seconds, GB/s.
"""
import inspect
import json
import os
import subprocess
import sys
import time

import strata  # before numpy: see python/strata/__init__.py

import numpy as np


def store_files(stores):
    for store in stores:
        for root, _, files in os.walk(store):
            for name in files:
                yield os.path.join(root, name)


def drop_cache(stores):
    os.sync()
    for path in store_files(stores):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def device_of(path):
    """The name of the block device holding `path` (sda1, nvme0n1p2, vda) and its /sys directory."""
    st = os.stat(path)
    dev = os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    return os.path.basename(dev), dev


class DiskReads:
    """Reads the device served between start() and the measure's end, from /proc/diskstats (what
    iostat shows): requests, their mean size and latency, and the mean number in flight over
    `seconds` - the queue depth the reading pattern kept."""

    def __init__(self, device):
        self.device = device

    def _read(self):
        with open("/proc/diskstats") as f:
            for line in f:
                fields = line.split()
                if fields[2] == self.device:  # reads completed, merged, sectors, ms reading
                    return [int(fields[3]), int(fields[5]), int(fields[6])]
        return None

    def start(self):
        self.before = self._read()
        return self

    def stop(self, seconds):
        after = self._read()
        if not self.before or not after or seconds <= 0:
            return {}
        reads, sectors, ms = (a - b for a, b in zip(after, self.before))
        if reads == 0:
            return {"disk_reads": 0}
        return {"disk_reads": reads, "mean_read_KiB": round(sectors * 512 / reads / 1024, 1),
                "mean_read_ms": round(ms / reads, 2), "mean_reads_in_flight": round(ms / 1000 / seconds, 1)}


def disk_read(stores):
    """Sequential read of the largest store files (the chunk files), cold."""
    files = sorted(store_files(stores), key=lambda p: -os.path.getsize(p))[:64]
    drop_cache(stores)
    disk = DiskReads(device_of(stores[0])[0]).start()
    total, start = 0, time.time()
    buf = bytearray(16 << 20)
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                total += n
    seconds = time.time() - start
    return {"measure": "disk sequential read (cold, 16 MiB reads)", "bytes": total, "seconds": round(seconds, 3),
            "GB_per_s": round(total / seconds / 1e9, 3), **disk.stop(seconds)}


def block_queue(path):
    """The queue settings of the block device holding `path` (its whole disk's, for a partition)."""
    _, dev = device_of(path)
    queue = os.path.join(dev, "queue")
    if not os.path.isdir(queue):
        queue = os.path.join(os.path.dirname(dev), "queue")  # a partition: its disk's queue
    out = {"device": os.path.basename(dev)}
    for name in ("read_ahead_kb", "max_sectors_kb", "nr_requests", "scheduler", "rotational", "logical_block_size"):
        try:
            with open(os.path.join(queue, name)) as f:
                out[name] = f.read().strip()
        except OSError:
            pass
    return out


def read_pattern(run, layer, site, stores, threads):
    """bench/read_pattern_bench: batches' byte ranges with plain preads, cold (it drops the cache)."""
    bin_dir = os.environ.get("STRATA_BIN_DIR") or os.path.join(os.path.dirname(strata.__file__), "..", "..", "bin")
    tool = os.path.join(bin_dir, "read_pattern_bench")
    if not os.path.exists(tool):
        return [{"measure": "read pattern", "error": f"{tool} not built (ninja read_pattern_bench)"}]
    lines = []
    for mode in ("records", "records-willneed", "records-direct-4k", "records-direct", "files"):  # one at a time, for the disk's counts
        disk = DiskReads(device_of(stores[0])[0]).start()
        out = subprocess.run([tool, run, str(layer), site, str(threads), "1", mode, *stores],
                             check=True, capture_output=True, text=True).stdout
        line = json.loads(out.strip().splitlines()[-1])
        lines.append({**line, **disk.stop(line["seconds"])})
    return lines


def batches(capture, layer, site, label, device, threads=0, **options):
    disk = DiskReads(device).start()
    total, count, start = 0, 0, time.time()
    for batch in capture.batches(layer, site, 4096, shuffle=True, seed=1, threads=threads, **options):
        assert isinstance(batch, np.ndarray)
        total += batch.nbytes
        count += 1
    seconds = time.time() - start
    assert total == capture.rows * int(np.prod(capture.row_shape(site))) * np.dtype(capture.dtype).itemsize, total
    return {"measure": f"batches(4096 rows, shuffled), {label}", "threads": threads, **options, "layer": layer, "site": site,
            "batches": count,
            "bytes": total, "seconds": round(seconds, 3), "GB_per_s": round(total / seconds / 1e9, 3),
            **disk.stop(seconds)}


def main():
    run, layer, site, stores = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    device = device_of(stores[0])[0]
    capture = strata.open_activations(run, stores=stores)
    print(json.dumps({"capture": repr(capture), "store_bytes": sum(os.path.getsize(p) for p in store_files(stores))}))
    print(json.dumps({"block_queue": block_queue(stores[0])}))
    print(json.dumps(disk_read(stores)), flush=True)
    for line in read_pattern(run, layer, site, stores, 0):
        print(json.dumps(line), flush=True)
    # BATCHES_THREADS=2,4,8: the cold read once per thread count (threads=0 is the default).
    for threads in [int(t) for t in os.environ.get("BATCHES_THREADS", "0").split(",")]:
        drop_cache(stores)
        print(json.dumps(batches(capture, layer, site, "cold: from the disk", device, threads)), flush=True)
    # Cold records bypass the page cache by default (O_DIRECT) and stay out of it: the warm passes
    # follow a cold one through it (page_cache=True, the buffered reads of earlier versions).
    through = {"page_cache": True} if "page_cache" in inspect.signature(capture.batches).parameters else {}
    drop_cache(stores)
    print(json.dumps(batches(capture, layer, site, "cold, through the page cache", device, **through)), flush=True)
    print(json.dumps(batches(capture, layer, site, "warm: from the page cache", device)), flush=True)
    print(json.dumps(batches(capture, layer, site, "warm again", device)), flush=True)


if __name__ == "__main__":
    main()

"""Strata from Python: submit and follow runs, and read captured activations into numpy.

    import strata
    cluster = strata.connect()                       # the local cluster (`strata up`)
    run = cluster.submit({"kind": "extract", ...})   # a dict (rendered to TOML) or a spec path
    cluster.wait(run)
    capture = strata.open_activations(run, cluster=cluster)
    x = capture[3, "resid_post"][0:4096]             # numpy [4096, hidden]
    for batch in capture.batches(3, "resid_post", batch_rows=4096, seed=0):
        ...                                          # shuffled, every row once per epoch

With the cluster down, read the workers' stores directly:
    capture = strata.open_activations(run, stores=["STATE/workers/worker-0", ...])

Errors are Python exceptions carrying Strata's message: ValueError (bad layer, site, spec),
IndexError (rows out of range), LookupError (unknown run; rows in none of the given stores),
ConnectionError (cluster or worker unreachable), OSError (damaged bytes). See docs/python.md.
"""

import json
import math
import os
import sys
import time

# The extension first: built against PyTorch's pybind11 on the GPU node (Ubuntu 24.04, pip numpy
# 2.5), loading it after numpy crashes in its initialization (not understood yet; docs/python.md).
from . import _strata  # noqa: I001

import numpy as np

__all__ = ["connect", "open_activations", "Cluster", "Capture", "SiteView", "RunFailed", "to_toml", "as_torch"]

TOKEN_COLUMNS = ("token", "document", "position")


class RunFailed(RuntimeError):
    """wait() on a run that ended failed or cancelled; .status is its last status."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------- run specs


def _toml_value(value, where):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"run spec: {where} = {value} is not a finite number")
        return repr(value)
    if isinstance(value, (str, os.PathLike)):
        return json.dumps(os.fspath(value))  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, where) for v in value) + "]"
    raise ValueError(f"run spec: {where} is a {type(value).__name__}; give a string, number, bool or list")


def to_toml(spec):
    """A run spec dict as TOML: top-level keys first, each nested dict as a [section]."""
    if not isinstance(spec, dict):
        raise ValueError(f"run spec: expected a dict of keys and [sections], got {type(spec).__name__}")
    top, sections = [], []
    for key, value in spec.items():
        if isinstance(value, dict):
            lines = [f"[{key}]"]
            for k, v in value.items():
                if isinstance(v, dict):
                    raise ValueError(f"run spec: [{key}].{k} is a table; sections nest one level")
                lines.append(f"{k} = {_toml_value(v, key + '.' + k)}")
            sections.append("\n".join(lines))
        else:
            top.append(f"{key} = {_toml_value(value, key)}")
    return "\n\n".join(["\n".join(top)] + sections) + "\n"


# ---------------------------------------------------------------- the cluster


class Cluster:
    """A Strata cluster, found the way the `strata` command finds it (see connect())."""

    def __init__(self, target):
        self._target = target

    def __repr__(self):
        return f"strata.Cluster({_strata.coordinator_endpoint(self._target)!r})"

    def submit(self, spec, *, base_dir=None, set=None):
        """Submits a run spec (a dict, rendered to TOML, or a path to a .toml file); its run id.

        The checks are `strata submit`'s (spec, weights, memory estimate). Relative paths in a
        dict are taken from base_dir (default: the working directory). `set`: {"train.steps": 10,
        ...}, applied as `strata submit --set` applies them (a str is taken as the CLI takes text)."""
        overrides = [f"{key}={value if isinstance(value, str) else _toml_value(value, key)}"
                     for key, value in (set or {}).items()]
        if isinstance(spec, dict):
            base = os.path.abspath(base_dir or os.getcwd())
            return _strata.submit_text(self._target, to_toml(spec), base, "run spec (dict)", overrides)
        if isinstance(spec, (str, os.PathLike)):
            return _strata.submit_file(self._target, os.fspath(spec), overrides)
        raise ValueError(f"submit: give a dict or the path of a .toml spec, not a {type(spec).__name__}")

    def resolve(self, run):
        """A run id from an id, unique id prefix, run name or 'latest' (as the CLI takes RUN)."""
        return _strata.resolve_run(self._target, run)

    def runs(self):
        """Every run, as `strata status --json` lists them (dicts)."""
        return json.loads(_strata.status_json(self._target, ""))

    def status(self, run):
        """One run's status dict (`strata status RUN --json`)."""
        return json.loads(_strata.status_json(self._target, self.resolve(run)))

    def events(self, run):
        """The run's events: dicts of unix_ms, kind, message."""
        return json.loads(_strata.events_json(self._target, self.resolve(run)))

    def cancel(self, run):
        _strata.cancel(self._target, self.resolve(run))

    def wait(self, run, progress=True, timeout=None, poll=0.5):
        """Waits until the run ends; its last status. RunFailed if it failed or was cancelled,
        TimeoutError after `timeout` seconds. progress: a line on stderr as it goes."""
        run = self.resolve(run)
        deadline = None if timeout is None else time.monotonic() + timeout
        last_line = None
        while True:
            s = self.status(run)
            state = s.get("state")
            if progress:
                unit = "chunk" if s.get("kind") in ("extract", "patch") else "step"
                line = f"{run}: {state} {unit} {s.get('step', 0)}/{s.get('total_steps', 0)}"
                if line != last_line:
                    end = "\r" if sys.stderr.isatty() and state in ("pending", "running") else "\n"
                    print(line, end=end, file=sys.stderr, flush=True)
                    last_line = line
            if state not in ("pending", "running"):
                if progress and sys.stderr.isatty():
                    print(file=sys.stderr)
                if state != "finished":
                    raise RunFailed(f"run {run} {state}: {s.get('message', '')}", s)
                return s
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run} is still {state} after {timeout} s")
            time.sleep(poll)

    def activations(self, run):
        return open_activations(run, cluster=self)


def connect(target=None, *, keys=None, timeout=3.0):
    """A Cluster: target is a state directory (where `strata up` wrote cluster.json) or a
    coordinator address (tcp://HOST:PORT, ipc://PATH); None: $STRATA_CLUSTER, else the default
    state directory, as the `strata` command. keys: a CURVE key directory for tcp:// clusters
    (default: $STRATA_KEYS, else STATE_DIR/keys). Raises ConnectionError if nothing answers."""
    target = "" if target is None else os.fspath(target)
    address = "://" in target
    t = _strata.Target(state_dir="" if address else target, cluster=target if address else "",
                       keys_dir=os.fspath(keys) if keys else "", timeout_ms=int(timeout * 1000))
    cluster = Cluster(t)
    cluster.runs()  # fails now, with the CLI's message, rather than at the first real call
    return cluster


# ---------------------------------------------------------------- activations


def _rows(spec, total, what="rows"):
    """An int, slice, range or sequence of row numbers -> (begin, end) or an int array."""
    if isinstance(spec, (int, np.integer)):
        i = int(spec)
        if i < 0:
            i += total
        if not 0 <= i < total:
            raise IndexError(f"{what} {int(spec)} is out of range: the capture has {total} rows")
        return (i, i + 1)
    if isinstance(spec, range) and spec.step == 1:
        spec = slice(spec.start, spec.stop)
    if isinstance(spec, slice):
        begin, end, step = spec.indices(total)
        if (spec.stop is not None and spec.stop > total) or (spec.start is not None and spec.start > total):
            raise IndexError(f"{what} {spec.start}:{spec.stop} goes beyond the {total} rows of the capture")
        if step != 1:
            raise IndexError(f"{what} with a step ({spec.step}) are not read; read the range, then slice the array")
        return (begin, max(begin, end))
    rows = np.asarray(spec)
    if rows.dtype == bool:
        rows = np.flatnonzero(rows)
    if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise IndexError(f"{what}: give an int, a slice A:B, or a 1-D array of row numbers")
    rows = rows.astype(np.int64)
    rows = np.where(rows < 0, rows + total, rows)
    bad = rows[(rows < 0) | (rows >= total)]
    if bad.size:
        raise IndexError(f"{what} {bad[:5].tolist()} are out of range: the capture has {total} rows")
    return rows


class SiteView:
    """capture[layer, site] (or capture[layer, site, head]): rows read on indexing -> numpy
    [rows, *row_shape] (one head: [rows, *row_shape[1:]])."""

    def __init__(self, capture, layer, site, head=None):
        self._capture, self.layer, self.site, self.head = capture, layer, site, head
        row_shape = tuple(capture.row_shape(site))
        if head is not None:
            if len(row_shape) != 2:
                raise ValueError(f"site {site!r} has no heads (its rows are {list(row_shape)}); "
                                 f"sites with heads: q, k, v, attn_pattern")
            if not isinstance(head, (int, np.integer)) or not 0 <= head < row_shape[0]:
                raise IndexError(f"head {head} is out of range: site {site!r} has {row_shape[0]} heads "
                                 f"(0 to {row_shape[0] - 1})")
            row_shape = row_shape[1:]
        self.shape = (capture.rows,) + row_shape
        self.dtype = capture.dtype

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        head = "" if self.head is None else f" head {self.head}"
        return f"<strata activations {self._capture.run} layer {self.layer} {self.site}{head} {self.shape} {self.dtype}>"

    def __getitem__(self, rows):
        out = self._capture._read(self.layer, self.site, rows)
        if self.head is None:
            return out
        # Rows are stored [heads, x]: a head is a strided slice of each row, copied contiguous.
        return np.ascontiguousarray(out[..., self.head, :])

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out if dtype is None else out.astype(dtype)


class Capture:
    """The stored activations of one extract run (see open_activations)."""

    def __init__(self, reader, index, raw_bf16=False):
        self._reader, self._index = reader, index
        self.run = index.run
        self.layers = list(index.layers)
        self.sites = list(index.sites)
        self.rows = index.total_rows
        self.stored_dtype = index.dtype  # "f32", "f16", "bf16"
        # bf16 rows read as float32, exactly widened (the CLI's .npy holds the same bytes); with
        # raw_bf16=True as uint16 holding bf16's bits (half the memory; as_torch makes bfloat16).
        self._widen = self.stored_dtype == "bf16" and not raw_bf16
        self.dtype = np.dtype(np.float32) if self._widen else index.numpy_dtype  # float32, float16, or uint16 bits
        self.sequence = index.sequence

    def __repr__(self):
        return (f"<strata capture {self.run}: layers {self.layers}, sites {self.sites}, {self.rows} rows, "
                f"{self.stored_dtype}, from {self._index.source}>")

    @property
    def state(self):
        return self._index.state

    @property
    def stored_rows(self):
        return self._index.stored_rows

    def missing_rows(self):
        """[(begin, end), ...] row ranges not stored (or, from stores=, in none of the stores)."""
        return self._index.missing_rows()

    def chunks(self):
        """[(row_begin, row_count, worker or store), ...]"""
        return self._index.chunks

    def row_shape(self, site):
        self._check(None, site)
        return tuple(self._index.row_shape(site))

    def _check(self, layer, site):
        if layer is not None and layer not in self.layers:
            raise ValueError(f"layer {layer} was not captured by run {self.run}; its layers are {self.layers}")
        if site not in self.sites:
            raise ValueError(f"site {site!r} was not captured by run {self.run}; its sites are {self.sites}")

    def __getitem__(self, key):
        """capture[layer, site], capture[site, layer] or TransformerLens' capture["blocks.6.hook_resid_post"],
        each with an optional head last (docs/extract.md, "TransformerLens' names")."""
        key = key if isinstance(key, tuple) else (key,)
        if key and isinstance(key[0], str):
            layer, site = _strata.parse_site_name(key[0])
            rest = key[1:]
            if site == "final_norm" and key[0] != "final_norm":
                layer = max(self.layers)  # ln_final.hook_normalized: stored at the model's last layer
            elif layer < 0 and rest:  # Strata's site name, then the layer
                layer, rest = rest[0], rest[1:]
            if layer < 0 or len(rest) > 1:
                raise KeyError(f"index a capture by (layer, site), (site, layer) or a TransformerLens hook name, "
                               f"e.g. capture[{self.layers[0]}, {self.sites[0]!r}] or "
                               f"capture['blocks.{self.layers[0]}.hook_resid_post']")
            head = rest[0] if rest else None
        elif len(key) in (2, 3):
            layer, site = key[:2]
            head = key[2] if len(key) == 3 else None
        else:
            raise KeyError(f"index a capture by (layer, site) or (layer, site, head), "
                           f"e.g. capture[{self.layers[0]}, {self.sites[0]!r}]")
        self._check(layer, site)
        return SiteView(self, layer, site, head)

    def _read(self, layer, site, rows):
        sel = _rows(rows, self.rows)
        if isinstance(sel, tuple):
            begin, end = sel
            if begin == end:
                shape = (0,) + (tuple(self._index.row_shape(site)) if layer is not None else (3,))
                return np.empty(shape, dtype=self.dtype if layer is not None else np.int64)
            out = self._reader.read(self._index, layer if layer is not None else 0, site, begin, end)
            if layer is not None:
                out = self._widened(out)
            return out[0] if isinstance(rows, (int, np.integer)) else out
        # Any rows: each stored chunk that holds some is read once.
        if sel.size == 0:
            return self._read(layer, site, slice(0, 0))
        starts = np.array([c[0] for c in self._index.chunks], dtype=np.int64)
        counts = np.array([c[1] for c in self._index.chunks], dtype=np.int64)
        which = np.searchsorted(starts, sel, side="right") - 1
        if (which < 0).any() or (sel >= starts[np.maximum(which, 0)] + counts[np.maximum(which, 0)]).any():
            bad = sel[(which < 0) | (sel >= starts[np.maximum(which, 0)] + counts[np.maximum(which, 0)])]
            raise LookupError(f"rows {bad[:5].tolist()} of run {self.run} are not stored "
                              f"(missing: {self.missing_rows()})")
        out = None
        for c in np.unique(which):
            part = self._read(layer, site, slice(int(starts[c]), int(starts[c] + counts[c])))
            if out is None:
                out = np.empty((sel.size,) + part.shape[1:], dtype=part.dtype)
            mask = which == c
            out[mask] = part[sel[mask] - starts[c]]
        return out

    def _widened(self, array):
        """bf16 bits as float32 (exact: bf16 is float32's top half), unless raw_bf16 was asked."""
        if not self._widen or array.dtype != np.uint16:
            return array
        return (array.astype(np.uint32) << 16).view(np.float32)

    def read(self, layer, site, rows=slice(None)):
        """capture[layer, site][rows]."""
        return self[layer, site][rows]

    def tokens(self, rows=slice(None)):
        """int64 [n, 3] per row: (token id, document, position) - docs/python.md, "Tokens"."""
        return self._read(None, _strata.TOKENS_SITE, rows)

    def batches(self, layers, sites, batch_rows, shuffle=True, seed=0, epochs=1, *, buffer_rows=0,
                drop_last=False, prefetch=4, with_rows=False, threads=0, page_cache=None):
        """Shuffled batches for training: every row exactly once per epoch, the order fixed by
        (seed, epoch) - docs/python.md, "Shuffled batches". Read ahead and gathered on C++ threads
        (threads: 0 = the machine's cores, at most 8; the order does not depend on it).

        layers, sites: one each (then each batch is an array [n, *row_shape]) or lists (then a
        dict {(layer, site): array}). with_rows: yield (rows, batch) with the row numbers.
        page_cache: how records not in the page cache are read from stores - False: around it
        (O_DIRECT, the disk's full bandwidth, they stay uncached), True: through it (slower from
        the disk, the next read comes from memory), None: True only when epochs > 1 and an epoch's
        records fit in half the available memory. Pass True when you open a stream per epoch over
        a capture that fits in memory."""
        single = not isinstance(layers, (list, tuple)) and not isinstance(sites, (list, tuple))
        layers = list(layers) if isinstance(layers, (list, tuple)) else [layers]
        sites = list(sites) if isinstance(sites, (list, tuple)) else [sites]
        records = []
        for layer in layers:
            for site in sites:
                self._check(layer, site)
                records.append((int(layer), site))
        if int(batch_rows) < 1:
            raise ValueError(f"batch_rows = {batch_rows}; give at least 1")
        stream = self._reader.batches(self._index, records, int(batch_rows), bool(shuffle), int(seed), int(epochs),
                                      int(buffer_rows), bool(drop_last), int(prefetch), int(threads),
                                      None if page_cache is None else bool(page_cache))
        for _epoch, rows, arrays in stream:
            arrays = [self._widened(a) if site != _strata.TOKENS_SITE else a for a, (_, site) in zip(arrays, records)]
            batch = arrays[0] if single else dict(zip(records, arrays))
            yield (rows, batch) if with_rows else batch


def open_activations(run, *, cluster=None, stores=None, raw_bf16=False):
    """The activations an extract run stored: from the cluster (a Cluster, a target for
    connect(), or None for the default cluster), or, with stores=[DIR, ...], from the workers'
    store directories alone (the cluster may be down; rows in none of them are reported missing).
    bf16 captures read as float32, as `strata activations get` writes them; raw_bf16=True reads
    their uint16 bits instead. Raises LookupError for an unknown run."""
    if stores is not None:
        if isinstance(stores, (str, os.PathLike)):
            stores = [stores]
        reader = _strata.open_stores([os.path.expanduser(os.fspath(s)) for s in stores])
        return Capture(reader, reader.index(run), raw_bf16)
    if not isinstance(cluster, Cluster):
        cluster = connect(cluster)
    run = cluster.resolve(run)
    reader = _strata.connect_reader(cluster._target, 10000)
    return Capture(reader, reader.index(run), raw_bf16)


def as_torch(array, stored_dtype=None):
    """A numpy array from a capture as a torch.Tensor (needs torch): uint16 arrays holding bf16
    bits become torch.bfloat16 when stored_dtype is "bf16" (Capture.stored_dtype)."""
    import torch  # optional: only this helper needs it

    array = np.ascontiguousarray(array)
    if stored_dtype == "bf16" and array.dtype == np.uint16:  # raw_bf16 reads; widened ones are float32
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)

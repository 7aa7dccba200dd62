"""The Python package against a real local cluster (`strata up --workers 2`): submit extract
runs from a dict, read every layer and site of every family back with tokens, whole and per head
(equal bit for bit to the CLI's .npy export), shuffled batches over both workers' stores, errors,
and reading with the cluster down through stores=. Run by ctest (python/CMakeLists.txt) with PYTHONPATH at the built package."""

import glob
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

import strata

BIN = os.environ.get("STRATA_BIN_DIR", "")
SEQUENCE = 64
SPEC = {
    "name": "py-extract",
    "kind": "extract",
    "model": {"family": "gpt2", "layers": 3, "hidden": 32, "heads": 4, "vocab": 256, "sequence": SEQUENCE},
    "data": {"path": "corpus.txt"},
    "train": {"seed": 7},
    "parallel": {"dp": 2},
    # 4096 tokens: 64 sequences in 16 chunks of 4 (256 rows each), spread over both workers.
    "extract": {"layers": [0, 2], "sites": ["resid_post", "attn_out", "mlp_out"], "batch": 4, "tokens": 4096},
}
ROWS = 4096

# Every family, every site (docs/extract.md), as tests/integration/sites_test.cc builds them: tiny
# models whose heads, kv_heads, head_dim and ffn differ where the family allows.
FAMILY_MODELS = {
    "gpt2": {},
    "llama": {"kv_heads": 2, "ffn": 48, "head_dim": 16},
    "mistral": {"kv_heads": 2, "ffn": 48, "sliding_window": 8},
    "qwen2": {"kv_heads": 1, "ffn": 40},
    "qwen3": {"kv_heads": 2, "ffn": 48, "head_dim": 16},
    "olmo2": {"kv_heads": 2, "ffn": 48},
    "gemma": {"kv_heads": 2, "ffn": 48, "head_dim": 8},
    "gpt_neox": {"ffn": 56, "rotary_pct": 0.25, "parallel_residual": True},
}
ALL_SITES = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "v", "attn_pattern",
             "mlp_hidden", "final_norm", "logits"]
MODEL_LEVEL_SITES = {"final_norm", "logits", "logits_ids"}  # stored at the last layer only
HEAD_SITES = {"q", "k", "v", "attn_pattern"}
FAMILY_ROWS = 256


def cli(*args, check=True):
    r = subprocess.run([os.path.join(BIN, "strata"), *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"strata {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


class PythonPackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="strata-python-")
        cls.state = os.path.join(cls.dir, "state")
        os.environ["STRATA_STATE_DIR"] = cls.state
        os.environ.pop("STRATA_CLUSTER", None)
        try:
            with open("/usr/share/common-licenses/GPL-3", "rb") as f:
                text = f.read()
        except OSError:
            text = b"the quick brown fox jumps over the lazy dog. " * 800
        cls.corpus = text
        with open(os.path.join(cls.dir, "corpus.txt"), "wb") as f:
            f.write(text)
        cli("up", "--workers", "2")
        cls.cluster = strata.connect(cls.state)
        cls.run_id = cls.cluster.submit(SPEC, base_dir=cls.dir)
        cls.final = cls.cluster.wait(cls.run_id, progress=False, timeout=120)
        cls.stores = sorted(glob.glob(os.path.join(cls.state, "workers", "*")))

    @classmethod
    def tearDownClass(cls):
        cli("down", check=False)
        if not os.environ.get("STRATA_KEEP_TEST_DIRS"):
            shutil.rmtree(cls.dir, ignore_errors=True)

    def export(self, layer, site, name, *extra, run=None):
        out = os.path.join(self.dir, name + ".npy")
        cli("activations", "get", run or self.run_id, "--layer", str(layer), "--site", site, "--out", out, "--with-tokens",
            "--force", *extra)
        return np.load(out), np.load(os.path.join(self.dir, name + ".tokens.npy"))

    # ------------------------------------------------------------ with the cluster up

    def test_a_connect_and_run_queries(self):
        self.assertEqual(self.final["state"], "finished")
        self.assertIn(self.run_id, [r["run_id"] for r in self.cluster.runs()])
        self.assertEqual(self.cluster.status(self.run_id)["state"], "finished")
        self.assertTrue(any(e["kind"] for e in self.cluster.events(self.run_id)))
        self.assertEqual(self.cluster.resolve("py-extract"), self.run_id)
        with self.assertRaises(ConnectionError):
            strata.connect("ipc://" + os.path.join(self.dir, "nobody.sock"), timeout=0.3)
        # A state directory named in the call is the cluster meant, whatever $STRATA_CLUSTER says.
        os.environ["STRATA_CLUSTER"] = "ipc://" + os.path.join(self.dir, "nobody.sock")
        try:
            self.assertEqual(strata.connect(self.state).status(self.run_id)["state"], "finished")
        finally:
            del os.environ["STRATA_CLUSTER"]

    def test_b_every_site_with_tokens_equals_the_cli_export(self):
        capture = strata.open_activations(self.run_id, cluster=self.cluster)
        self.assertEqual(capture.layers, [0, 2])
        self.assertEqual(capture.sites, ["resid_post", "attn_out", "mlp_out"])
        self.assertEqual(capture.rows, ROWS)
        self.assertEqual(capture.dtype, np.float32)
        self.assertEqual(capture.missing_rows(), [])
        for layer in capture.layers:
            for site in capture.sites:
                mine = capture[layer, site][:]
                self.assertEqual(mine.shape, (ROWS, 32))
                theirs, _ = self.export(layer, site, f"l{layer}-{site}")
                self.assertEqual(mine.tobytes(), theirs.tobytes(), (layer, site))
                # A range across chunk and worker boundaries, one row, and scattered rows.
                np.testing.assert_array_equal(capture[layer, site][250:1030], mine[250:1030])
                np.testing.assert_array_equal(capture[layer, site][-1], mine[-1])
                rows = np.array([4095, 3, 1024, 257, 3])
                np.testing.assert_array_equal(capture[layer, site][rows], mine[rows])
        # The same rows by (site, layer) and by TransformerLens' hook name.
        np.testing.assert_array_equal(capture["mlp_out", 2][:], capture[2, "mlp_out"][:])
        np.testing.assert_array_equal(capture["blocks.2.hook_mlp_out"][:], capture[2, "mlp_out"][:])
        np.testing.assert_array_equal(capture["blocks.0.hook_resid_post"][7], capture[0, "resid_post"][7])
        tokens = capture.tokens()
        _, exported = self.export(0, "resid_post", "with-tokens")
        self.assertEqual(tokens.dtype, np.int64)
        self.assertEqual(tokens.tobytes(), exported.tobytes())
        rows = np.arange(ROWS)
        np.testing.assert_array_equal(tokens[:, 0], np.frombuffer(self.corpus[:ROWS], dtype=np.uint8))
        np.testing.assert_array_equal(tokens[:, 1], rows // SEQUENCE)
        np.testing.assert_array_equal(tokens[:, 2], rows % SEQUENCE)
        np.testing.assert_array_equal(capture.tokens(slice(300, 310)), tokens[300:310])

    def test_c_errors_name_the_problem(self):
        capture = strata.open_activations(self.run_id, cluster=self.cluster)
        with self.assertRaisesRegex(LookupError, "no-such-run"):
            strata.open_activations("no-such-run", cluster=self.cluster)
        with self.assertRaisesRegex(ValueError, "layer 1 was not captured"):
            capture[1, "resid_post"]
        with self.assertRaisesRegex(ValueError, "site 'logits' was not captured"):
            capture[0, "logits"]
        with self.assertRaisesRegex(ValueError, "hook_rot_q"):
            capture["blocks.0.attn.hook_q"]
        with self.assertRaisesRegex(IndexError, "beyond the 4096 rows"):
            capture[0, "resid_post"][4000:5000]
        with self.assertRaisesRegex(IndexError, "out of range"):
            capture.tokens(np.array([1, 99999]))
        with self.assertRaisesRegex(ValueError, "layer 7 was not captured"):
            next(capture.batches(7, "resid_post", 16))
        with self.assertRaisesRegex(ValueError, "already finished"):
            self.cluster.cancel(self.run_id)
        with self.assertRaisesRegex(ValueError, "model.family"):
            self.cluster.submit({"name": "bad", "kind": "extract", "model": {"family": object()}})
        with self.assertRaisesRegex(ValueError, "family"):
            self.cluster.submit(dict(SPEC, model=dict(SPEC["model"], family="no-such-family")), base_dir=self.dir)
        # set= is `strata submit --set`: typed like the key, a wrong type or unknown key named.
        with self.assertRaisesRegex(ValueError, "--set extract.tokens=many: extract.tokens is an integer"):
            self.cluster.submit(SPEC, base_dir=self.dir, set={"extract.tokens": "many"})
        with self.assertRaisesRegex(ValueError, "unknown key 'extract.tokenz'"):
            self.cluster.submit(SPEC, base_dir=self.dir, set={"extract.tokenz": 1})

    def test_d_batches_cover_every_row_once_per_epoch_reproducibly(self):
        capture = strata.open_activations(self.run_id, cluster=self.cluster)
        self.assertEqual(len({worker for _, _, worker in capture.chunks()}), 2)  # both workers hold rows
        whole = {(l, s): capture[l, s][:] for l in (0, 2) for s in ("resid_post", "mlp_out")}

        def run(seed, **kw):
            out = list(capture.batches([0, 2], ["resid_post", "mlp_out"], 100, seed=seed, epochs=2,
                                       buffer_rows=300, with_rows=True, **kw))
            return out

        a, b, c = run(1), run(1), run(2)
        epoch_rows = []
        seen = np.concatenate([rows for rows, _ in a])
        self.assertEqual(seen.size, 2 * ROWS)
        for e in range(2):
            rows = seen[e * ROWS:(e + 1) * ROWS]
            np.testing.assert_array_equal(np.sort(rows), np.arange(ROWS))  # every row exactly once
            epoch_rows.append(rows)
        self.assertFalse(np.array_equal(epoch_rows[0], epoch_rows[1]))  # epochs differ
        self.assertFalse(np.array_equal(epoch_rows[0], np.arange(ROWS)))  # shuffled
        for rows, batch in a:
            self.assertLessEqual(len(rows), 100)
            for key, array in batch.items():
                np.testing.assert_array_equal(array, whole[key][rows])
        self.assertTrue(all(np.array_equal(x[0], y[0]) for x, y in zip(a, b)))  # same seed, same order
        self.assertEqual(len(a), len(b))
        self.assertFalse(np.array_equal(np.concatenate([r for r, _ in a]), np.concatenate([r for r, _ in c])))
        # Unshuffled: row order; one layer and site: plain arrays; drop_last drops the short batch.
        plain = list(capture.batches(2, "mlp_out", 1000, shuffle=False))
        self.assertEqual([len(x) for x in plain], [1000, 1000, 1000, 1000, 96])
        np.testing.assert_array_equal(np.concatenate(plain), whole[(2, "mlp_out")])
        self.assertEqual(len(list(capture.batches(2, "mlp_out", 1000, drop_last=True))), 4)
        type(self).online_batches = [r for r, _ in a]

    def test_e_bf16_reads_as_float32_equal_to_the_cli_export_and_raw_bits_on_request(self):
        # With data.documents: the tokens' document and position follow the given starts.
        starts = np.array([0, 100, 101, 700, 3000], dtype=np.uint64)
        starts.tofile(os.path.join(self.dir, "docs.u64"))
        spec = dict(SPEC, name="py-bf16", data=dict(SPEC["data"], documents="docs.u64"),
                    extract=dict(SPEC["extract"], dtype="bf16", tokens=1024, sites=["mlp_out"]))
        run = self.cluster.submit(spec, base_dir=self.dir)
        self.cluster.wait(run, progress=False, timeout=120)
        capture = strata.open_activations(run, cluster=self.cluster)
        self.assertEqual((capture.dtype, capture.stored_dtype), (np.float32, "bf16"))
        values = capture[2, "mlp_out"][:]
        out = os.path.join(self.dir, "bf16.npy")
        cli("activations", "get", run, "--layer", "2", "--site", "mlp_out", "--out", out)
        self.assertEqual(values.dtype, np.float32)
        self.assertEqual(values.tobytes(), np.load(out).tobytes())
        batch = next(capture.batches(2, "mlp_out", 16, shuffle=False))
        self.assertEqual(batch.tobytes(), values[:16].tobytes())
        raw = strata.open_activations(run, cluster=self.cluster, raw_bf16=True)
        self.assertEqual(raw.dtype, np.uint16)
        bits = raw[2, "mlp_out"][:]
        self.assertEqual((bits.astype(np.uint32) << 16).view(np.float32).tobytes(), values.tobytes())
        rows = np.arange(1024)
        document = np.searchsorted(starts.astype(np.int64), rows, side="right") - 1
        tokens = capture.tokens()
        np.testing.assert_array_equal(tokens[:, 1], document)
        np.testing.assert_array_equal(tokens[:, 2], rows - starts.astype(np.int64)[document])

    def test_f_every_site_of_every_family_with_tokens_equals_the_cli_export(self):
        type(self).family_runs = {}
        for family, extra in FAMILY_MODELS.items():
            with self.subTest(family=family):
                model = dict(family=family, layers=2, hidden=32, heads=4, vocab=256, sequence=32, **extra)
                extract = {"layers": [0], "sites": ALL_SITES, "batch": 4, "tokens": FAMILY_ROWS}
                if family == "qwen2":  # top-k logits: values and their int32 token ids
                    extract["logits_top_k"] = 5
                spec = {"name": f"py-{family}", "kind": "extract", "model": model, "data": {"path": "corpus.txt"},
                        "train": {"seed": 11}, "parallel": {"dp": 2}, "extract": extract}
                run = self.cluster.submit(spec, base_dir=self.dir)
                self.assertEqual(self.cluster.wait(run, progress=False, timeout=180)["state"], "finished")
                capture = strata.open_activations(run, cluster=self.cluster)
                expected_sites = ALL_SITES + (["logits_ids"] if family == "qwen2" else [])
                self.assertEqual(sorted(capture.sites), sorted(expected_sites))
                self.assertEqual(capture.layers, [0, 1])  # final_norm and logits add the last layer
                self.assertEqual(capture.rows, FAMILY_ROWS)
                read = {}
                for layer in capture.layers:
                    for site in capture.sites:
                        if site in MODEL_LEVEL_SITES and layer != 1:
                            continue
                        mine = capture[layer, site][:]
                        theirs, tokens = self.export(layer, site, f"{family}-l{layer}-{site}", run=run)
                        self.assertEqual(mine.dtype, theirs.dtype, (family, layer, site))
                        self.assertEqual(mine.shape, theirs.shape, (family, layer, site))
                        self.assertEqual(mine.tobytes(), theirs.tobytes(), (family, layer, site))
                        self.assertEqual(capture.tokens().tobytes(), tokens.tobytes(), (family, layer, site))
                        read[(layer, site)] = mine
                        if site in HEAD_SITES:
                            heads = capture.row_shape(site)[0]
                            for head in range(heads):
                                np.testing.assert_array_equal(capture[layer, site, head][:], mine[:, head])
                            last = heads - 1
                            one, _ = self.export(layer, site, f"{family}-l{layer}-{site}-h", "--head", str(last), run=run)
                            self.assertEqual(one.tobytes(), np.ascontiguousarray(mine[:, last]).tobytes())
                            with self.assertRaisesRegex(IndexError, f"head {heads} is out of range"):
                                capture[layer, site, heads]
                            r = cli("activations", "get", run, "--layer", str(layer), "--site", site, "--head",
                                    str(heads), "--out", os.path.join(self.dir, "bad-head.npy"), check=False)
                            self.assertNotEqual(r.returncode, 0)
                            self.assertIn(f"--head {heads} is out of range", r.stderr)
                # Row shapes say what each site is: heads and head_dim, the sequence, the vocabulary.
                heads, kv = 4, extra.get("kv_heads", 4)
                head_dim = extra.get("head_dim", 8)
                self.assertEqual(read[(0, "q")].shape, (FAMILY_ROWS, heads, head_dim))
                self.assertEqual(read[(0, "k")].shape, (FAMILY_ROWS, kv, head_dim))
                self.assertEqual(read[(0, "attn_pattern")].shape, (FAMILY_ROWS, heads, 32))
                self.assertEqual(read[(0, "mlp_hidden")].shape[1], extra.get("ffn", 128))
                self.assertEqual(read[(1, "logits")].shape, (FAMILY_ROWS, 5 if family == "qwen2" else 256))
                if family == "qwen2":
                    self.assertEqual(read[(1, "logits_ids")].dtype, np.int32)
                with self.assertRaisesRegex(ValueError, "has no heads"):
                    capture[0, "resid_post", 0]
                with self.assertRaisesRegex(ValueError, r"stored once at the last layer \(1\)"):
                    capture[0, "final_norm"][:]
                type(self).family_runs[family] = (run, read)

    # ------------------------------------------------------------ with the cluster down

    def test_z_reading_with_the_cluster_down(self):
        capture = strata.open_activations(self.run_id, cluster=self.cluster)
        online = {(l, s): capture[l, s][:] for l in capture.layers for s in capture.sites}
        online_tokens = capture.tokens()
        cli_online, _ = self.export(2, "attn_out", "online")
        cli("down")
        with self.assertRaises(Exception):
            strata.open_activations(self.run_id, cluster=self.cluster)
        self.assertEqual(len(self.stores), 2)
        offline = strata.open_activations(self.run_id, stores=self.stores)
        self.assertEqual(offline.missing_rows(), [])
        self.assertEqual((offline.layers, offline.sites, offline.rows), (capture.layers, capture.sites, capture.rows))
        for key, array in online.items():
            self.assertEqual(offline[key][:].tobytes(), array.tobytes(), key)
        self.assertEqual(offline.tokens().tobytes(), online_tokens.tobytes())
        # The same seed gives the same batches whichever way the capture is read.
        offline_batches = [r for r, _ in offline.batches([0, 2], ["resid_post", "mlp_out"], 100, seed=1, epochs=2,
                                                         buffer_rows=300, with_rows=True)]
        if hasattr(type(self), "online_batches"):
            self.assertTrue(all(np.array_equal(x, y) for x, y in zip(offline_batches, self.online_batches)))
        # The CLI reads the stores too, equal to what it read online.
        cli_offline, tokens = self.export(2, "attn_out", "offline", *sum((["--store", s] for s in self.stores), []))
        self.assertEqual(cli_offline.tobytes(), cli_online.tobytes())
        np.testing.assert_array_equal(tokens, online_tokens)
        listing = json.loads(cli("activations", self.run_id, "--json", *sum((["--store", s] for s in self.stores), [])).stdout)
        self.assertEqual(listing["rows_stored"], ROWS)

        # One store absent: the rows only the other held are named.
        half = strata.open_activations(self.run_id, stores=self.stores[:1])
        missing = half.missing_rows()
        self.assertTrue(missing)
        begin, end = missing[0]
        with self.assertRaisesRegex(LookupError, f"rows {begin}:{end}"):
            half[0, "resid_post"][:]
        with self.assertRaisesRegex(LookupError, "in none of the given"):
            next(half.batches(0, "resid_post", 64))
        r = cli("activations", "get", self.run_id, "--layer", "0", "--out", os.path.join(self.dir, "half.npy"),
                "--store", self.stores[0], check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"rows {begin}:{end}", r.stderr)
        self.assertIn("in none of the given store", r.stderr)
        # Every site of every family, from the stores alone, equal to what was read online.
        for family, (run, read) in getattr(type(self), "family_runs", {}).items():
            capture = strata.open_activations(run, stores=self.stores)
            self.assertEqual(capture.missing_rows(), [], family)
            for (layer, site), array in read.items():
                self.assertEqual(capture[layer, site][:].tobytes(), array.tobytes(), (family, layer, site))
        with self.assertRaisesRegex(LookupError, "no-such-run"):
            strata.open_activations("no-such-run", stores=self.stores)
        with self.assertRaisesRegex(LookupError, "does not exist"):
            strata.open_activations(self.run_id, stores=[os.path.join(self.dir, "nowhere")])


if __name__ == "__main__":
    unittest.main()

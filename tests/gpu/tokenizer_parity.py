"""`strata tokenize` against Hugging Face `tokenizers` (and SentencePiece), id for id, and their speed.

usage: python3 tests/gpu/tokenizer_parity.py STRATA_BIN SUMMARY.json [--mb 10] [--vocab 32000]
                                             [--train-mb 4] [--workdir DIR]

Needs no network: it writes a mixed-language text (English, German, Chinese, Russian, Arabic,
emoji, code, numbers, whitespace runs, decomposed accents, special tokens in the text; --mb MB,
the same bytes on every run), trains small tokenizers on it with `tokenizers`:
  gpt2-style    BPE, ByteLevel pre-tokenizer (GPT-2's regex), <|endoftext|> (normalized, special)
  llama3-style  BPE, Split(Llama 3's regex) + ByteLevel(use_regex=false), ignore_merges, specials
  qwen2-style   BPE, NFC normalizer, Split(Qwen2's regex) + ByteLevel, specials and <tool_call>
  ...-pairs / ...-strings: the same tokenizer with its merges in the other JSON form
and, when the `sentencepiece` package imports, a BPE and a unigram tokenizer.model. For each, it
runs `STRATA_BIN tokenize DIR TEXT --out IDS.u32` and compares every id with
tokenizers.Tokenizer.encode(text, add_special_tokens=False) (and with transformers'
PreTrainedTokenizerFast when transformers imports), printing the first mismatch with its context.
For a tokenizer.model the reference is SentencePieceProcessor.encode of the same parts strata cuts
the text into (a few words each, see tokenizer/sentencepiece_tokenizer.cc: a unigram model encodes
one long sentence with less precision, in sentencepiece 0.2 as in Debian's 0.1.97); whether the
whole text as one sentence gave the same ids is reported beside it. Ids that differ only by the
order of the same pieces in a short window of a unigram model ("1" "11" / "11" "1", "7" "7" "77" /
"77" "7" "7": an exact tie, which sentencepiece releases break differently) count as equal and
are reported as tied_swaps. Speed: MB/s of both on one thread
(RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false; one encode of the whole text each; strata's
figure is its own "MB/s" line, which leaves out loading the tokenizer, and the wall time of the
process, which does not).

Writes SUMMARY.json; exits 0 when every id matched, 1 on a mismatch or a failed strata run, 77 when
`tokenizers` is not installed (nothing to compare with).
"""
import argparse
import array
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

ENGLISH = ("the of and to in is was for that with as on by he at from his it an were are which this be or "
           "have had one not but all new first can also two may after its more time other year used into "
           "world people government between program system tokenizer stream merge vocabulary model").split()
CONTRACTIONS = ["it's", "don't", "I'LL", "we're", "they've", "you'd", "She'S", "I'm", "can't", "WE'RE", "o'clock"]
GERMAN = ["Über", "Straße", "Grüße", "Mädchen", "schön", "Fußgänger", "Äpfel", "Öl", "für", "größer", "weiß", "Bäckerei"]
CHINESE = ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坐集编宝谈府拉黑且随格尽剑讲布杀微怕母调局根曾准团段终乐切级克精哪官示冷域读")
RUSSIAN = ["Привет", "мир", "который", "может", "быть", "токенизатор", "словарь", "Москва", "ещё", "объём", "съезд"]
ARABIC = ["مرحبا", "العالم", "كتاب", "السلام", "عليكم", "مدرسة", "الحاسوب", "لغة"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇩🇪", "❤️", "🚀", "🤖", "✅", "🎉"]
CODE = ["def f(x):\n    return x ** 2\n", "if (a && b) { c += 1; }", "for (int i = 0; i < n; ++i) {\n\tsum += v[i];\n}",
        "x = [1, 2, 3]  # list", "SELECT * FROM t WHERE id = 42;", "std::vector<uint32_t> ids;", "<div class=\"a\">b</div>",
        "  return {'key': \"value\"}\r\n", "#include <stdio.h>", "a->b->c", "x !== y ? z : w", "print(f\"{x:>10}\")"]
ODD_SPACES = ["\u00a0", "\u3000", "\u2009", "\u202f", "\u180e", "\u200b", "\u2028"]
DECOMPOSED = ["e\u0301", "a\u0308", "n\u0303", "o\u0302", "u\u0308ber", "Cafe\u0301", "\u0301"]
GAPS = [" "] * 20 + ["  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n\n\n", "    "]


def make_text(megabytes, specials, seed=1234):
    rnd = random.Random(seed)
    target = int(megabytes * 1_000_000)
    parts, size = [], 0

    def number():
        kind = rnd.randrange(5)
        if kind == 0:
            return str(rnd.randrange(10 ** rnd.randrange(1, 12)))
        if kind == 1:
            return f"{rnd.random() * 1000:.{rnd.randrange(1, 6)}f}"
        if kind == 2:
            return f"{rnd.randrange(1, 999)},{rnd.randrange(1000):03d},{rnd.randrange(1000):03d}"
        if kind == 3:
            return f"{rnd.randrange(1900, 2100)}-{rnd.randrange(1, 13):02d}-{rnd.randrange(1, 29):02d}"
        return "０１２３"[: rnd.randrange(1, 5)] + "٣٤٥"

    while size < target:
        mode = rnd.randrange(10)
        words = []
        for _ in range(rnd.randrange(4, 30)):
            pick = rnd.randrange(100)
            if mode == 0:
                words.append("".join(rnd.choice(CHINESE) for _ in range(rnd.randrange(1, 12))))
            elif mode == 1:
                words.append(rnd.choice(RUSSIAN))
            elif mode == 2:
                words.append(rnd.choice(ARABIC))
            elif mode == 3:
                words.append(rnd.choice(CODE))
            elif mode == 4:
                words.append(rnd.choice(GERMAN))
            elif pick < 6:
                words.append(number())
            elif pick < 9:
                words.append(rnd.choice(CONTRACTIONS))
            elif pick < 11:
                words.append(rnd.choice(EMOJI))
            elif pick < 12:
                words.append(rnd.choice(DECOMPOSED))
            elif pick < 13:
                words.append(rnd.choice(ODD_SPACES))
            elif pick < 14 and specials:
                words.append(rnd.choice(specials))
            else:
                word = rnd.choice(ENGLISH)
                words.append(word.capitalize() if rnd.random() < 0.1 else word.upper() if rnd.random() < 0.02 else word)
            words.append(rnd.choice(GAPS) if mode != 0 else rnd.choice(["", "", "，", "。", " "]))
        line = "".join(words) + rnd.choice(["\n", "\n", "\n\n", "\r\n", " \n"])
        parts.append(line)
        size += len(line.encode("utf-8"))
    return "".join(parts)


def train_bpe(style, lines, vocab_size):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        specials = [AddedToken("<|endoftext|>", special=True, normalized=True)]
    else:
        pattern = LLAMA3_PATTERN if style == "llama3" else QWEN2_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        if style == "qwen2":
            tok.normalizer = normalizers.NFC()
            specials = [AddedToken(t, special=True, normalized=False) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
        else:
            specials = [AddedToken(t, special=True, normalized=False)
                        for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=[])
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens(specials)
    if style == "qwen2":
        tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    spec = json.loads(tok.to_str())
    if style == "llama3":
        spec["model"]["ignore_merges"] = True  # as Llama 3's tokenizer.json has it
    return spec


def other_merge_form(spec):
    """The same tokenizer with merges as "a b" strings if they were pairs, or pairs if strings."""
    spec = json.loads(json.dumps(spec))
    merges = spec["model"]["merges"]
    if merges and isinstance(merges[0], list):
        spec["model"]["merges"] = [f"{a} {b}" for a, b in merges]
        return spec, "strings"
    spec["model"]["merges"] = [m.split(" ") for m in merges]
    return spec, "pairs"


SPM_PART_BYTES = 256            # tokenizer/sentencepiece_tokenizer.cc: kPartBytes
SPM_MAX_WITHOUT_SPACE = 256 << 10  # kMaxWithoutSpace
SPM_PROBE = "a"                # kProbe


def _spm_cut_neighbour(b, i):
    c = b[i]
    if c < 0x80:
        return chr(c).isalnum()
    if c & 0xC0 == 0x80:
        return False
    ch = b[i:i + 4].decode("utf-8", errors="ignore")[:1]
    if not ch:
        return False
    o = ord(ch)
    return ((0xC0 <= o <= 0x24F and o not in (0xD7, 0xF7)) or 0x391 <= o <= 0x3C9 or 0x400 <= o <= 0x4FF
            or 0x5D0 <= o <= 0x5EA or 0x620 <= o <= 0x64A or 0x3041 <= o <= 0x30FF or 0x4E00 <= o <= 0x9FFF
            or 0xAC00 <= o <= 0xD7A3)


def spm_parts(text):
    """The parts strata encodes a text in for SentencePiece (the rules of sentencepiece_tokenizer.cc):
    [(part, after_cut)], part as str. See there for why: on a unigram model, one long sentence is
    encoded with less precision, in both libsentencepiece 0.1.97 and sentencepiece 0.2."""
    b = text.encode("utf-8")

    def cut_at(start, i):
        if i <= start or i + 1 >= len(b) or b[i] != 0x20:
            return False
        before = i - 1
        while before > start and b[before] & 0xC0 == 0x80:
            before -= 1
        return _spm_cut_neighbour(b, before) and _spm_cut_neighbour(b, i + 1)

    parts, start = [], 0
    while len(b) - start > SPM_PART_BYTES:
        cut = next((i for i in range(start + SPM_PART_BYTES, start, -1) if cut_at(start, i)), None)
        if cut is None:
            end = min(len(b), start + SPM_MAX_WITHOUT_SPACE)
            cut = next((i for i in range(start + SPM_PART_BYTES, end) if cut_at(start, i)), None)
        if cut is None:
            if len(b) - start < SPM_MAX_WITHOUT_SPACE:
                break
            newline = b.rfind(b"\n", 0, start + SPM_MAX_WITHOUT_SPACE + 1)
            if newline <= start:
                break
            cut = newline
        parts.append((b[start:cut].decode("utf-8"), start > 0))
        start = cut
    parts.append((b[start:].decode("utf-8"), start > 0))
    return parts


def spm_encode_in_parts(sp, text):
    probe = sp.encode(SPM_PROBE)
    ids = []
    for part, after_cut in spm_parts(text):
        if after_cut:
            probed = sp.encode(SPM_PROBE + part)
            if probed[:len(probe)] == probe:
                ids += probed[len(probe):]
                continue
        ids += sp.encode(part)
    return ids


def run_strata(strata, model_dir, text_path, out_path):
    if os.path.exists(out_path):
        os.remove(out_path)
    start = time.perf_counter()
    proc = subprocess.run([strata, "tokenize", model_dir, text_path, "--out", out_path], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return None, {"error": f"exit {proc.returncode}: {proc.stderr.strip()}"}
    m = re.search(r"in ([0-9.]+) s, ([0-9.]+) MB/s", proc.stdout)
    ids = array.array("I")
    assert ids.itemsize == 4
    with open(out_path, "rb") as f:
        ids.frombytes(f.read())
    if sys.byteorder != "little":
        ids.byteswap()
    return list(ids), {"strata_seconds": float(m.group(1)) if m else None,
                       "strata_mb_per_s": float(m.group(2)) if m else None,
                       "strata_wall_seconds": round(wall, 3), "strata_output": proc.stdout.strip()}


def tied_swaps(ours, theirs):
    """How many places the two differ only by the order of the same pieces within a short window
    ("1" "11" against "11" "1", or "7" "7" "77" against "77" "7" "7": the same pieces, so the same
    score, over the same text); None if they differ otherwise. A unigram model's Viterbi breaks
    such exact ties one way in Debian's libsentencepiece 0.1.97 and another in newer releases."""
    if len(ours) != len(theirs):
        return None
    swaps, i, n = 0, 0, len(ours)
    while i < n:
        if ours[i] == theirs[i]:
            i += 1
            continue
        # The shortest window from i over which both hold the same pieces (a permutation).
        for j in range(i + 2, min(n, i + 8) + 1):
            if sorted(ours[i:j]) == sorted(theirs[i:j]):
                swaps, i = swaps + 1, j
                break
        else:
            return None
    return swaps


def first_mismatch(ours, theirs, text, offsets, token_text):
    n = min(len(ours), len(theirs))
    i = next((k for k in range(n) if ours[k] != theirs[k]), n)
    if i == n and len(ours) == len(theirs):
        return None
    lo = max(0, i - 3)
    where = offsets[i][0] if offsets and i < len(offsets) else (offsets[-1][1] if offsets else 0)
    return {"index": i, "strata": ours[lo:i + 5], "reference": theirs[lo:i + 5],
            "strata_tokens": [token_text(t) for t in ours[lo:i + 5]],
            "reference_tokens": [token_text(t) for t in theirs[lo:i + 5]],
            "text_offset": where, "context": text[max(0, where - 60):where + 60],
            "lengths": [len(ours), len(theirs)]}


def report(result):
    status = "equal" if result.get("equal") else "MISMATCH" if "equal" in result else "FAILED"
    line = f"{result['name']:<22} {status:<8} {result.get('tokens', 0):>10} ids"
    if result.get("strata_mb_per_s") is not None:
        line += f"  strata {result['strata_mb_per_s']:7.2f} MB/s"
    if result.get("reference_mb_per_s") is not None:
        line += f"  {result['reference']} {result['reference_mb_per_s']:7.2f} MB/s"
    print(line, flush=True)
    if result.get("note"):
        print(f"  {result['note']}; first at id {result['first_mismatch']['index']}: strata "
              f"{result['first_mismatch']['strata_tokens']} reference {result['first_mismatch']['reference_tokens']}")
    elif result.get("first_mismatch"):
        m = result["first_mismatch"]
        print(f"  first mismatch at id {m['index']} (text offset {m['text_offset']}): strata {m['strata']} "
              f"{m['strata_tokens']}\n  reference {m['reference']} {m['reference_tokens']}\n  text: {m['context']!r}")
    if result.get("error"):
        print(f"  {result['error']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("strata")
    parser.add_argument("summary")
    parser.add_argument("--mb", type=float, default=10.0, help="size of the generated text")
    parser.add_argument("--train-mb", type=float, default=4.0, help="how much of it the tokenizers are trained on")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    strata = os.path.abspath(args.strata)
    summary = {"strata": strata, "python": sys.version.split()[0], "results": [], "skipped": []}
    try:
        import tokenizers
        from tokenizers import Tokenizer
        summary["tokenizers"] = tokenizers.__version__
    except ImportError:
        print("tokenizer_parity: the `tokenizers` package is not installed: nothing to compare with", file=sys.stderr)
        summary["skipped"].append("everything: `tokenizers` does not import")
        json.dump(summary, open(args.summary, "w"), indent=2)
        return 77
    try:
        import transformers
        from transformers import PreTrainedTokenizerFast
        summary["transformers"] = transformers.__version__
    except ImportError:
        PreTrainedTokenizerFast = None
        summary["skipped"].append("the PreTrainedTokenizerFast cross-check: transformers does not import")

    work = args.workdir or tempfile.mkdtemp(prefix="strata-tokenizer-parity-")
    os.makedirs(work, exist_ok=True)
    specials = ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<|endof"]
    text = make_text(args.mb, specials)
    text_path = os.path.join(work, "text.txt")
    with open(text_path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    text_bytes = len(text.encode("utf-8"))
    summary["text_bytes"] = text_bytes
    train_text = text[: int(args.train_mb * 1_000_000)]
    train_lines = train_text.splitlines(keepends=True)
    print(f"tokenizer_parity: {text_bytes / 1e6:.1f} MB of text in {work}; tokenizers {summary['tokenizers']}", flush=True)

    cases = []  # (name, directory, reference encoder, token_text)
    for style in ("gpt2", "llama3", "qwen2"):
        t0 = time.perf_counter()
        spec = train_bpe(style, train_lines, args.vocab)
        print(f"  trained {style}-style in {time.perf_counter() - t0:.1f} s", flush=True)
        variants = [(f"{style}-style", spec)]
        other, form = other_merge_form(spec)
        variants.append((f"{style}-style-{form}", other))
        for name, variant in variants:
            d = os.path.join(work, name)
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, "tokenizer.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(variant, f, ensure_ascii=False)
            cases.append((name, d, "tokenizers", path))

    try:
        import sentencepiece as spm
        summary["sentencepiece"] = getattr(spm, "__version__", "unknown")
    except ImportError:
        spm = None
        summary["skipped"].append("SentencePiece: the sentencepiece package does not import")
    if spm is not None:
        import io
        sentences = train_text.splitlines()
        for model_type in ("bpe", "unigram"):
            d = os.path.join(work, f"sentencepiece-{model_type}")
            os.makedirs(d, exist_ok=True)
            model = io.BytesIO()
            t0 = time.perf_counter()
            try:
                spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                               vocab_size=min(args.vocab, 8000), model_type=model_type,
                                               character_coverage=0.9995, byte_fallback=True, num_threads=1)
            except Exception as e:  # an old sentencepiece without some option: say so, go on
                summary["skipped"].append(f"SentencePiece {model_type}: training failed: {e}")
                continue
            with open(os.path.join(d, "tokenizer.model"), "wb") as f:
                f.write(model.getvalue())
            print(f"  trained sentencepiece {model_type} in {time.perf_counter() - t0:.1f} s", flush=True)
            cases.append((f"sentencepiece-{model_type}", d, "sentencepiece", os.path.join(d, "tokenizer.model")))

    all_equal = True
    for name, d, reference, path in cases:
        result = {"name": name, "reference": reference}
        if reference == "tokenizers":
            tok = Tokenizer.from_file(path)
            tok.no_truncation()
            t0 = time.perf_counter()
            enc = tok.encode(text, add_special_tokens=False)
            seconds = time.perf_counter() - t0
            theirs, offsets = enc.ids, enc.offsets
            token_text = lambda t, tok=tok: tok.id_to_token(t)
            result["vocab_size"] = tok.get_vocab_size(with_added_tokens=True)
            if PreTrainedTokenizerFast is not None:
                fast = PreTrainedTokenizerFast(tokenizer_file=path)
                t1 = time.perf_counter()
                fast_ids = fast.encode(text, add_special_tokens=False)
                result["transformers_seconds"] = round(time.perf_counter() - t1, 3)
                result["transformers_equal_to_tokenizers"] = fast_ids == theirs
        else:
            sp = spm.SentencePieceProcessor(model_file=path)
            t0 = time.perf_counter()
            whole = sp.encode(text)
            seconds = time.perf_counter() - t0
            # The reference is the same parts strata encodes (see spm_parts); the whole text as one
            # sentence is reported beside it (a unigram model may differ there by a few words).
            theirs = spm_encode_in_parts(sp, text)
            result["reference"] = "sentencepiece (same parts)"
            offsets = None
            token_text = lambda t, sp=sp: sp.id_to_piece(t) if 0 <= t < sp.get_piece_size() else "?"
            result["vocab_size"] = sp.get_piece_size()
        result["reference_seconds"] = round(seconds, 3)
        result["reference_mb_per_s"] = round(text_bytes / seconds / 1e6, 2)
        ours, timing = run_strata(strata, d, text_path, os.path.join(work, name + ".u32"))
        result.update(timing)
        if ours is None:
            all_equal = False
        else:
            result["tokens"] = len(theirs)
            result["first_mismatch"] = first_mismatch(ours, theirs, text, offsets, token_text)
            result["equal"] = result["first_mismatch"] is None
            if reference == "sentencepiece" and not result["equal"]:
                swaps = tied_swaps(ours, theirs)
                result["tied_swaps"] = swaps
                if swaps:
                    result["equal"] = True  # equal up to the order of equal-scoring pieces (tied_swaps)
                    result["note"] = (f"equal up to {swaps} swap(s) of two adjacent pieces with the same score "
                                      "(an exact tie that sentencepiece versions break differently)")
            all_equal = all_equal and result["equal"]
            if reference == "sentencepiece":
                result["whole_text_as_one_sentence_equal"] = ours == whole
                result["whole_text_as_one_sentence_ids"] = len(whole)
        report(result)
        summary["results"].append(result)

    summary["all_equal"] = all_equal
    with open(args.summary, "w") as f:
        json.dump(summary, f, indent=2, ensure_ascii=False)
    for skipped in summary["skipped"]:
        print(f"skipped: {skipped}")
    print(f"tokenizer_parity: {'every id equal' if all_equal else 'MISMATCH or failure'}; summary in {args.summary}")
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())

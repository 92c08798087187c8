#!/usr/bin/env python3
"""Reference implementation of "neardup fingerprint v1" (docs/fingerprint.md).

Written from the spec, independently of the Rust code in core/src/fingerprint/, and
using only the Python standard library (hashlib for MD5, unicodedata for NFKC, general
categories and lowercase; XXH3 is implemented below from its published description), so
that the test vectors it produces show the spec can be reproduced, not that the Rust code
agrees with itself. It is written for clarity, not speed.

Usage:
  fingerprint_reference.py regenerate VECTORS.tsv   rewrite the expected columns in place
  fingerprint_reference.py check VECTORS.tsv        recompute; exit 1 on any difference
  fingerprint_reference.py random COUNT SEED        print COUNT random cases with results
  fingerprint_reference.py features [--word N] [--char N] [--xxh3] [--hangul] TEXT
  fingerprint_reference.py selftest                 XXH3 and MD5 known answers
  fingerprint_reference.py sketch-regenerate SKETCH_VECTORS.tsv   sketch v1/v2 (section 15)
  fingerprint_reference.py sketch-check SKETCH_VECTORS.tsv        exit 1 on any difference

Unicode version: the spec uses Unicode 16.0. Python's unicodedata may be older (Python
3.11 has 14.0): then the code points assigned in 15.0-16.0 (about 10,300, none in common
use) are treated as unassigned here and results differ from the spec for texts that
contain them. The vectors and the random cases avoid them. Python 3.14 has Unicode 16.0.
"""

import hashlib
import random
import sys
import unicodedata

SPEC_UNICODE = "16.0.0"
MASK64 = (1 << 64) - 1

# ---------------------------------------------------------------------------------------
# XXH3 (64- and 128-bit, seed 0, default secret), from the XXH3 algorithm description.

SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
P32_1, P32_2, P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
P64_1, P64_2, P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
P64_4, P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
PMX1, PMX2 = 0x165667919E3779F9, 0x9FB21C651E98DF25


def r32(b, i):
    return int.from_bytes(b[i:i + 4], "little")


def r64(b, i):
    return int.from_bytes(b[i:i + 8], "little")


def swap32(x):
    return int.from_bytes(x.to_bytes(4, "little"), "big")


def swap64(x):
    return int.from_bytes(x.to_bytes(8, "little"), "big")


def rotl64(x, r):
    return ((x << r) | (x >> (64 - r))) & MASK64


def rotl32(x, r):
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def mul128_fold64(a, b):
    p = a * b
    return (p & MASK64) ^ (p >> 64)


def xxh64_avalanche(h):
    h ^= h >> 33
    h = (h * P64_2) & MASK64
    h ^= h >> 29
    h = (h * P64_3) & MASK64
    return h ^ (h >> 32)


def xxh3_avalanche(h):
    h ^= h >> 37
    h = (h * PMX1) & MASK64
    return h ^ (h >> 32)


def rrmxmx(h, length):
    h ^= rotl64(h, 49) ^ rotl64(h, 24)
    h = (h * PMX2) & MASK64
    h ^= (h >> 35) + length
    h = (h * PMX2) & MASK64
    return h ^ (h >> 28)


def mix16(data, i, s):
    lo = r64(data, i) ^ r64(SECRET, s)
    hi = r64(data, i + 8) ^ r64(SECRET, s + 8)
    return mul128_fold64(lo, hi)


def long_accs(data):
    """The 8 accumulators of the long-input (> 240 bytes) loop."""
    n = len(data)
    acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1]
    stripes_per_block = (len(SECRET) - 64) // 8
    block_len = 64 * stripes_per_block

    def accumulate(stripe_at, secret_at):
        for i in range(8):
            v = r64(data, stripe_at + 8 * i)
            k = v ^ r64(SECRET, secret_at + 8 * i)
            acc[i ^ 1] = (acc[i ^ 1] + v) & MASK64
            acc[i] = (acc[i] + (k & 0xFFFFFFFF) * (k >> 32)) & MASK64

    def scramble():
        for i in range(8):
            a = acc[i]
            a ^= a >> 47
            a ^= r64(SECRET, len(SECRET) - 64 + 8 * i)
            acc[i] = (a * P32_1) & MASK64

    blocks = (n - 1) // block_len
    for b in range(blocks):
        for s in range(stripes_per_block):
            accumulate(b * block_len + 64 * s, 8 * s)
        scramble()
    stripes = ((n - 1) - block_len * blocks) // 64
    for s in range(stripes):
        accumulate(blocks * block_len + 64 * s, 8 * s)
    accumulate(n - 64, len(SECRET) - 64 - 7)
    return acc


def merge_accs(acc, secret_at, start):
    r = start & MASK64
    for i in range(4):
        r = (r + mul128_fold64(acc[2 * i] ^ r64(SECRET, secret_at + 16 * i),
                               acc[2 * i + 1] ^ r64(SECRET, secret_at + 16 * i + 8))) & MASK64
    return xxh3_avalanche(r)


def xxh3_64(data):
    n = len(data)
    if n == 0:
        return xxh64_avalanche(r64(SECRET, 56) ^ r64(SECRET, 64))
    if n <= 3:
        c = (data[0] << 16) | (data[n >> 1] << 24) | data[n - 1] | (n << 8)
        return xxh64_avalanche(c ^ (r32(SECRET, 0) ^ r32(SECRET, 4)))
    if n <= 8:
        x = r32(data, n - 4) + (r32(data, 0) << 32)
        return rrmxmx(x ^ (r64(SECRET, 8) ^ r64(SECRET, 16)), n)
    if n <= 16:
        lo = r64(data, 0) ^ (r64(SECRET, 24) ^ r64(SECRET, 32))
        hi = r64(data, n - 8) ^ (r64(SECRET, 40) ^ r64(SECRET, 48))
        acc = (n + swap64(lo) + hi + mul128_fold64(lo, hi)) & MASK64
        return xxh3_avalanche(acc)
    if n <= 128:
        acc = n * P64_1
        pairs = [(0, 0)]
        if n > 32:
            pairs.append((16, 32))
        if n > 64:
            pairs.append((32, 64))
        if n > 96:
            pairs.append((48, 96))
        for off, s in pairs:
            acc += mix16(data, off, s) + mix16(data, n - 16 - off, s + 16)
        return xxh3_avalanche(acc & MASK64)
    if n <= 240:
        acc = n * P64_1
        for i in range(8):
            acc += mix16(data, 16 * i, 16 * i)
        acc = xxh3_avalanche(acc & MASK64)
        for i in range(8, n // 16):
            acc += mix16(data, 16 * i, 16 * (i - 8) + 3)
        acc += mix16(data, n - 16, 136 - 17)
        return xxh3_avalanche(acc & MASK64)
    return merge_accs(long_accs(data), 11, n * P64_1)


def xxh3_128(data):
    """XXH3-128 as the integer (high64 << 64) | low64."""
    n = len(data)
    if n == 0:
        lo = xxh64_avalanche(r64(SECRET, 64) ^ r64(SECRET, 72))
        hi = xxh64_avalanche(r64(SECRET, 80) ^ r64(SECRET, 88))
    elif n <= 3:
        cl = (data[0] << 16) | (data[n >> 1] << 24) | data[n - 1] | (n << 8)
        ch = rotl32(swap32(cl), 13)
        lo = xxh64_avalanche(cl ^ (r32(SECRET, 0) ^ r32(SECRET, 4)))
        hi = xxh64_avalanche(ch ^ (r32(SECRET, 8) ^ r32(SECRET, 12)))
    elif n <= 8:
        x = r32(data, 0) + (r32(data, n - 4) << 32)
        keyed = x ^ (r64(SECRET, 16) ^ r64(SECRET, 24))
        m = keyed * ((P64_1 + (n << 2)) & MASK64)
        mlo, mhi = m & MASK64, m >> 64
        mhi = (mhi + (mlo << 1)) & MASK64
        mlo ^= mhi >> 3
        mlo ^= mlo >> 35
        mlo = (mlo * PMX2) & MASK64
        mlo ^= mlo >> 28
        lo, hi = mlo, xxh3_avalanche(mhi)
    elif n <= 16:
        bfl = r64(SECRET, 32) ^ r64(SECRET, 40)
        bfh = r64(SECRET, 48) ^ r64(SECRET, 56)
        ilo, ihi = r64(data, 0), r64(data, n - 8)
        m = (ilo ^ ihi ^ bfl) * P64_1
        mlo, mhi = m & MASK64, m >> 64
        mlo = (mlo + ((n - 1) << 54)) & MASK64
        ihi ^= bfh
        mhi = (mhi + ihi + (ihi & 0xFFFFFFFF) * (P32_2 - 1)) & MASK64
        mlo ^= swap64(mhi)
        h = mlo * P64_2
        hlo, hhi = h & MASK64, h >> 64
        hhi = (hhi + mhi * P64_2) & MASK64
        lo, hi = xxh3_avalanche(hlo), xxh3_avalanche(hhi)
    elif n <= 240:
        alo, ahi = (n * P64_1) & MASK64, 0

        def mix32(alo, ahi, i1, i2, s):
            alo = (alo + mix16(data, i1, s)) & MASK64
            alo ^= (r64(data, i2) + r64(data, i2 + 8)) & MASK64
            ahi = (ahi + mix16(data, i2, s + 16)) & MASK64
            ahi ^= (r64(data, i1) + r64(data, i1 + 8)) & MASK64
            return alo, ahi

        if n <= 128:
            rounds = [(0, 0)]
            if n > 32:
                rounds.append((16, 32))
            if n > 64:
                rounds.append((32, 64))
            if n > 96:
                rounds.append((48, 96))
            for off, s in reversed(rounds):
                alo, ahi = mix32(alo, ahi, off, n - 16 - off, s)
        else:
            for i in range(4):
                alo, ahi = mix32(alo, ahi, 32 * i, 32 * i + 16, 32 * i)
            alo, ahi = xxh3_avalanche(alo), xxh3_avalanche(ahi)
            for i in range(4, n // 32):
                alo, ahi = mix32(alo, ahi, 32 * i, 32 * i + 16, 3 + 32 * (i - 4))
            alo, ahi = mix32(alo, ahi, n - 16, n - 32, 136 - 17 - 16)
        lo = xxh3_avalanche((alo + ahi) & MASK64)
        hi = (-xxh3_avalanche((alo * P64_1 + ahi * P64_4 + n * P64_2) & MASK64)) & MASK64
    else:
        acc = long_accs(data)
        lo = merge_accs(acc, 11, n * P64_1)
        hi = merge_accs(acc, len(SECRET) - 64 - 11, ~(n * P64_2) & MASK64)
    return (hi << 64) | lo


# ---------------------------------------------------------------------------------------
# The spec.

SPACELESS = [
    (0x0E00, 0x0E7F), (0x0E80, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF),
    (0x19E0, 0x19FF), (0x3000, 0x303F), (0x3040, 0x309F), (0x30A0, 0x30FF),
    (0x31F0, 0x31FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA9E0, 0xA9FF),
    (0xAA60, 0xAA7F), (0xF900, 0xFAFF), (0xFF66, 0xFF9F), (0x1AFF0, 0x1AFFF),
    (0x1B000, 0x1B16F), (0x20000, 0x2FFFF), (0x30000, 0x3FFFF),
]
VARIATION_SELECTORS = [(0x180B, 0x180D), (0x180F, 0x180F), (0xFE00, 0xFE0F), (0xE0100, 0xE01EF)]
HANGUL = [
    (0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xAC00, 0xD7AF),
    (0xD7B0, 0xD7FF), (0xFFA0, 0xFFDC),
]


def in_ranges(ch, ranges):
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in ranges)


def normalise(text):
    """Section 2: unassigned -> U+0020, NFKC, per-code-point full lowercase."""
    masked = "".join(" " if unicodedata.category(c) == "Cn" else c for c in text)
    nfkc = unicodedata.normalize("NFKC", masked)
    # Lowercasing one code point at a time applies no context rules (no final sigma).
    return "".join(c.lower() for c in nfkc)


def units(text, hangul_as_chars):
    """Section 3: a list of ("w", token) and ("c", char) in document order."""
    out = []
    state = None  # None (after a separator), "w" (inside a word), "c" (after a spaceless char)
    for ch in normalise(text):
        cat = unicodedata.category(ch)
        if cat == "Cf" or in_ranges(ch, VARIATION_SELECTORS):
            continue  # ignorable: neither part of a token nor a separator
        if cat[0] not in "LMN":
            state = None
            continue
        spaceless = in_ranges(ch, SPACELESS) or (hangul_as_chars and in_ranges(ch, HANGUL))
        if spaceless or (cat[0] == "M" and state == "c"):
            out.append(("c", ch))
            state = "c"
        elif state == "w":
            out[-1] = ("w", out[-1][1] + ch)
        elif cat[0] == "M":
            state = None  # a mark with nothing to attach to separates
        else:
            out.append(("w", ch))
            state = "w"
    return out


def ngrams(items, n, sep):
    if not items:
        return []
    if len(items) < n:
        return [sep.join(items)]
    return [sep.join(items[i:i + n]) for i in range(len(items) - n + 1)]


def feature_hash(name, feature):
    data = feature.encode("utf-8")
    if name == "md5":
        return int.from_bytes(hashlib.md5(data).digest()[:8], "little")
    if name == "xxh3":
        return xxh3_64(data)
    raise ValueError("unknown hash " + name)


class Config:
    def __init__(self, word=3, char=2, hash="md5", hangul=False, idf=None):
        self.word, self.char, self.hash, self.hangul = word, char, hash, hangul
        self.idf = idf  # None or (default, {feature: weight})


def features(cfg, text):
    """Section 4-5: {feature: (count, weight)} in order of first occurrence."""
    us = units(text, cfg.hangul)
    words = [t for k, t in us if k == "w"]
    chars = [t for k, t in us if k == "c"]
    occ = ngrams(words, cfg.word, " ") + ngrams(chars, cfg.char, "")
    counts = {}
    for f in occ:
        counts[f] = counts.get(f, 0) + 1
    out = {}
    for f, tf in counts.items():
        idf = 1 if cfg.idf is None else cfg.idf[1].get(f, cfg.idf[0])
        out[f] = (tf, tf * idf)
    return out, us, len(occ)


def fingerprint(cfg, text):
    """Returns (simhash, content_hash, units, occurrences, distinct) or raises ValueError."""
    if not (1 <= cfg.word <= 16 and 1 <= cfg.char <= 16):
        raise ValueError("InvalidConfig")
    feats, us, occ = features(cfg, text)
    if not feats:
        raise ValueError("EmptyDocument")
    sums = [0] * 64
    for f, (_, w) in feats.items():
        h = feature_hash(cfg.hash, f)
        for i in range(64):
            sums[i] += w if (h >> i) & 1 else -w
    simhash = sum(1 << i for i in range(64) if sums[i] > 0)
    content = " ".join(t for _, t in us).encode("utf-8")
    return simhash, xxh3_128(content), len(us), occ, len(feats)


# ---------------------------------------------------------------------------------------
# The vectors file: tab-separated, "#" comments. Columns:
#   name word char hash hangul idf text | simhash content units features distinct
# idf is "-" or "DEFAULT" or "DEFAULT;feature=weight;...". Text uses the escapes \\ \t \n
# \r and \u{HEX}. An error result is written as "error:EmptyDocument" with "-" after it.

INPUT_COLUMNS = 7
COLUMNS = INPUT_COLUMNS + 5


# ---------------------------------------------------------------------------------------
# Ground-truth shingles (section 11) and the sketch, versions 1 and 2 (section 15).

def word_shingles(text, n, hangul_as_chars=False):
    """Sorted distinct XXH3-64 values of the n-grams of units joined by single spaces."""
    items = [u for _, u in units(text, hangul_as_chars)]
    return sorted({xxh3_64(g.encode("utf-8")) for g in ngrams(items, n, " ")})


SKETCH_BINS, SKETCH_BITS = 512, 1
SKETCH_SET_MAX = 256
SKETCH_SHIFT = 64 - 9  # 64 - log2(SKETCH_BINS): bins are the top 9 bits
DENSIFY_SEED = 0x6E65617264757031
DENSIFY_WORDS = 1024


def mix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def sketch_set(shingles):
    """Section 15, step 5: the sorted distinct top 32 bits of mix64(h), if at most 256."""
    values = sorted({mix64(h) >> 32 for h in shingles})
    return values if len(values) <= SKETCH_SET_MAX else None


def sketch(shingles):
    """Section 15: 512 one-bit values, or None for an empty set."""
    if not shingles:
        return None
    bins = [None] * SKETCH_BINS
    for h in shingles:
        g = mix64(h)
        b, v = g >> SKETCH_SHIFT, g & ((1 << SKETCH_SHIFT) - 1)
        if bins[b] is None or v < bins[b]:
            bins[b] = v
    out = []
    for i in range(SKETCH_BINS):
        v = bins[i]
        if v is None:
            probes = (
                (mix64(DENSIFY_SEED ^ (i << 32) ^ t) >> (64 - 9 * c)) & (SKETCH_BINS - 1)
                for t in range(1, DENSIFY_WORDS + 1) for c in range(1, 64 // 9 + 1))
            j = next((j for j in probes if bins[j] is not None), None)
            if j is not None:
                v = bins[j]
        if v is None:
            v = next(bins[(i + d) % SKETCH_BINS] for d in range(1, SKETCH_BINS)
                     if bins[(i + d) % SKETCH_BINS] is not None)
        out.append(mix64(v ^ (i << SKETCH_SHIFT)) >> (64 - SKETCH_BITS))
    return out


def sketch_bytes(values, kept=None):
    """Version 1 (or 2 with the kept set), payload length 64, value i at bit i*b of the
    payload, least significant bit of each byte first; version 2 then the set's size
    (u16 LE) and values (u32 LE, ascending)."""
    payload = bytearray(SKETCH_BINS * SKETCH_BITS // 8)
    for i, v in enumerate(values):
        for bit in range(SKETCH_BITS):
            if (v >> bit) & 1:
                at = i * SKETCH_BITS + bit
                payload[at // 8] |= 1 << (at % 8)
    if kept is None:
        return bytes([1, len(payload)]) + bytes(payload)
    tail = len(kept).to_bytes(2, "little") + b"".join(v.to_bytes(4, "little") for v in kept)
    return bytes([2, len(payload)]) + bytes(payload) + tail


def sketch_jaccard(a, sa, b, sb):
    """Exact over the kept sets when both have one, else the estimate from the bins."""
    if sa is not None and sb is not None:
        inter = len(set(sa) & set(sb))
        return inter / (len(sa) + len(sb) - inter)
    return sketch_estimate(a, b)


def sketch_estimate(a, b):
    m = sum(1 for x, y in zip(a, b) if x == y)
    r = 2.0 ** -SKETCH_BITS
    return min(1.0, max(0.0, (m / SKETCH_BINS - r) / (1 - r)))


def sketch_columns(cols):
    """name, text[, other text] -> shingles, sketch hex, estimate against the other."""
    text, other = unescape(cols[1]), unescape(cols[2])
    sh = word_shingles(text, 3)
    sk = sketch(sh)
    if sk is None:
        return [str(len(sh)), "error:EmptyDocument", "-"]
    kept = sketch_set(sh)
    est = "-"
    if other:
        osh = word_shingles(other, 3)
        so = sketch(osh)
        est = "-" if so is None else "%.6f" % sketch_jaccard(sk, kept, so, sketch_set(osh))
    return [str(len(sh)), sketch_bytes(sk, kept).hex(), est]


def cmd_sketch(path, regenerate):
    rows = read_rows(path)
    if regenerate:
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write((r if isinstance(r, str) else "\t".join(r[:3] + sketch_columns(r))) + "\n")
        return 0
    bad = n = 0
    for r in rows:
        if isinstance(r, str):
            continue
        n += 1
        if r[3:] != sketch_columns(r):
            bad += 1
            print("MISMATCH %s: file %s, reference %s" % (r[0], r[3:], sketch_columns(r)),
                  file=sys.stderr)
    print("%d sketch vectors, %d mismatches" % (n, bad))
    return 1 if bad else 0


def escape(s):
    out = []
    for ch in s:
        cat = unicodedata.category(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch != " " and (cat[0] in "CZM"):
            out.append("\\u{%X}" % ord(ch))
        else:
            out.append(ch)
    return "".join(out)


def unescape(s):
    out, i = [], 0
    while i < len(s):
        ch = s[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = s[i + 1]
        if nxt == "u":
            j = s.index("}", i)
            out.append(chr(int(s[i + 3:j], 16)))
            i = j + 1
        else:
            out.append({"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}[nxt])
            i += 2
    return "".join(out)


def parse_idf(spec):
    if spec == "-":
        return None
    parts = spec.split(";")
    table = {}
    for p in parts[1:]:
        f, w = p.rsplit("=", 1)
        table[unescape(f)] = int(w)
    return int(parts[0]), table


def result_columns(cols):
    name, word, char, hsh, hangul, idf, text = cols[:INPUT_COLUMNS]
    cfg = Config(int(word), int(char), hsh, hangul == "1", parse_idf(idf))
    try:
        fp, content, nunits, occ, distinct = fingerprint(cfg, unescape(text))
    except ValueError as e:
        return ["error:" + str(e), "-", "-", "-", "-"]
    return ["%016x" % fp, "%032x" % content, str(nunits), str(occ), str(distinct)]


def read_rows(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                rows.append(line)
            else:
                rows.append(line.split("\t"))
    return rows


def cmd_regenerate(path):
    rows = read_rows(path)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            if isinstance(r, str):
                f.write(r + "\n")
            else:
                f.write("\t".join(r[:INPUT_COLUMNS] + result_columns(r)) + "\n")


def cmd_check(path):
    bad = 0
    n = 0
    for r in read_rows(path):
        if isinstance(r, str):
            continue
        n += 1
        want = r[INPUT_COLUMNS:]
        got = result_columns(r)
        if want != got:
            bad += 1
            print("MISMATCH %s: file %s, reference %s" % (r[0], want, got), file=sys.stderr)
    print("%d vectors, %d mismatches (unicodedata %s)" % (n, bad, unicodedata.unidata_version))
    return 1 if bad else 0


def random_text(rng, assigned):
    pieces = []
    for _ in range(rng.randrange(0, 14)):
        kind = rng.randrange(10)
        k = rng.randrange(0, 10)
        if kind < 4:
            alphabet = "abcdefghijklmnopqrstuvwxyzABCXYZ0123456789     ,.!?'-\n\t"
            pieces.append("".join(rng.choice(alphabet) for _ in range(k)))
        elif kind == 4:
            pieces.append("".join(rng.choice("ßẞİıΣσςÅåéﬁﬃＡｚ１²½Ⅻ\u0301\u0307\u0308\u00ad\u200b\u200d")
                                  for _ in range(k)))
        elif kind == 5:
            pieces.append("".join(chr(rng.choice([rng.randrange(0x4E00, 0x9FF0),
                                                   rng.randrange(0x3041, 0x3097),
                                                   rng.randrange(0x30A1, 0x30FB),
                                                   0x3001, 0x3002, 0x30FC, 0x3005]))
                                  for _ in range(k)))
        elif kind == 6:
            pieces.append("".join(chr(rng.choice([rng.randrange(0xAC00, 0xD7A4),
                                                   rng.randrange(0x0E01, 0x0E5C),
                                                   rng.randrange(0x0900, 0x0980),
                                                   rng.randrange(0x1780, 0x17DE),
                                                   rng.randrange(0x1000, 0x1050)]))
                                  for _ in range(k)))
        else:
            pieces.append("".join(chr(rng.choice(assigned)) for _ in range(k)))
    return "".join(pieces)


def assigned_code_points():
    """Code points assigned in this Python's Unicode (and therefore in 16.0, if the version is
    not newer), excluding surrogates and private use."""
    version = tuple(int(x) for x in unicodedata.unidata_version.split("."))
    if version > (16, 0, 0):
        # A newer Unicode assigns code points that are unassigned in 16.0: stick to the BMP
        # blocks that were complete long ago.
        return [cp for cp in range(0x20, 0x3000) if unicodedata.category(chr(cp)) != "Cn"]
    # Private-use code points (Co) are left out only because they would crowd out the rest.
    return [cp for cp in range(0x110000)
            if not 0xD800 <= cp <= 0xDFFF and unicodedata.category(chr(cp)) not in ("Cn", "Co")]


def cmd_random(count, seed):
    rng = random.Random(seed)
    assigned = assigned_code_points()
    for i in range(count):
        cols = ["random-%d" % i, str(rng.randrange(1, 5)), str(rng.randrange(1, 4)),
                rng.choice(["md5", "xxh3"]), str(rng.randrange(2)), "-",
                escape(random_text(rng, assigned))]
        print("\t".join(cols + result_columns(cols)))


def cmd_features(args):
    cfg = Config()
    text = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--word":
            cfg.word = int(args[i + 1])
            i += 1
        elif a == "--char":
            cfg.char = int(args[i + 1])
            i += 1
        elif a == "--xxh3":
            cfg.hash = "xxh3"
        elif a == "--hangul":
            cfg.hangul = True
        else:
            text = a
        i += 1
    feats, us, _ = features(cfg, text or "")
    print("units:", " ".join(t for _, t in us))
    for f, (tf, w) in feats.items():
        print("%016x\t%d\t%d\t%s" % (feature_hash(cfg.hash, f), tf, w, f))


def cmd_selftest():
    # MD5 from RFC 1321; XXH3 from the xxHash project's published sanity values for the
    # empty input; and, if the optional `xxhash` package is installed, every length from 0 to
    # 2100 bytes against it.
    assert feature_hash("md5", "abc") == int.from_bytes(bytes.fromhex("900150983cd24fb0"), "little")
    assert xxh3_64(b"") == 0x2D06800538D394C2
    assert xxh3_128(b"") == 0x99AA06D3014798D86001C324468D497F
    try:
        import xxhash
    except ImportError:
        print("selftest: known answers ok (install `xxhash` to compare all lengths)")
        return 0
    rng = random.Random(1)
    for n in list(range(0, 300)) + list(range(300, 2100, 7)):
        data = bytes(rng.randrange(256) for _ in range(n))
        assert xxh3_64(data) == xxhash.xxh3_64_intdigest(data), n
        assert xxh3_128(data) == xxhash.xxh3_128_intdigest(data), n
    print("selftest: XXH3-64/128 equal to the xxhash package for lengths 0..2100")
    return 0


def main(argv):
    if unicodedata.unidata_version != SPEC_UNICODE:
        print("note: unicodedata is %s, the spec uses %s (see the module docstring)"
              % (unicodedata.unidata_version, SPEC_UNICODE), file=sys.stderr)
    if len(argv) >= 2 and argv[0] == "regenerate":
        cmd_regenerate(argv[1])
        return 0
    if len(argv) >= 2 and argv[0] == "check":
        return cmd_check(argv[1])
    if len(argv) >= 3 and argv[0] == "random":
        cmd_random(int(argv[1]), int(argv[2]))
        return 0
    if argv and argv[0] == "features":
        cmd_features(argv[1:])
        return 0
    if len(argv) >= 2 and argv[0] in ("sketch-regenerate", "sketch-check"):
        return cmd_sketch(argv[1], argv[0] == "sketch-regenerate")
    if argv and argv[0] == "selftest":
        return cmd_selftest()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

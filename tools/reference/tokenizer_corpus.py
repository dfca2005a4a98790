"""The tokenizer exactness corpus: strings that stress byte-level BPE tokenizers.

Used by tokenizer_fixtures.py (tests/fixtures/tokenizer/*.json). Plain Python so that
escapes stay readable; CORPUS is a list of unique str, in a fixed order. Append new
strings at the end of a group rather than reordering, so fixture diffs stay small.
"""
import unicodedata

_EMPTY_AND_SINGLE = [
    "",
    " ", "\n", "\t", "\r", "a", "Z", "0", "9", ".", ",", "'", '"', "!", "?", "-", "_",
    "@", "#", "$", "%", "&", "*", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "|",
    "~", "`", "^", "=", "+", ":", ";",
    "é", "ß", "ñ", "Ω", "ж", "中", "あ", "한", "😀", "€", "£", "¥", "©", "°", "½", "²",
    "\u00a0",  # no-break space
    "\u3000",  # ideographic space
]

_DIGITS = [
    "1234567", "3.14159", "1,000,000", "0", "00", "000", "0000", "12", "123", "1234",
    "12345", "123456789012345678901234567890", "-42", "+1", "1e10", "6.022e23", "0x1F",
    "0b1010", "007", "3/4", "50%", "$19.99", "€1.234,56", "1st 2nd 3rd 4th", "v1.2.3",
    "+1 (555) 123-4567", "555-0199", "+44 20 7946 0958", "(02) 9876 5432",
    "2024-01-15", "12:30:45", "10:00 AM", "192.168.0.1", "ISBN 978-3-16-148410-0",
    "In 2023, about 1.5 million people visited.", "a1b2c3", "x 12 y 345 z", " 1", "  12",
    "abc123def", "99 bottles", "٣٤٥", "१२३", "①②③", "Ⅻ", "３２１",
    # whitespace runs and non-ASCII numbers before digits (the Digits pre-tokenizer of
    # SmolLM2 splits these differently from a plain GPT-2 regex)
    "a  1", "   123", "\n\n42", "\t7", "1  2  3", "x ① y", "5 ½ cups", "x ²", "Ⅰ Ⅱ Ⅲ",
]

_CONTRACTION_WORDS = ["don't", "i'm", "we'll", "they've", "she'd", "it's", "you're", "can't"]
_CONTRACTIONS = (
    [w for w in _CONTRACTION_WORDS]
    + [w.upper() for w in _CONTRACTION_WORDS]
    + [w.title() for w in _CONTRACTION_WORDS]
    + [w.capitalize() for w in _CONTRACTION_WORDS]
    + [
        "I'm", "I'M", "DON'T", "She'd", "'s", "'S", "'t", "'re", "'ve", "'m", "'ll", "'d",
        "'LL", "'Ve", "John's book", "the dogs' bowls", "rock 'n' roll", "'quoted'",
        "''", "'''", "don’t", "I’m", "it’s", "’s", "‘single’ “double”", "o'clock",
        "y'all'd've", "We'LL see", "x's", "1's", " 's", "s's", "the '90s",
    ]
)

_WHITESPACE = [
    "  ", "   ", "    ", "        ", "\t\t", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", " \n",
    "\n ", " \t \n ", "a  b", "a   b", "a\tb", "a\nb", "a\r\nb", "a \n b", "a\n\nb",
    "  leading", "trailing  ", "  both  ", "\tindented", "line1\nline2\nline3",
    "word \n\n  word", "end with newline\n", "\n\nstart with newlines", "a \u00a0b",
    "tab\there\tand\tthere", "spaces    inside    words", "mixed \t\r\n whitespace",
    " \r\n \r\n", "x\u2028y", "x\u2029y", "x\x0by\x0cz", "a\u3000b", "\u200b", "a\u200bb",
]

_CJK = [
    "你好，世界！", "我爱自然语言处理。", "中华人民共和国成立于1949年。", "今天天气很好，我们去公园散步吧。",
    "こんにちは、世界！", "日本語のテキストをトークン化します。", "カタカナとひらがなと漢字",
    "東京は日本の首都です。", "안녕하세요, 세계!", "한국어 텍스트를 토큰화합니다.", "서울은 한국의 수도입니다.",
    "混合English和中文text", "全角文字：ＡＢＣ　１２３", "「引用」『二重』【括弧】", "繁體中文與简体中文",
    "𠀀𠀁𪚥",  # CJK extension B: 4-byte UTF-8
]

_EMOJI = [
    "😀😃😄", "I ❤️ Python 🐍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇩🇪🇯🇵", "🇺🇸", "🧑🏿‍💻",
    "⭐️✨🌟", "🤖 says hi", "🎉🎉🎉 party", "emoji at end 😎", "😀 emoji at start",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕗𝕒𝕟𝕔𝕪", "𝟙𝟚𝟛", "🂡🂮", "👩🏻‍🔬👩🏼‍🔬", "☺", "✔︎", "#️⃣", "🫠🫶",
]

_ACCENT_WORDS = [
    "café", "naïve", "résumé", "Ångström", "façade", "crème brûlée", "Zoë", "São Paulo",
    "Dvořák", "Straße", "ñandú", "Ελληνικά", "Tiếng Việt", "Łódź", "Øresund",
]
_ACCENTS = (
    [unicodedata.normalize("NFC", w) for w in _ACCENT_WORDS]
    + [unicodedata.normalize("NFD", w) for w in _ACCENT_WORDS]
    + [
        "e\u0301", "\u00e9", "a\u0308\u0301", "n\u0303", "Z\u0351\u0352\u0353a\u0354l\u0355g\u0356o",
        "\u212b",  # ANGSTROM SIGN: NFC maps it to U+00C5
        "\ufb01",  # fi ligature (NFKC only)
        "\u0041\u030a", "\u1e9b\u0323", "한\u1100\u1161",  # precomposed and conjoining jamo
        unicodedata.normalize("NFD", "한국어"),
    ]
)

_CODE = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n\tprint(i ** 2)",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)",
    "class Foo:\n    \"\"\"Docstring.\"\"\"\n    def __init__(self):\n        self._x = None",
    "lambda x: x if x else None",
    "print(f\"{name!r:>10} = {value:.3f}\")",
    "#include <iostream>\nint main() {\n  std::cout << \"hi\\n\";\n  return 0;\n}",
    "template <typename T>\nstd::vector<T> v{1, 2, 3};",
    "auto p = std::make_unique<int>(42); p->~int();",
    "if (a != b && c <= d || !e) { x += 1; }",
    "int* ptr = &arr[0]; ptr++; *ptr = 0x7fffffff;",
    "{\"name\": \"tessera\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"npu\"], \"ok\": true}",
    "{\n  \"a\": 1,\n  \"b\": [1, 2, 3],\n  \"c\": {\"d\": null}\n}",
    "[{\"id\":1},{\"id\":2}]",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done",
    "ls -la | grep '^d' | awk '{print $9}' > dirs.txt 2>&1",
    "export PATH=\"$HOME/.local/bin:$PATH\"",
    "git commit -m \"fix: handle \\\"quotes\\\"\"",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"x\"><p>Hello &amp; welcome</p></div>",
    "fn main() { let v: Vec<u8> = vec![0; 16]; }",
    "x=>x*2; const y = async () => await fetch('/api');",
    "    \n    \n",
    "a==b!=c<=d>=e->f::g...h",
    "// comment\n/* block */\n# hash\n-- sql",
    "regex: ^[a-zA-Z0-9_.+-]+@[a-zA-Z0-9-]+\\.[a-zA-Z0-9-.]+$",
]

_SPECIAL_IN_TEXT = [
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|>",
    "<|begin_of_text|>",
    "<|begin_of_text|>Hello",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    " <|endoftext|> ",
    "<think>",
    "</think>",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|im_star|>",
    "<|im_end|",
    "<im_start>",
    "< |im_start| >",
    "<|IM_START|>",
    "<|im_start|x",
    "<|begin_of_text >",
    "<|reserved_special_token_0|>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<repo_name>tessera<file_sep>main.cc",
    "<s></s>",
    "<unk>",
    "<|im_start|><|im_start|>",
    "<<|im_start|>>",
    "<|endoftext|><|endoftext|>",
]

_SCRIPTS = [
    "مرحبا بالعالم", "اللغة العربية جميلة.", "السلام عليكم ورحمة الله", "שלום עולם", "עברית נכתבת מימין לשמאל.",
    "नमस्ते दुनिया", "हिन्दी भाषा", "क्षत्रिय", "สวัสดีชาวโลก", "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Привет, мир!", "Съешь же ещё этих мягких французских булок.", "ПРИВЕТ", "Γειά σου Κόσμε",
    "Η γλώσσα είναι ελληνική.", "ΑΒΓΔΕ", "Բարեւ աշխարհ", "გამარჯობა", "ሰላም ልዑል", "வணக்கம்",
    "Hello Привет 你好 مرحبا שלום",
    "English العربية English",
    "x = \"שלום\" + 'עולם'",
]

_URLS_MARKDOWN = [
    "https://example.com",
    "https://www.example.com/path/to/page?query=1&foo=bar#section",
    "http://localhost:8080/api/v1/users/42",
    "ftp://files.example.org/pub/file.tar.gz",
    "mailto:someone@example.com",
    "user.name+tag@sub.example.co.uk",
    "Visit https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct for details.",
    "www.example.com/a_b-c~d",
    "# Heading 1\n## Heading 2\n### Heading 3",
    "**bold** and *italic* and ~~strike~~ and `code`",
    "- item one\n- item two\n  - nested item\n* star item",
    "1. first\n2. second\n3. third",
    "[link text](https://example.com \"title\")",
    "![alt](image.png)",
    "> quoted text\n> more quote",
    "```python\nprint('hi')\n```",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "---",
    "***",
    "Line with trailing backslash\\\nnext",
    "<!-- html comment -->",
    "$$E = mc^2$$ and $\\alpha + \\beta$",
]

_PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a small village near the mountains, there lived an old baker who "
    "woke before sunrise every day to bake bread for the people of the town, and everyone "
    "loved him.",
    "Machine learning is a field of study in artificial intelligence concerned with the "
    "development and study of statistical algorithms that can learn from data and generalize "
    "to unseen data, and thus perform tasks without explicit instructions. Recently, "
    "artificial neural networks have been able to surpass many previous approaches in "
    "performance.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
    "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it "
    "was the season of Light, it was the season of Darkness.",
    "The capital of France is",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Hello, world!",
    "hello world",
    "HELLO WORLD",
    "Hello World",
    "Mr. and Mrs. Dursley, of number four, Privet Drive, were proud to say that they were "
    "perfectly normal, thank you very much.",
    "She said, \"I don't know what you're talking about!\" and left... Then—silence.",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "e.g. i.e. etc. vs. Dr. St. U.S.A.",
    "A sentence.  Two spaces after period.   Three here.",
    "Wait... what?! No way!!! Really??",
    "semi;colon:colon,comma.period",
    "--- === *** ___ ~~~ ^^^",
]

_CONTROL = [
    "\x00", "a\x00b", "\x01\x02\x03", "\x07", "\x08", "\x1b[31mred\x1b[0m", "\x7f", "\x1f",
    "\x85", "\u200c\u200d", "\u200e\u200f", "\ufeffBOM at start", "\ufffd", "\ufffe",
    "\U0010ffff", "\U000e0041", "\u2066isolate\u2069", "x\u0000y\u0000z",
]

_MISC = [
    "ⓐⓑⓒ", "ℌ℮ℓℓø", "∀x∈ℝ: x² ≥ 0", "→ ← ↑ ↓ ⇒", "•·…—–", "™®℠", "«guillemets»", "¿Qué? ¡Sí!",
    "ǅungla", "ﬃ ﬄ", "Ⅰ Ⅱ Ⅲ", "a" * 64, "ab" * 40, "😀" * 12, "\n" * 20, " " * 33,
    "=" * 40, "-" * 17, "." * 9, "!" * 5, "A" * 100,
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa b",
    "tokenization", "Tokenization", "TOKENIZATION", " tokenization", "untokenizable",
    "unbelievably", "HTTPServerError", "camelCaseIdentifier", "snake_case_identifier",
    "kebab-case-identifier", "SCREAMING_SNAKE", "__dunder__", "@decorator", "#hashtag",
    "C++", "C#", "F#", ".NET", "node.js", "file.tar.gz", "~/path/to/file", "C:\\Windows\\System32",
]


def _unique(strings):
    seen, out = set(), []
    for s in strings:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


GROUPS = {
    "empty_and_single": _EMPTY_AND_SINGLE,
    "digits": _DIGITS,
    "contractions": _CONTRACTIONS,
    "whitespace": _WHITESPACE,
    "cjk": _CJK,
    "emoji": _EMOJI,
    "accents_nfc_nfd": _ACCENTS,
    "code": _CODE,
    "special_tokens_in_text": _SPECIAL_IN_TEXT,
    "scripts": _SCRIPTS,
    "urls_markdown": _URLS_MARKDOWN,
    "paragraphs": _PARAGRAPHS,
    "control": _CONTROL,
    "misc": _MISC,
}

CORPUS = _unique(s for group in GROUPS.values() for s in group)

if __name__ == "__main__":
    for name, group in GROUPS.items():
        print(f"{name}: {len(group)}")
    print(f"total unique: {len(CORPUS)}")

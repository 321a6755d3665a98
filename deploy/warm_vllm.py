"""Run by `make vllm` in the engine's venv, once: what vLLM's first start would otherwise do on the clock.

pip installs without byte-compiling (half of the install's time), so a fresh venv's first server compiles every
module it imports, and vLLM inspects each model architecture it resolves in a fresh subprocess (about 12 s each
on 2 cores) before caching the answer under VLLM_CACHE_ROOT/modelinfos. Here, while draftsync's own venv and the
demo's first target are still being built beside it: the server's and the CPU engine's modules are imported, and
the architectures draftsync serves are inspected in this one process and cached where vLLM looks for them. Best
effort: vLLM works without any of it, only its first start is slower, so a failure here is printed, not raised.
"""

from __future__ import annotations

import importlib
import importlib.util
import time

# The OpenAI server, the engine core, the CPU worker and the speculative proposers draftsync serves with.
MODULES = (
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.core",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.spec_decode.eagle",
    "vllm.v1.spec_decode.medusa",
    "vllm.v1.spec_decode.ngram_proposer",
    "vllm.v1.spec_decode.draft_model",
)
# The built-in targets' families and the drafter methods draftsync trains, as vLLM names their classes.
ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "Eagle3LlamaForCausalLM",
    "EagleLlamaForCausalLM",
    "MedusaModel",
)


def _cache_model_info(arch: str) -> str:
    from pathlib import Path

    from vllm.model_executor.models import registry

    model = registry.ModelRegistry.models.get(arch)
    if not isinstance(model, registry._LazyRegisteredModel):
        return "not a lazily registered model"
    spec = importlib.util.find_spec(model.module_name)
    if spec is None or spec.origin is None:
        return "module not found"
    module_hash = model._get_modelinfo_module_hash(Path(spec.origin))
    if model._load_modelinfo_from_cache(module_hash) is not None:
        return "cached already"
    model._save_modelinfo_to_cache(registry._ModelInfo.from_model_cls(model.load_model_cls()), module_hash)
    return "cached"


def main() -> None:
    started = time.perf_counter()
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - best effort, see the module docstring
            print(f"warm_vllm: import {name}: {type(error).__name__}: {error}")
    outcomes = {}
    for arch in ARCHITECTURES:
        try:
            outcomes[arch] = _cache_model_info(arch)
        except Exception as error:  # noqa: BLE001
            outcomes[arch] = f"{type(error).__name__}: {error}"
    print(f"warm_vllm: {time.perf_counter() - started:.1f} s; model info: {outcomes}")


if __name__ == "__main__":
    main()

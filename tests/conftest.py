"""Shared fixtures: tiny seeded models built in code, and offline settings."""

from __future__ import annotations

import os
import signal

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tiny test models are far too small to gain from threads; one thread per
# process also keeps parallel test runs from fighting over the two cores.
torch.set_num_threads(1)
# Children get Ctrl-C's default disposition, as a process started from a terminal has:
# a non-interactive shell starts a background job (`pytest ... &`, as a long run is
# often started) with SIGINT ignored, every child inherits that through exec, and
# then the tests that send SIGINT to `python infer.py` wait for a child that ignores it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def embedded_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One cache directory for the whole test session: the converted GGUF
    (conversion takes ~17 s) and the forward-width timings of every model the
    tests load, so that tests never write into the user's own cache."""
    path = os.environ.get("SPECREPL_TEST_CACHE_DIR") or str(tmp_path_factory.mktemp("cache"))
    os.environ["SPECREPL_CACHE_DIR"] = path
    return path


@pytest.fixture(scope="session")
def pair():
    """A tiny seeded pair (vocabulary 32) whose drafter agrees with the target
    often but not always, with a word-level chat tokenizer."""
    from specrepl.models.pair import ModelPair
    from specrepl.testing import perturbed_copy, tiny_llama, tiny_tokenizer

    target = tiny_llama(32, seed=4)
    return ModelPair.from_models(target, perturbed_copy(target, 0.3, seed=2), tiny_tokenizer(32))


@pytest.fixture(scope="session")
def embedded_pair(embedded_cache_dir: str):
    """The embedded SmolLM2-135M pair (fp32 target, bf16 drafter), loaded once."""
    from specrepl.models.loading import load_pair
    from specrepl.models.specs import ModelSpec

    return load_pair("embedded", ModelSpec("embedded", dtype="bfloat16"))


@pytest.fixture(scope="session")
def tiny_config_file(tmp_path_factory: pytest.TempPathFactory):
    """A config file whose target and drafter are tiny models saved as local
    directories: what a user's own pair is to `python infer.py --config`."""
    from specrepl.testing import perturbed_copy, tiny_llama, tiny_tokenizer

    root = tmp_path_factory.mktemp("tiny-config")
    target = tiny_llama(32, seed=4)
    target.save_pretrained(root / "target")
    tiny_tokenizer(32).save_pretrained(root / "target")
    perturbed_copy(target, 0.3, seed=2).save_pretrained(root / "drafter")
    path = root / "tiny.toml"
    path.write_text(
        f'device = "cpu"\n'
        f'[target]\nsource = "{root / "target"}"\n'
        f'[drafter]\nsource = "{root / "drafter"}"\n'
        f'[generation]\nmax_new_tokens = 8\ngamma = 4\ngamma_policy = "fixed"\n'
        f'drafter_kind = "model"\n'
    )
    return path


@pytest.fixture(scope="session")
def every_setting_changed():
    """Settings with every field away from its default: the flag, config and REPL
    tests set them all, so a setting that one of them cannot reach fails there."""
    from specrepl.chat.settings import Settings

    changed = Settings(
        gamma=6,
        gamma_policy="heuristic",
        confidence=0.5,
        drafter_kind="ngram",
        ngram_order=5,
        ngram_keep=True,
        ngram_filler=4,
        lookup_max_ngram=2,
        drafter_window=16,
        drafter_runtime="torch",
        drafter_head="embedded",
        target_runtime="torch",
        processor="topknucleus",
        temperature=0.7,
        top_k=9,
        top_p=0.8,
        max_new_tokens=20,
        seed=3,
        use_cache=False,
        chat=False,
        system_prompt="Be brief.",
        speculative=False,
        target_gen=False,
        drafter_gen=True,
        debug=True,
    )
    same = [
        name for name in Settings.names() if getattr(changed, name) == getattr(Settings(), name)
    ]
    assert not same, f"give {same} a value other than the default here"
    return changed


@pytest.fixture(scope="module")
def llama():
    """The embedded model's GGUF file opened in llama.cpp (2048 positions), or
    the test skipped where llama-cpp-python is not installed (failed where
    SPECREPL_REQUIRE_LLAMACPP=1, as CI sets)."""
    import importlib.util

    from specrepl.engine.llamacpp import open_gguf
    from specrepl.models.embedded import embedded_gguf_path

    if importlib.util.find_spec("llama_cpp") is None:
        if os.environ.get("SPECREPL_REQUIRE_LLAMACPP") == "1":
            pytest.fail("llama-cpp-python is not installed and SPECREPL_REQUIRE_LLAMACPP=1")
        pytest.skip("llama-cpp-python is not installed (bash scripts/setup.sh builds it)")
    return open_gguf(
        embedded_gguf_path(), context_length=2048, threads=torch.get_num_threads(), sequences=2
    )

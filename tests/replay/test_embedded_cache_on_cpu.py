"""The embedded model's conversion cache: the cached folder loads the model the GGUF conversion gave, once per key."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from mrtpo_verl.replay.embedded_cache import CACHE_DIR_ENV, cache_root, cached_folder, embedded_cache_key
from mrtpo_verl.replay.model_loading import (
    EMBEDDED_GGUF_FILE,
    convert_embedded_model,
    embedded_model_dir,
    load_causal_lm,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_embedded_model_loads_from_its_cached_folder_as_the_gguf_conversion_gave_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    converted: dict[str, Any] = {}

    def convert(out: Path) -> None:
        converted["model"], converted["tokenizer"] = convert_embedded_model(out)

    folder = cached_folder(embedded_cache_key(embedded_model_dir() / EMBEDDED_GGUF_FILE), convert)
    assert folder is not None and converted, "the first request did not convert"

    model, tokenizer = load_causal_lm(None)

    assert model.name_or_path == str(folder)  # read from the cache, not converted again
    reference, reference_tokenizer = converted["model"], converted["tokenizer"]
    expected = reference.state_dict()
    loaded = model.state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert loaded[name].dtype == torch.float32 and torch.equal(loaded[name], tensor), name
    ignored = {"_name_or_path", "transformers_version"}
    assert {k: v for k, v in model.config.to_dict().items() if k not in ignored} == {
        k: v for k, v in reference.config.to_dict().items() if k not in ignored
    }
    assert model.generation_config.to_dict() == reference.generation_config.to_dict()
    assert not model.training
    # The tokenizer: same vocabulary, the loader's eos/pad fixes kept, same chat rendering and ids.
    assert tokenizer.get_vocab() == reference_tokenizer.get_vocab()
    for attribute in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(tokenizer, attribute) == getattr(reference_tokenizer, attribute), attribute
    assert tokenizer.eos_token == "<|im_end|>"
    chat = [{"role": "system", "content": "Answer in SQL."}, {"role": "user", "content": "How many singers?"}]
    rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == reference_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    text = rendered + "SELECT count(*) FROM singer; -- naïve ünïcode, 12,345 tabs\t\tand  spaces<|im_end|>"
    assert tokenizer(text)["input_ids"] == reference_tokenizer(text)["input_ids"]


RACE_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from mrtpo_verl.replay.embedded_cache import cached_folder

    def build(out):
        with open(os.environ["BUILD_LOG"], "a") as log:
            log.write(f"{os.getpid()}\\n")
        time.sleep(1.5)  # long enough that the other process asks while this one builds
        (out / "weights.bin").write_text("converted")

    print(cached_folder("race", build))
    """
)


def test_processes_asking_at_once_convert_once_and_share_the_folder(tmp_path: Path) -> None:
    log = tmp_path / "builds.log"
    env = {**os.environ, CACHE_DIR_ENV: str(tmp_path / "cache"), "BUILD_LOG": str(log), "PYTHONPATH": str(REPO)}
    racers = [
        subprocess.Popen([sys.executable, "-c", RACE_SCRIPT], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    printed = {racer.communicate(timeout=120)[0].strip() for racer in racers}
    assert [racer.returncode for racer in racers] == [0, 0, 0]
    assert printed == {str(tmp_path / "cache" / "race")}
    assert len(log.read_text().splitlines()) == 1, "more than one process converted"
    assert (tmp_path / "cache" / "race" / "weights.bin").read_text() == "converted"
    assert not list((tmp_path / "cache").glob(".race-*")), "a staging folder was left behind"


def test_a_failing_conversion_raises_leaves_nothing_and_the_next_request_converts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))

    def broken(out: Path) -> None:
        (out / "half.bin").write_text("partial")
        raise RuntimeError("conversion failed half-way")

    with pytest.raises(RuntimeError, match="half-way"):
        cached_folder("k", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.lock"]  # no folder, no staging left

    folder = cached_folder("k", lambda out: (out / "whole.bin").write_text("ok"))
    assert folder == tmp_path / "k" and (folder / "whole.bin").exists()


def test_an_unusable_cache_is_a_warning_and_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker / "cache"))
    built: list[Path] = []
    with caplog.at_level(logging.WARNING, logger="mrtpo_verl.replay.embedded_cache"):
        assert cached_folder("k", built.append) is None
    assert built == []
    assert "is not usable" in caplog.text and "converting in memory instead" in caplog.text


def test_the_cache_root_prefers_the_variable_then_xdg_then_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "explicit"
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert cache_root() == tmp_path / "xdg" / "mrtpo-verl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "mrtpo-verl"


def test_the_key_changes_with_the_file_and_the_transformers_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    key = embedded_cache_key(weights)
    assert key.startswith("smollm2-") and embedded_cache_key(weights) == key
    weights.write_bytes(b"GGUF" + bytes(range(256)) * 7 + bytes(255) + b"\x01")
    changed_file = embedded_cache_key(weights)
    assert changed_file != key
    monkeypatch.setattr(transformers, "__version__", "0.0.0-other")
    assert embedded_cache_key(weights) != changed_file

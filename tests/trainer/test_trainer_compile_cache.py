"""torch.compile's cache folder follows the checkpoints unless the user chose one."""

from __future__ import annotations

import os

from ftjob_trainer import compile_cache


def test_cache_goes_next_to_the_checkpoints(tmp_path, monkeypatch):
    monkeypatch.delenv(compile_cache.ENV_CACHE_DIR, raising=False)
    path = compile_cache.use_checkpoint_volume(str(tmp_path / "ckpt"))
    assert path == str(tmp_path / "ckpt" / "compile-cache") and (tmp_path / "ckpt" / "compile-cache").is_dir()

    assert os.environ[compile_cache.ENV_CACHE_DIR] == path


def test_the_users_folder_wins_and_no_checkpoint_dir_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV_CACHE_DIR, str(tmp_path / "mine"))
    assert compile_cache.use_checkpoint_volume(str(tmp_path / "ckpt")) == str(tmp_path / "mine")
    assert not (tmp_path / "ckpt").exists()
    monkeypatch.delenv(compile_cache.ENV_CACHE_DIR)
    assert compile_cache.use_checkpoint_volume(None) is None
